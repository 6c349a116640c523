"""The continuous family: MAR-style models whose tokens are continuous latents drawn by a
diffusion head, with ar and continuous speculative decoding (cspd, paper 002).

Its pipeline is ContinuousPipeline; its manifest reader is runtime/continuous_bundle.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.errors import SpecrtError
from specrt.runtime.families.base import Family


class ContinuousFamily(Family):
    name = "continuous"
    methods = ("ar", "cspd")
    token_dtype = "float32"
    backends = ("ort", "ort-cpu", "torch")

    def open(self, path: Path, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        from specrt.runtime.continuous_pipeline import ContinuousPipeline
        from specrt.runtime.threads import set_torch_threads

        if backend not in self.backends:
            raise SpecrtError(f"a continuous bundle runs on {', '.join(self.backends)}, not backend {backend!r}")
        unknown = sorted(k for k, v in options.items() if v is not None)
        if unknown:
            raise SpecrtError(f"a continuous bundle takes no {', '.join(unknown)}")
        if backend == "torch":
            set_torch_threads(1 if threads is None else threads)
        return ContinuousPipeline.from_bundle(path, "torch" if backend == "torch" else "onnxruntime")

    def describe(self, path: Path) -> str:
        from specrt.runtime.families.continuous.describe import describe_bundle

        return describe_bundle(path)

    def has_decoder(self, pipeline: Any) -> bool:
        return pipeline.decoder is not None


FAMILY = ContinuousFamily()
