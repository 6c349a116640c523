"""What runs a discrete bundle (LlamaGen, unified) on each `--backend`: onnxruntime here, with the
execution providers and the TensorRT engines of specrt.engines found through registries.

    parts = bundle_parts(manifest, "ort-cuda", threads=2)   # Pipeline(**parts), UnifiedPipeline(..., **parts)

'ort' is onnxruntime with its default providers (CPU here); 'ort-cpu', 'ort-cuda' and 'ort-trt'
pick onnxruntime's execution provider with the bundle's profiles and caches (the provider
options of TensorRT live with the engine builder); 'trt' runs the engines `specrt build` made.
The registries hold dotted paths (runtime/plugins.py): the runtime imports nothing above it, and
a plug-in that cannot be loaded is one line.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

from specrt import validation
from specrt.errors import SpecrtError
from specrt.manifest import Manifest
from specrt.runtime.backends.ort_backend import pipeline_parts_from_bundle
from specrt.runtime.plugins import load

# onnxruntime backends -> "module:function" listing a graph's execution providers, best first
# (called as providers_for(backend, manifest, graph, precision=...))
PROVIDERS: dict[str, str] = {backend: "specrt.engines.ort_providers:providers_for"
                             for backend in ("ort-cpu", "ort-cuda", "ort-trt")}
# engine backends -> "module:function" giving Pipeline(...)'s runners, decoder and companions
# (called as pipeline_parts_from_bundle(manifest, precision))
ENGINES: dict[str, str] = {"trt": "specrt.engines.trt_runner:pipeline_parts_from_bundle"}
BUNDLE_BACKENDS: tuple[str, ...] = ("ort", *PROVIDERS, *ENGINES)


def bundle_parts(manifest: Manifest, backend: str = "ort", providers: Optional[Sequence[Any]] = None,
                 threads: Optional[int] = None, precision: Optional[str] = None,
                 backends: Sequence[str] = BUNDLE_BACKENDS) -> dict[str, Any]:
    """Keyword arguments of Pipeline(...) for a checked bundle on `backend` (one of `backends`,
    the ones its family runs): the runners, decoder and companions every discrete family's
    pipeline opens alike. `threads`: intra-op threads per onnxruntime session
    (specrt.runtime.threads; None: onnxruntime's default); `precision` picks the engines ('trt')
    or the TensorRT provider's precision ('ort-trt'); `providers` overrides the backend's own."""
    precision = precision or "fp32"
    if threads is not None:
        threads = validation.count("threads", threads)
    if backend not in backends:
        hint = " (torch runs checkpoints or the demo, not bundles)" if backend == "torch" else ""
        raise SpecrtError(f"unknown bundle backend {backend!r}{hint}; choose one of {', '.join(backends)}")
    if backend in ENGINES:
        return load(ENGINES[backend], f"the {backend} backend")(manifest, precision)
    if backend in PROVIDERS and providers is None:
        providers_for = load(PROVIDERS[backend], f"the {backend} backend's execution providers")
        providers = functools.partial(providers_for, backend, manifest, precision=precision)
    return pipeline_parts_from_bundle(manifest, providers, threads)
