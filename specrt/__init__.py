"""specrt: deploy autoregressive image generators with speculative decoding.

Subpackages: specrt.export (PyTorch models -> ONNX bundle), specrt.runtime (the speculative
decoding loop over preallocated KV buffers), specrt.engines (TensorRT engines), specrt.bench
(speed and fidelity side by side). The CLI in specrt.cli is a thin layer over them.
"""
from specrt.errors import SpecrtError

__version__ = "0.1.0"
__all__ = ["SpecrtError", "__version__"]
