"""The onnxruntime backend of the continuous family: a bundle's step and head graphs."""
from __future__ import annotations

from pathlib import Path
from typing import Optional


from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.families.continuous.runner import ContinuousRunner, ContinuousSpec


class OrtContinuousRunner(ContinuousRunner):
    """Runs <role>_step.onnx and <role>_head.onnx on the CPU provider (inputs named as exported)."""

    def __init__(self, spec: ContinuousSpec, step_path: Path, head_path: Path, threads: Optional[int] = 1):
        super().__init__(spec)
        ort = require("onnxruntime", "the onnxruntime backend")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        self.step_session = ort.InferenceSession(str(step_path), options, providers=providers)
        self.head_session = ort.InferenceSession(str(head_path), options, providers=providers)
        if "attention_mask" not in {i.name for i in self.step_session.get_inputs()}:
            raise SpecrtError(f"{step_path} is a step graph of continuous bundle format 1 (one image per pass, "
                              "no attention_mask): re-export the bundle with this specrt (`specrt export "
                              "--demo mar` or `--family continuous`), or open it on the torch backend")

    def _transformer(self, tokens, class_ids, positions, mask, past_k, past_v):
        z, k, v = self.step_session.run(None, {"tokens": tokens, "class_ids": class_ids, "positions": positions,
                                               "attention_mask": mask, "past_k": past_k, "past_v": past_v})
        return z, k, v

    def _head(self, x, t, z):
        return self.head_session.run(None, {"x": x, "t": t, "z": z})[0]
