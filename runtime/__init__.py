"""specrt.runtime: the speculative decoding loop (AR, SD, Cool-SD, LANTERN, SJD, SJD-PAC)
over preallocated KV buffers, on onnxruntime, TensorRT or PyTorch. Imports with numpy alone.

    from specrt.runtime import Pipeline
    result = Pipeline.from_bundle("bundle/").generate([3], method="sjd-pac", seed=0)
"""
from specrt.runtime.pipeline import GenerationResult, Pipeline

__all__ = ["GenerationResult", "Pipeline"]
