"""The wire format of a specrt Triton model: one batch row per image, the same for PyTriton
(`specrt serve`) and the stock tritonserver's Python backend (`specrt triton-repo`).

Every input is optional (a row may leave any out and get its default) and has one value per
row, so Triton's dynamic batcher can stack requests of any mix. Requests that cannot be
served get a one-line `error` in their own rows, never an exception: PyTriton fails a whole
merged batch on an exception, which would punish the requests batched with a bad one.
docs/contracts.md ("Serving") lists the same tensors for client writers.

The `tokens` output is the one tensor that depends on the model family (runtime/families):
its dtype is the family's token dtype and its shape the family's token shape with the
positions axis variable — INT64 [positions] for VQ codes (OUTPUTS, the LlamaGen family), FP32
[positions, channels] for continuous latents (`outputs(...)` builds the model's list).
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton declares it; `shape` is per row (no batch dim)."""

    name: str
    dtype: str  # Triton's data type name without TYPE_: INT64, UINT64, FP32, BOOL, BYTES
    shape: tuple[int, ...]
    doc: str


INPUTS = (
    TensorSpec("class_id", "INT64", (1,), "class id (class-conditional models)"),
    TensorSpec("prompt", "BYTES", (1,), "UTF-8 prompt (text-to-image models with a text encoder)"),
    TensorSpec("method", "BYTES", (1,), "ar | sd | cool-sd | lantern | sjd | sjd-pac; continuous models: ar | cspd "
                                        "(default ar)"),
    TensorSpec("seed", "UINT64", (1,), "random seed (default 0); the image is generate(seed=seed)'s"),
    TensorSpec("params", "BYTES", (1,), "JSON object of method parameters and sampling keys"),
    TensorSpec("tokens_only", "BOOL", (1,), "skip the decoder: `image` comes back empty (always so for a model "
                                            "without one)"),
    TensorSpec("negative_prompt", "BYTES", (1,), "UTF-8 text of the unconditional (CFG) row, models whose "
                                                 "unconditional row is a prompt (Janus, Emu3, Lumina-mGPT)"),
    TensorSpec("prompt_suffix", "BOOL", (1,), "false drops the recipe's fixed prompt suffix (Emu3's); default true"),
)
OUTPUTS = (
    TensorSpec("image", "BYTES", (1,), "PNG bytes (empty with tokens_only or on an error)"),
    TensorSpec("tokens", "INT64", (-1,), "the grid's token ids in raster order (-1 on an error); continuous "
                                         "models: FP32 [positions, channels] (NaN on an error)"),
    TensorSpec("stats", "BYTES", (1,), "JSON: method, accepted_length, target_forwards, target_passes, "
                                       "images_in_call, generate_seconds, server_seconds (continuous: + "
                                       "acceptance_rate, residual_proposals)"),
    TensorSpec("error", "BYTES", (1,), "one line saying why this row was not served; empty on success"),
)
NUMPY_DTYPES = {"INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_, "BYTES": np.object_}
TOKEN_DTYPES = {"int64": "INT64", "float32": "FP32"}  # a family's token_dtype -> its Triton data type


def outputs(token_dtype: str = "int64", token_shape: tuple[int, ...] = (-1,)) -> tuple[TensorSpec, ...]:
    """The model's outputs: OUTPUTS with `tokens` of the family's dtype ("int64" | "float32") and
    shape (one image's, Family.token_shape; the positions axis is declared -1)."""
    if token_dtype not in TOKEN_DTYPES:
        raise ValueError(f"token dtype {token_dtype!r} is none of {', '.join(TOKEN_DTYPES)}")
    dims = (-1, *token_shape[1:])
    return tuple(TensorSpec(spec.name, TOKEN_DTYPES[token_dtype], dims, spec.doc) if spec.name == "tokens" else spec
                 for spec in OUTPUTS)


@dataclass(frozen=True)
class ImageRequest:
    """One row, decoded and checked for form (the model checks the rest)."""

    class_id: Optional[int]
    prompt: Optional[str]
    method: str
    seed: int
    params: tuple[tuple[str, Any], ...]  # sorted items of the params object
    tokens_only: bool
    negative_prompt: Optional[str] = None
    prompt_suffix: Optional[bool] = None  # None: not sent (the recipe's own)

    @property
    def group(self) -> tuple:
        """Rows with equal groups run in one generate call (same method, parameters, decoding and
        unconditional row)."""
        return self.method, json.dumps(self.params), self.tokens_only, self.negative_prompt, self.prompt_suffix

    @property
    def prompt_options(self) -> dict[str, Any]:
        """The generate keywords that shape a prompt model's rows, as far as the row sent them."""
        return {name: value for name, value in (("negative_prompt", self.negative_prompt),
                                                ("prompt_suffix", self.prompt_suffix)) if value is not None}


@dataclass
class ImageResult:
    """What one row gets back: its tokens (the family's token shape) and PNG bytes, or an error."""

    tokens: Optional[np.ndarray] = None
    png: bytes = b""
    stats: Optional[dict] = None
    error: str = ""


def _text(value: Any, name: str) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecrtError(f"{name} is not valid UTF-8 (byte {exc.start})") from None
    if isinstance(value, str):
        return value
    raise SpecrtError(f"{name} must be a string (BYTES), got {type(value).__name__}")


def params_object(text: str) -> dict[str, Any]:
    """The `params` input: a JSON object of method parameters and sampling keys ('' = none).

    `static_tree` takes the built-in shapes only: as a file path (a `specrt plan-tree` plan) it
    would have the server open whatever file a client names, and its one-line errors would tell
    the client which paths exist."""
    params = validation.json_object("params", text)
    if "decode" in params:
        raise SpecrtError("params: 'decode' is not a parameter here; send tokens_only=true to skip the decoder")
    if "static_tree" in params:
        from specrt.runtime.tree import STATIC_TREES

        if not isinstance(params["static_tree"], str) or params["static_tree"] not in STATIC_TREES:
            raise SpecrtError(f"params: static_tree must be one of {', '.join(STATIC_TREES)} here "
                              "(a served model reads no plan files a request names)")
    return params


def batch_rows(inputs: Mapping[str, np.ndarray]) -> int:
    """Rows in one request: every input's first dimension, which must agree."""
    sizes = {name: int(np.shape(value)[0]) if np.ndim(value) else 1 for name, value in inputs.items()}
    if not sizes:
        return 1
    if len(set(sizes.values())) != 1:
        raise SpecrtError("inputs disagree on the batch size: " + ", ".join(f"{n} {s}" for n, s in sizes.items()))
    return next(iter(sizes.values()))


def decode_row(inputs: Mapping[str, np.ndarray], row: int) -> ImageRequest:
    """Row `row` of a request's inputs (name -> array [rows, 1]) as an ImageRequest."""
    unknown = sorted(set(inputs) - {spec.name for spec in INPUTS})
    if unknown:
        raise SpecrtError(f"unknown input {unknown[0]!r}; inputs are {', '.join(s.name for s in INPUTS)}")

    def value(name: str) -> Any:
        array = inputs.get(name)
        if array is None:
            return None
        flat = np.asarray(array, dtype=object if np.asarray(array).dtype.kind in "OSU" else None)
        flat = flat.reshape(flat.shape[0], -1) if flat.ndim else flat.reshape(1, 1)
        if flat.shape[1] != 1:
            raise SpecrtError(f"{name} takes one value per row, got {flat.shape[1]}")
        return flat[row, 0]

    class_id, prompt = value("class_id"), value("prompt")
    if (class_id is None) == (prompt is None):
        raise SpecrtError("give class_id (class-conditional models) or prompt (text-to-image), exactly one")
    method = value("method")
    tokens_only = value("tokens_only")
    negative_prompt, prompt_suffix = value("negative_prompt"), value("prompt_suffix")
    params = params_object(_text(value("params"), "params")) if value("params") is not None else {}
    return ImageRequest(
        class_id=None if class_id is None else validation.integer("class_id", class_id, low=0),
        prompt=None if prompt is None else _text(prompt, "prompt"),
        method="ar" if method is None else _text(method, "method"),
        seed=0 if value("seed") is None else validation.seed(value("seed")),
        params=tuple(sorted(params.items())),
        tokens_only=False if tokens_only is None else validation.flag("tokens_only", tokens_only),
        negative_prompt=None if negative_prompt is None else _text(negative_prompt, "negative_prompt"),
        prompt_suffix=None if prompt_suffix is None else validation.flag("prompt_suffix", prompt_suffix),
    )


def decode_request(inputs: Mapping[str, np.ndarray]) -> list[Union[ImageRequest, SpecrtError]]:
    """Every row of one request, each an ImageRequest or the SpecrtError that rules it out."""
    inputs = {name: np.asarray(array) for name, array in inputs.items()}
    try:
        rows = batch_rows(inputs)
    except SpecrtError as exc:
        return [exc] * max(int(np.shape(a)[0]) if np.ndim(a) else 1 for a in inputs.values())
    out: list[Union[ImageRequest, SpecrtError]] = []
    for row in range(rows):
        try:
            out.append(decode_row(inputs, row))
        except SpecrtError as exc:
            out.append(exc)
    return out


def png_bytes(image: np.ndarray) -> bytes:
    """uint8 [H, W, 3] -> PNG file bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def encode_response(results: list[ImageResult], token_shape: int | tuple[int, ...],
                    token_dtype: str = "int64") -> dict[str, np.ndarray]:
    """One request's rows -> its output arrays (name -> [rows, ...]); `tokens` is [rows,
    *token_shape] of `token_dtype`, -1 (int64) or NaN (float32) in a row that has none."""
    shape = (token_shape,) if isinstance(token_shape, int) else tuple(token_shape)
    dtype = NUMPY_DTYPES[TOKEN_DTYPES[token_dtype]]
    tokens = np.full((len(results), *shape), -1 if np.issubdtype(dtype, np.integer) else np.nan, dtype=dtype)
    for row, result in enumerate(results):
        if result.tokens is not None:
            tokens[row] = np.asarray(result.tokens, dtype=dtype).reshape(shape)

    def column(values: list[bytes]) -> np.ndarray:
        array = np.empty((len(values), 1), dtype=object)
        for row, item in enumerate(values):
            array[row, 0] = item
        return array

    return {
        "image": column([r.png for r in results]),
        "tokens": tokens,
        "stats": column([json.dumps(r.stats or {}).encode() for r in results]),
        "error": column([r.error.encode() for r in results]),
    }
