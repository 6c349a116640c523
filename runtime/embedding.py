"""The Python side of the C API (runtime/include/specrt.h).

The C++ library embeds CPython and calls only these functions, so the ABI stays small and
everything it needs to know about the runtime lives here, in Python, where it is tested.
Errors are classified here into the C status codes (`status_of`), so the C++ layer never
has to understand Python exception types.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from specrt.errors import MissingDependency, SpecrtError

# Mirrors `specrt_status` in specrt.h.
OK, INVALID_ARGUMENT, NOT_FOUND, BUFFER_TOO_SMALL, RUNTIME, INTERNAL = range(6)

STATS_FIELDS = (
    "tokens", "target_forwards", "draft_forwards", "mean_accepted_length",
    "seconds_total", "seconds_target", "seconds_draft", "seconds_verify", "seconds_cache",
    "seconds_decode",
)


class BundleNotFound(SpecrtError):
    """The bundle directory does not exist or holds no manifest.json."""


def open_pipeline(bundle_dir: str, backend: str | None) -> Any:
    """Open a Pipeline for the C API; `backend` None means onnxruntime on the CPU. $SPECRT_THREADS,
    when set, is from_bundle's `threads` (intra-op threads per session, as the CLI's --threads)."""
    if not os.path.isfile(os.path.join(bundle_dir, "manifest.json")):
        raise BundleNotFound(f"no specrt bundle at {bundle_dir!r} (manifest.json not found)")
    from specrt import validation
    from specrt.runtime.pipeline import Pipeline

    threads = os.environ.get("SPECRT_THREADS") or None
    if threads is not None:
        threads = validation.count("SPECRT_THREADS", threads)
    return Pipeline.from_bundle(bundle_dir, backend=backend or "ort", threads=threads)


def image_size(pipe: Any) -> tuple[int, int]:
    """(height, width) in pixels of one generated image."""
    height, width = pipe.image_size
    return int(height), int(width)


def parse_params(params_json: str | None) -> dict[str, Any]:
    """The JSON parameter string of specrt_generate -> keyword arguments (a JSON object)."""
    from specrt import validation

    return validation.json_object("params_json", params_json)


def generate_rgb8(pipe: Any, class_ids: list[int], method: str, params_json: str | None,
                  seed: int) -> tuple[bytes, dict[str, float]]:
    """Generate images; return their RGB8 bytes (image after image) and the call's statistics."""
    return _rgb8(pipe.generate(list(class_ids), method=method, seed=int(seed), **_params(params_json)))


def generate_rgb8_prompts(pipe: Any, prompts: list[bytes], method: str, params_json: str | None,
                          seed: int) -> tuple[bytes, dict[str, float]]:
    """generate_rgb8 for a t2i bundle: one image per UTF-8 prompt, through the bundle's text encoder."""
    try:
        texts = [p.decode("utf-8") for p in prompts]
    except UnicodeDecodeError as exc:
        raise SpecrtError(f"prompt is not valid UTF-8 (byte {exc.start})") from None
    return _rgb8(pipe.generate(prompts=texts, method=method, seed=int(seed), **_params(params_json)))


def _params(params_json: str | None) -> dict[str, Any]:
    params = parse_params(params_json)
    if "decode" in params:
        raise SpecrtError("params_json: 'decode' is not a parameter here; specrt_generate always returns pixels")
    return params


def _rgb8(result: Any) -> tuple[bytes, dict[str, float]]:
    pixels = np.ascontiguousarray(result.images, dtype=np.uint8)
    stats = result.stats.as_dict() if hasattr(result.stats, "as_dict") else dict(result.stats)
    return pixels.tobytes(), {name: float(stats.get(name, 0.0)) for name in STATS_FIELDS}


def status_of(exc: BaseException) -> tuple[int, str]:
    """Map an exception raised by the functions above to (specrt_status, one-line message)."""
    if isinstance(exc, BundleNotFound):
        return NOT_FOUND, str(exc)
    if isinstance(exc, MissingDependency):
        return RUNTIME, str(exc)
    if isinstance(exc, ImportError):
        return RUNTIME, f"the specrt runtime could not be imported: {exc}"
    if isinstance(exc, SpecrtError):
        return INVALID_ARGUMENT, str(exc)
    first_line = (str(exc).splitlines() or [""])[0]
    return INTERNAL, f"{type(exc).__name__}: {first_line}"
