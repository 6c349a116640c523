"""The LlamaGen family: VQ-token generators in LlamaGen's layout (class- and text-conditional,
the embedded demos), with every discrete method (ar, sd, cool-sd, lantern, sjd, sjd-pac, gsd).

Its pipeline is runtime/pipeline.py's Pipeline; its manifest reader is specrt.manifest (the strict
one: structure, profiles, every file's size and sha256)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.manifest import Manifest, checked_manifest
from specrt.runtime.backends.bundle_backends import BUNDLE_BACKENDS, bundle_parts
from specrt.runtime.family import TORCH_OPTIONS, Family
from specrt.runtime.pipeline import SAMPLING_KEYS, Pipeline


class LlamaGenFamily(Family):
    name = "llamagen"
    methods = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac", "gsd")
    token_dtype = "int64"
    backends = BUNDLE_BACKENDS
    pipeline_class = "specrt.runtime.pipeline:Pipeline"
    description = "LlamaGen-layout (VQ-token)"
    sampling_keys = ("cfg_scale", "temperature", "top_k", "top_p")
    torch_options = TORCH_OPTIONS  # Pipeline.from_torch takes each (Janus / Emu3 / Lumina-mGPT's too)

    def parse(self, raw: dict[str, Any], root: Path) -> Manifest:
        return checked_manifest(raw, root)

    def open(self, manifest: Manifest, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        """A LlamaGen-family bundle on one of BUNDLE_BACKENDS (runtime/backends/bundle_backends.py);
        `options`: providers, precision."""
        return Pipeline(**bundle_parts(manifest, backend, threads=threads, backends=self.backends, **options))

    def describe(self, manifest: Manifest) -> str:
        from specrt.runtime.bundle_check import check_manifest
        from specrt.runtime.families.llamagen.describe import format_manifest

        check_manifest(manifest)  # the numbers agree with each other (runtime/bundle_check.py), or one line
        return format_manifest(manifest)

    def conditions(self, pipeline: Any) -> str:
        return "prompts" if pipeline.target.spec.model_type == "t2i" else "class ids"

    def token_shape(self, pipeline: Any) -> tuple[int, ...]:
        return (pipeline.target.spec.grid_size ** 2,)

    def manifest_token_shape(self, manifest: Manifest) -> tuple[int, ...]:
        grid = (manifest.models.get("target") or {}).get("grid_size")
        if isinstance(grid, bool) or not isinstance(grid, int) or grid <= 0:
            raise SpecrtError(f"the manifest's target needs a positive integer 'grid_size', not {grid!r:.40}")
        return (grid * grid,)

    def check_request(self, pipeline: Any, method: str, params: dict[str, Any], class_id: Optional[int] = None,
                      prompt: Optional[str] = None) -> None:
        from specrt.runtime.methods import make_method
        from specrt.runtime.sampling import SamplingParams

        if class_id is not None:
            pipeline.conditions(class_ids=[class_id])
        elif pipeline.text_encoder is None:
            raise SpecrtError("this model has no text encoder: export the bundle with --text-encoder to send prompts")
        elif prompt is not None and hasattr(pipeline.text_encoder, "check"):  # runtime.text's encoders
            pipeline.text_encoder.check([prompt])  # a prompt with no known word is this row's error alone
        SamplingParams(**{**pipeline.sampling_defaults,
                          **{k: v for k, v in params.items() if k in SAMPLING_KEYS and v is not None}})
        make_method(method, **{k: v for k, v in params.items() if k not in SAMPLING_KEYS})

    def serving_stats(self, result: Any) -> dict[str, Any]:
        stats = result.stats
        return {"accepted_length": round(stats.mean_accepted_length, 4), "target_forwards": stats.target_forwards,
                "target_passes": stats.target_calls, "generate_seconds": round(stats.seconds["total"], 6)}


FAMILY = LlamaGenFamily()
