"""The Python side of the C API (runtime/include/specrt.h).

The C++ library embeds CPython and calls only these functions, so the ABI stays small and
everything it needs to know about the runtime lives here, in Python, where it is tested.
Errors are classified here into the C status codes (`status_of`), so the C++ layer never
has to understand Python exception types. Nothing here is family-specific: a specrt_pipeline
holds a `Handle` (the pipeline of the family its manifest names, runtime/families), and what
differs between families (token dtype, decoder, image size, statistics) is asked of the Family.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from specrt.errors import MissingDependency, SpecrtError
from specrt.runtime.family import Family

# Mirrors `specrt_status` in specrt.h.
OK, INVALID_ARGUMENT, NOT_FOUND, BUFFER_TOO_SMALL, RUNTIME, INTERNAL = range(6)

STATS_FIELDS = (
    "tokens", "target_forwards", "draft_forwards", "mean_accepted_length",
    "seconds_total", "seconds_target", "seconds_draft", "seconds_verify", "seconds_cache",
    "seconds_decode",
)


class BundleNotFound(SpecrtError):
    """The bundle directory does not exist or holds no manifest.json."""


# specrt_dtype in specrt.h: a family's token_dtype -> its code
DTYPES = {"int64": 1, "float32": 2}


@dataclass
class Handle:
    """What one specrt_pipeline holds: the pipeline of the bundle's family and what the C calls
    ask of it before generating (all through the Family interface, runtime/family.py)."""

    pipeline: Any
    family: Family
    image_size: Optional[tuple[int, int]]  # None: no decoder, the bundle generates tokens only

    @property
    def info(self) -> tuple[str, int, bool, int, int]:
        """(family name, specrt_dtype of its tokens, has a decoder, image height, image width)."""
        height, width = self.image_size or (0, 0)
        return (self.family.name, DTYPES[self.family.token_dtype], self.image_size is not None,
                int(height), int(width))


def open_pipeline(bundle_dir: str, backend: str | None) -> Any:
    """The pipeline of the bundle's family, as specrt_open opens it (open_handle)."""
    return open_handle(bundle_dir, backend).pipeline


def open_handle(bundle_dir: str, backend: str | None) -> Handle:
    """specrt_open: families.open_bundle's two steps (read_bundle, then the family's open), kept
    apart because the family is asked about the manifest too (image size). `backend` None means
    onnxruntime on the CPU. $SPECRT_THREADS, when set, is open's `threads` (intra-op threads per
    session, as the CLI's --threads)."""
    if not os.path.isfile(os.path.join(bundle_dir, "manifest.json")):
        raise BundleNotFound(f"no specrt bundle at {bundle_dir!r} (manifest.json not found)")
    from specrt import validation
    from specrt.runtime.family_registry import read_bundle

    threads = os.environ.get("SPECRT_THREADS") or None
    if threads is not None:
        threads = validation.threads("SPECRT_THREADS", threads)
    plugin, manifest = read_bundle(bundle_dir)
    pipeline = plugin.open(manifest, backend=backend or "ort", threads=threads)
    return Handle(pipeline, plugin, plugin.image_size(pipeline, manifest))


def parse_params(params_json: str | None) -> dict[str, Any]:
    """The JSON parameter string of specrt_generate -> keyword arguments (a JSON object)."""
    from specrt import validation

    return validation.json_object("params_json", params_json)


def generate_rgb8(handle: Handle, class_ids: list[int], method: str, params_json: str | None,
                  seed: int) -> tuple[bytes, dict[str, float]]:
    """specrt_generate: images; their RGB8 bytes (image after image) and the call's statistics."""
    _needs_decoder(handle)
    result, seconds = _generate(handle, list(class_ids), None, method, params_json, seed, decode=True)
    pixels = np.ascontiguousarray(result.images, dtype=np.uint8)
    return pixels.tobytes(), _stats(handle, result, seconds)


def generate_rgb8_prompts(handle: Handle, prompts: list[bytes], method: str, params_json: str | None,
                          seed: int) -> tuple[bytes, dict[str, float]]:
    """generate_rgb8 for a t2i bundle: one image per UTF-8 prompt, through the bundle's text encoder."""
    _needs_decoder(handle)
    result, seconds = _generate(handle, None, _texts(handle, prompts), method, params_json, seed, decode=True)
    pixels = np.ascontiguousarray(result.images, dtype=np.uint8)
    return pixels.tobytes(), _stats(handle, result, seconds)


Output = tuple[int, tuple[int, ...], bytes, Optional[bytes], int, int, dict[str, float]]


def generate_output(handle: Handle, class_ids: list[int], method: str, params_json: str | None, seed: int,
                    decode: bool) -> Output:
    """specrt_generate_output: (specrt_dtype, token shape, token bytes, RGB8 bytes or None, image
    height, width, statistics). Tokens always; images when `decode` and the bundle has a decoder."""
    result, seconds = _generate(handle, list(class_ids), None, method, params_json, seed,
                                decode=bool(decode) and handle.image_size is not None)
    return _output(handle, result, seconds)


def generate_output_prompts(handle: Handle, prompts: list[bytes], method: str, params_json: str | None, seed: int,
                            decode: bool) -> Output:
    """generate_output for a t2i bundle (one output image per UTF-8 prompt)."""
    result, seconds = _generate(handle, None, _texts(handle, prompts), method, params_json, seed,
                                decode=bool(decode) and handle.image_size is not None)
    return _output(handle, result, seconds)


def _needs_decoder(handle: Handle) -> None:
    if handle.image_size is None:
        raise SpecrtError(f"this {handle.family.name} bundle has no decoder: it generates tokens only "
                          "(call specrt_generate_output and read its tokens)")


def _texts(handle: Handle, prompts: list[bytes]) -> list[str]:
    if handle.family.conditions(handle.pipeline) != "prompts":
        raise SpecrtError("this model is class-conditional: give class ids (specrt_generate), not prompts")
    try:
        return [p.decode("utf-8") for p in prompts]
    except UnicodeDecodeError as exc:
        raise SpecrtError(f"prompt is not valid UTF-8 (byte {exc.start})") from None


def _generate(handle: Handle, class_ids: Optional[list[int]], prompts: Optional[list[str]], method: str,
              params_json: str | None, seed: int, decode: bool) -> tuple[Any, float]:
    """The family's pipeline's generate (the one calling convention of runtime/family.py)
    and the call's wall time."""
    params = _params(handle, params_json)
    conditions = {"prompts": prompts} if prompts is not None else {}
    start = time.perf_counter()
    result = handle.pipeline.generate(class_ids, method=method, seed=int(seed), decode=decode, **conditions, **params)
    return result, time.perf_counter() - start


def _params(handle: Handle, params_json: str | None) -> dict[str, Any]:
    """params_json's keys; a sampling key given as null takes the bundle's default (as on every
    other path), so it is left out here."""
    params = parse_params(params_json)
    if "decode" in params:
        raise SpecrtError("params_json: 'decode' is not a parameter here; specrt_generate always returns pixels "
                          "(specrt_generate_output takes decode as an argument)")
    defaults = getattr(handle.pipeline, "sampling_defaults", {}) or {}
    return {k: v for k, v in params.items() if not (v is None and k in defaults)}


def _stats(handle: Handle, result: Any, seconds: float) -> dict[str, float]:
    """The family's numbers for the call (Family.call_stats); what it does not measure is 0,
    seconds_total the call's wall time."""
    numbers = {"seconds_total": seconds, **handle.family.call_stats(result)}
    return {name: float(numbers.get(name) or 0.0) for name in STATS_FIELDS}


def _output(handle: Handle, result: Any, seconds: float) -> Output:
    dtype = handle.family.token_dtype
    tokens = np.ascontiguousarray(result.tokens, dtype=dtype)  # native byte order, as C reads it
    images = None if result.images is None else np.ascontiguousarray(result.images, dtype=np.uint8)
    height, width = (0, 0) if images is None else images.shape[1:3]
    return (DTYPES[dtype], tuple(int(d) for d in tokens.shape), tokens.tobytes(),
            None if images is None else images.tobytes(), int(height), int(width), _stats(handle, result, seconds))


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
