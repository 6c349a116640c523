"""The unified-vocabulary family: Janus / Janus-Pro, Emu3 and Lumina-mGPT (Chameleon), LLM-style
generators whose image tokens share one vocabulary with text (docs/contracts.md, "Unified-vocabulary
models"), with every discrete method (ar, sd, cool-sd, lantern, sjd, sjd-pac).

Its pipeline (pipeline.UnifiedPipeline) is the discrete Pipeline with token prompts (prompts.py:
each model's own recipe, tokenizers only) and an image grammar (runtime/grammar.py); the graphs
carry the grammar in their logits, so the methods run unchanged."""
from __future__ import annotations

from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.manifest import Manifest
from specrt.runtime.families.llamagen import LlamaGenFamily
from specrt.runtime.families.unified.bundle import describe_unified, grammar_of
from specrt.runtime.families.unified.pipeline import BACKENDS, UnifiedPipeline
from specrt.runtime.pipeline import SAMPLING_KEYS


class UnifiedFamily(LlamaGenFamily):
    """The discrete family's plug-in with token prompts, a grammar and onnxruntime backends."""

    name = "unified"
    methods = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac", "gsd")
    token_dtype = "int64"
    backends = BACKENDS
    pipeline_class = "specrt.runtime.families.unified.pipeline:UnifiedPipeline"
    description = "unified-vocabulary (Janus / Emu3 / Lumina-mGPT)"
    sampling_keys = ("cfg_scale", "temperature", "top_k", "top_p")
    takes_prompts = True
    negative_prompts = True

    def open(self, manifest: Manifest, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        return UnifiedPipeline.open_bundle(manifest, backend=backend, threads=threads, **options)

    def describe(self, manifest: Manifest) -> str:
        return super().describe(manifest) + "\n" + describe_unified(manifest)

    def takes_modules(self, target: Any) -> bool:
        """A unified-vocabulary model (specrt's UnifiedLM): its config carries the image grammar."""
        return getattr(getattr(target, "config", None), "grammar", None) is not None

    def from_torch(self, target: Any, draft: Any, vq: Any, **options: Any) -> Any:
        return UnifiedPipeline.from_torch(target, draft, vq, **options)

    def conditions(self, pipeline: Any) -> str:
        return "prompts"

    def image_size(self, pipeline: Any, manifest: dict[str, Any]) -> Optional[tuple[int, int]]:
        return tuple(pipeline.image_size) if pipeline.vq is not None else None

    def has_decoder(self, pipeline: Any) -> bool:
        return pipeline.vq is not None

    def token_shape(self, pipeline: Any) -> tuple[int, ...]:
        return (pipeline.grammar.rows * pipeline.grammar.cols,)

    def manifest_token_shape(self, manifest: Manifest) -> tuple[int, ...]:
        target = manifest.models.get("target")
        if not isinstance(target, dict):
            raise SpecrtError("the manifest has no models.target object")
        grammar = grammar_of(target)
        return (grammar.rows * grammar.cols,)

    def check_request(self, pipeline: Any, method: str, params: dict[str, Any], class_id: Optional[int] = None,
                      prompt: Optional[str] = None) -> None:
        from specrt.runtime.methods import make_method
        from specrt.runtime.sampling import SamplingParams

        if class_id is not None:
            raise SpecrtError("this model is conditioned on text prompts, not class ids")
        pipeline.conditions(prompts=[prompt])  # tokenizes and checks the length, as generate would
        SamplingParams(**{**pipeline.sampling_defaults,
                          **{k: v for k, v in params.items() if k in SAMPLING_KEYS and v is not None}})
        make_method(method, **{k: v for k, v in params.items() if k not in SAMPLING_KEYS})


FAMILY = UnifiedFamily()
