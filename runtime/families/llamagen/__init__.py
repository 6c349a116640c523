"""The LlamaGen family: VQ-token generators in LlamaGen's layout (class- and text-conditional,
the embedded demos), with every discrete method (ar, sd, cool-sd, lantern, sjd, sjd-pac).

Its pipeline is runtime/pipeline.py's Pipeline; its manifest reader is specrt.manifest."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.runtime.families.base import Family


class LlamaGenFamily(Family):
    name = "llamagen"
    methods = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac")
    token_dtype = "int64"
    backends = ("ort", "ort-cpu", "ort-cuda", "ort-trt", "trt")

    def open(self, path: Path, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        from specrt.runtime.pipeline import Pipeline

        return Pipeline.open_discrete_bundle(path, backend=backend, threads=threads, **options)

    def describe(self, path: Path) -> str:
        from specrt.manifest import read_manifest
        from specrt.runtime.bundle_check import check_manifest
        from specrt.runtime.families.llamagen.describe import format_manifest

        manifest = read_manifest(path)
        check_manifest(manifest)  # the numbers agree with each other (runtime/bundle_check.py), or one line
        return format_manifest(manifest)

    def conditions(self, pipeline: Any) -> str:
        return "prompts" if pipeline.target.spec.model_type == "t2i" else "class ids"


FAMILY = LlamaGenFamily()
