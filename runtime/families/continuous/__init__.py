"""The continuous family: MAR-style models whose tokens are continuous latents drawn by a
diffusion head, with ar and continuous speculative decoding (cspd, paper 002).

Its pipeline is ContinuousPipeline; its manifest reader is runtime/families/continuous/bundle.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.runtime.family import Family
from specrt.runtime.families.continuous.bundle import ContinuousManifest, model_spec

# gsd groups discrete tokens whose embeddings lie close (runtime/verification/grouped.py): nothing to group here
GSD_REFUSAL = ("method 'gsd' groups discrete tokens by their embeddings; a continuous model's tokens are latent "
               "vectors, so it does not apply: a continuous model runs ar, cspd")


class ContinuousFamily(Family):
    name = "continuous"
    methods = ("ar", "cspd")
    refused_methods = {"gsd": GSD_REFUSAL}
    token_dtype = "float32"
    backends = ("ort", "ort-cpu", "torch")
    pipeline_class = "specrt.runtime.families.continuous.pipeline:ContinuousPipeline"
    description = "continuous (MAR-style)"
    sampling_keys = ("cfg_scale", "temperature", "cfg_schedule")
    torch_options = ("device", "loop")  # torch_runners(..., device) and ContinuousPipeline.loop; no compiled step
    bench_runner = "specrt.bench.continuous:run_command"

    def method_classes(self) -> dict[str, Any]:
        from specrt.runtime.families.continuous.methods import CONTINUOUS_METHODS

        return {name: CONTINUOUS_METHODS[name] for name in self.methods if name in CONTINUOUS_METHODS}

    def summary(self, result: Any) -> dict[str, Any]:
        stats = result.stats
        return {"tokens": stats.tokens, "target_passes": stats.target_passes, "drafted": stats.drafted,
                "accepted": stats.accepted, "acceptance_rate": stats.acceptance_rate,
                "tokens_per_target_pass": stats.tokens_per_target_pass,
                "residual_proposals": stats.residual_proposals, "seconds": sum(result.seconds),
                "host_syncs": stats.host_syncs,  # counted by the device round (one read a round); None: the host loop
                "sampling": result.sampling}

    def parse(self, raw: dict[str, Any], root: Path) -> ContinuousManifest:
        return ContinuousManifest.checked(raw, root)

    def open(self, manifest: ContinuousManifest, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        from specrt.runtime.families.continuous.pipeline import ContinuousPipeline
        from specrt.runtime.threads import set_torch_threads

        if backend not in self.backends:
            raise SpecrtError(f"a continuous bundle runs on {', '.join(self.backends)}, not backend {backend!r}")
        unknown = sorted(k for k, v in options.items() if v is not None)
        if unknown:
            raise SpecrtError(f"a continuous bundle takes no {', '.join(unknown)}")
        if backend == "torch":
            set_torch_threads(1 if threads is None else threads)
        return ContinuousPipeline.from_bundle(manifest, "torch" if backend == "torch" else "onnxruntime")

    def describe(self, manifest: ContinuousManifest) -> str:
        from specrt.runtime.families.continuous.describe import describe_bundle

        return describe_bundle(manifest)

    def has_decoder(self, pipeline: Any) -> bool:
        return pipeline.decoder is not None

    def image_size(self, pipeline: Any, manifest: ContinuousManifest) -> Optional[tuple[int, int]]:
        """The decoder's square images, as the manifest's decoder entry gives their side."""
        if not self.has_decoder(pipeline):
            return None
        side = (manifest.raw.get("decoder") or {}).get("image_size")
        if isinstance(side, bool) or not isinstance(side, int) or side <= 0:
            raise SpecrtError(f"the manifest's decoder needs a positive integer 'image_size', not {side!r:.40}")
        return side, side

    def call_stats(self, result: Any) -> dict[str, float]:
        """Tokens and target forwards per image (a batched step of 8 images counts 8), one draft
        forward per drafted token, tokens per target forward; no per-part timings."""
        stats = result.stats
        return {"tokens": stats.tokens,
                "target_forwards": stats.target_forwards,
                "draft_forwards": stats.drafted,
                "mean_accepted_length": stats.tokens_per_target_pass}

    def token_shape(self, pipeline: Any) -> tuple[int, ...]:
        return pipeline.target.spec.seq_len, pipeline.target.spec.token_dim

    def manifest_token_shape(self, manifest: ContinuousManifest) -> tuple[int, ...]:
        target = manifest.models.get("target")
        if not isinstance(target, dict) or not isinstance(target.get("config"), dict):
            raise SpecrtError("the manifest's models need a target with a 'config' object")
        spec = model_spec(target["config"])
        return spec.seq_len, spec.token_dim

    def check_request(self, pipeline: Any, method: str, params: dict[str, Any], class_id: Optional[int] = None,
                      prompt: Optional[str] = None) -> None:
        """ContinuousPipeline.generate's checks of one row, in its order (sampling keys, method,
        class id, draft), without generating."""
        from specrt import validation
        from specrt.runtime.families.continuous.pipeline import SAMPLING_KEYS
        from specrt.runtime.families.continuous.methods import ContinuousDecoding, make_continuous_method

        sampling = {**pipeline.sampling_defaults, **{k: v for k, v in params.items() if k in SAMPLING_KEYS}}
        ContinuousDecoding(pipeline.target, None, [], **sampling)  # checks temperature, cfg_scale, cfg_schedule
        strategy = make_continuous_method(method, **{k: v for k, v in params.items() if k not in SAMPLING_KEYS})
        validation.class_ids([class_id], pipeline.num_classes)
        if strategy.needs_draft and pipeline.draft is None:
            raise SpecrtError(f"method {method!r} needs a draft model and {pipeline.source or 'this model'} has none")

    def serving_stats(self, result: Any) -> dict[str, Any]:
        """Tokens per target forward of one image, forwards and passes (graph runs), cspd's
        acceptance rate and residual proposals; the handler times the call (no total here)."""
        stats = result.stats
        return {"accepted_length": round(stats.tokens_per_target_pass, 4), "target_forwards": stats.target_forwards,
                "target_passes": stats.target_passes, "acceptance_rate": round(stats.acceptance_rate, 4),
                "residual_proposals": stats.residual_proposals}


FAMILY = ContinuousFamily()
