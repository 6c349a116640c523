"""onnxruntime execution providers for `--backend ort-cpu | ort-cuda | ort-trt`.

onnxruntime's TensorRT execution provider is a second route to TensorRT: it builds its own
engines from the same ONNX graphs. It needs the same optimization profiles `specrt build`
uses (or it rebuilds an engine whenever a step's shape leaves the range it has seen), and
its engine and timing caches belong inside the bundle like ours. This module turns a
bundle graph into that provider list; the runtime's onnxruntime backend passes it to
`InferenceSession(..., providers=...)`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.errors import SpecrtError
from specrt.manifest import Manifest, as_manifest

from .bundle import graph_entries
from .precision import validate_precision
from .profiles import derive_profile
from .trtexec import shapes_arg

BACKENDS = ("ort-cpu", "ort-cuda", "ort-trt")
ORT_TRT_CACHE_DIR = "engines/ort-trt"  # relative to the bundle; onnxruntime names the files itself
_NEEDS = {"ort-cpu": "CPUExecutionProvider", "ort-cuda": "CUDAExecutionProvider", "ort-trt": "TensorrtExecutionProvider"}

Provider = str | tuple[str, dict[str, str]]


def tensorrt_options(bundle: str | Path | Manifest, graph: str, precision: str = "fp32", device_id: int = 0,
                     workspace_bytes: int = 4 << 30, max_window: int | None = None) -> dict[str, str]:
    """TensorRT execution provider options for one graph: profiles from the manifest, caches in the bundle
    (`bundle`: its checked manifest, or its directory).

    fp16/bf16 here are the provider's builder flags, which exist on TensorRT 10 only; on
    TensorRT 11 give onnxruntime a graph converted by specrt.engines.precision instead.
    """
    validate_precision(precision)
    manifest = as_manifest(bundle)
    [entry] = graph_entries(manifest.root, [graph], manifest)
    profile = derive_profile(graph, entry.spec, max_window)
    cache_dir = str(manifest.root.absolute() / ORT_TRT_CACHE_DIR)
    options = {
        "device_id": str(device_id),
        "trt_max_workspace_size": str(workspace_bytes),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": cache_dir,
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": cache_dir,
        "trt_fp16_enable": "1" if precision == "fp16" else "0",
    }
    if precision == "bf16":
        options["trt_bf16_enable"] = "1"
    if profile.dynamic_inputs:
        options["trt_profile_min_shapes"] = shapes_arg(profile, "min")
        options["trt_profile_opt_shapes"] = shapes_arg(profile, "opt")
        options["trt_profile_max_shapes"] = shapes_arg(profile, "max")
    return options


def providers_for(backend: str, bundle: str | Path | Manifest, graph: str, precision: str = "fp32", device_id: int = 0,
                  max_window: int | None = None, available: list[str] | None = None) -> list[Provider]:
    """Provider list for `InferenceSession(providers=...)`, best first, with the fallbacks onnxruntime needs.

    ort-trt falls back to CUDA (for nodes TensorRT rejects), ort-cuda to CPU (shape ops);
    SpecrtError when this onnxruntime build lacks the backend's provider. `available`
    defaults to onnxruntime.get_available_providers() (a parameter for tests).
    """
    if backend not in BACKENDS:
        raise SpecrtError(f"unknown onnxruntime backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if available is None:
        from specrt.lazy import require

        available = list(require("onnxruntime", f"--backend {backend}").get_available_providers())
    if _NEEDS[backend] not in available:
        hint = "pip install onnxruntime-gpu (or 'specrt[gpu]'); on Jetson use the Jetson Zoo wheel"
        raise SpecrtError(f"--backend {backend} needs onnxruntime's {_NEEDS[backend]}, which this onnxruntime "
                          f"does not have (it has {', '.join(available) or 'none'}): {hint}")
    cuda: Provider = ("CUDAExecutionProvider", {"device_id": str(device_id)})
    if backend == "ort-cpu":
        return ["CPUExecutionProvider"]
    if backend == "ort-cuda":
        return [cuda, "CPUExecutionProvider"]
    trt: Provider = ("TensorrtExecutionProvider",
                     tensorrt_options(bundle, graph, precision, device_id, max_window=max_window))
    fallbacks = [cuda] if "CUDAExecutionProvider" in available else []
    return [trt, *fallbacks, "CPUExecutionProvider"]


def session_providers(providers: list[Provider]) -> tuple[list[str], list[dict[str, Any]]]:
    """Split a provider list into the (names, options) pair of InferenceSession's older signature."""
    names = [p if isinstance(p, str) else p[0] for p in providers]
    options = [{} if isinstance(p, str) else p[1] for p in providers]
    return names, options
