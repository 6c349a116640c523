"""The unified-vocabulary family: Janus / Janus-Pro, Emu3 and Lumina-mGPT (Chameleon), LLM-style
generators whose image tokens share one vocabulary with text (docs/contracts.md, "Unified-vocabulary
models"), with every discrete method (ar, sd, cool-sd, lantern, sjd, sjd-pac).

Its pipeline (pipeline.UnifiedPipeline) is the discrete Pipeline with token prompts (prompts.py:
each model's own recipe, tokenizers only) and an image grammar (runtime/grammar.py); the graphs
carry the grammar in their logits, so the methods run unchanged."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.runtime.families.llamagen import LlamaGenFamily


class UnifiedFamily(LlamaGenFamily):
    """The discrete family's plug-in with token prompts, a grammar and onnxruntime backends."""

    name = "unified"
    methods = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac")
    token_dtype = "int64"
    backends = ("ort", "ort-cpu", "ort-cuda", "ort-trt")  # TensorRT engines ('trt') are not wired for these bundles
    pipeline_class = "specrt.runtime.families.unified.pipeline:UnifiedPipeline"
    description = "unified-vocabulary (Janus / Emu3 / Lumina-mGPT)"
    sampling_keys = ("cfg_scale", "temperature", "top_k", "top_p")
    takes_prompts = True
    negative_prompts = True

    def open(self, path: Path, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        from specrt.runtime.families.unified.pipeline import UnifiedPipeline

        return UnifiedPipeline.open_bundle(path, backend=backend, threads=threads, **options)

    def describe(self, path: Path) -> str:
        from specrt.manifest import read_manifest
        from specrt.runtime.bundle_check import check_manifest
        from specrt.runtime.families.llamagen.describe import format_manifest
        from specrt.runtime.families.unified.bundle import describe_unified

        manifest = read_manifest(path)
        check_manifest(manifest)
        return format_manifest(manifest) + "\n" + describe_unified(manifest)

    def demo_pipeline(self, name: str, threads: Optional[int] = None) -> Any:
        """The chameleon demo on PyTorch (`specrt generate --demo chameleon --prompt ...`)."""
        from specrt.export.demo.registry import get_demo

        return get_demo(name).hook("torch_pipeline")(None, threads=threads)

    def conditions(self, pipeline: Any) -> str:
        return "prompts"

    def image_size(self, pipeline: Any, manifest: dict[str, Any]) -> Optional[tuple[int, int]]:
        return tuple(pipeline.image_size) if pipeline.vq is not None else None

    def has_decoder(self, pipeline: Any) -> bool:
        return pipeline.vq is not None

    def token_shape(self, pipeline: Any) -> tuple[int, ...]:
        return (pipeline.grammar.rows * pipeline.grammar.cols,)

    def manifest_token_shape(self, manifest: dict[str, Any]) -> tuple[int, ...]:
        from specrt.runtime.families.unified.bundle import grammar_of

        target = (manifest.get("models") or {}).get("target")
        if not isinstance(target, dict):
            raise SpecrtError("the manifest has no models.target object")
        grammar = grammar_of(target)
        return (grammar.rows * grammar.cols,)

    def check_request(self, pipeline: Any, method: str, params: dict[str, Any], class_id: Optional[int] = None,
                      prompt: Optional[str] = None) -> None:
        from specrt.runtime.methods import make_method
        from specrt.runtime.pipeline import SAMPLING_KEYS
        from specrt.runtime.sampling import SamplingParams

        if class_id is not None:
            raise SpecrtError("this model is conditioned on text prompts, not class ids")
        pipeline.conditions(prompts=[prompt])  # tokenizes and checks the length, as generate would
        SamplingParams(**{**pipeline.sampling_defaults,
                          **{k: v for k, v in params.items() if k in SAMPLING_KEYS and v is not None}})
        make_method(method, **{k: v for k, v in params.items() if k not in SAMPLING_KEYS})


FAMILY = UnifiedFamily()
