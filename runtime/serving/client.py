"""Calling a specrt Triton model from Python (tritonclient, HTTP or gRPC).

    with Client("127.0.0.1:8001", protocol="grpc") as client:
        image = client.generate(class_id=3, method="sjd", seed=1, window=16)
        open("three.png", "wb").write(image.png); print(image.stats["accepted_length"])
        # a continuous bundle: method="cspd", draft_len=4; image.tokens float32 [seq_len, C]

A row the server could not serve raises SpecrtError with the server's one-line reason; so
does a request the server refuses (HTTP 503 / gRPC UNAVAILABLE: its queue is full, it is
shutting down) and a request the server cannot take at all (nothing listening yet, a model name it does not
serve, a timeout), in one line naming the URL and the model instead of tritonclient's exception.
Any Triton client in any language works the same way: docs/contracts.md, "Serving".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.serving.protocol import INPUTS, NUMPY_DTYPES, OUTPUTS

INPUT_TYPES = {spec.name: spec.dtype for spec in INPUTS}  # each input's Triton type, as the model declares it
# what an in-flight server (and Triton's queue policy) answers when it will not take a request now
REFUSALS = ("the queue is full", "Exceeds maximum queue size", "the server is shutting down",
            "the server shut down before")


def request_inputs(lib: Any, values: dict[str, Any]) -> list:
    """One request row's inputs for tritonclient module `lib` (http, grpc or grpc.aio): each value
    not None as a [1, 1] tensor of the type the model declares (INPUT_TYPES), text as UTF-8 bytes."""
    inputs = []
    for name, value in values.items():
        if value is None:
            continue
        dtype = INPUT_TYPES[name]
        array = np.array([[value.encode() if isinstance(value, str) else value]], dtype=NUMPY_DTYPES[dtype])
        tensor = lib.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@dataclass
class ServedImage:
    """One served image: PNG bytes (b'' with tokens_only or from a model without a decoder), its
    tokens (int64 [grid*grid] VQ codes, or float32 [seq_len, C] continuous latents) and the call's stats."""

    png: bytes
    tokens: np.ndarray
    stats: dict


class Client:
    """One connection to a specrt model; `timeout_s` bounds every call (connect and infer) and is each
    request's deadline on the server, so an image this client gave up on stops taking a slot."""

    def __init__(self, url: str = "127.0.0.1:8000", protocol: str = "http", model: str = "specrt",
                 timeout_s: float = 60.0):
        if protocol not in ("http", "grpc"):
            raise SpecrtError(f"protocol must be http or grpc, got {protocol!r}")
        self.url, self.protocol, self.model, self.timeout_s = url, protocol, model, timeout_s
        self._lib = require(f"tritonclient.{protocol}", "the specrt Triton client")
        if protocol == "http":
            self._client = self._lib.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)
        else:
            self._client = self._lib.InferenceServerClient(url)

    def generate(self, class_id: Optional[int] = None, prompt: Optional[str] = None, method: str = "ar",
                 seed: int = 0, tokens_only: bool = False, negative_prompt: Optional[str] = None,
                 prompt_suffix: Optional[bool] = None, **params: Any) -> ServedImage:
        """One image; `params` are method parameters and sampling keys, as Pipeline.generate takes;
        `negative_prompt` / `prompt_suffix` (unified-vocabulary models) as UnifiedPipeline.generate's."""
        values = {"class_id": class_id, "prompt": prompt, "method": method, "seed": seed,
                  "params": json.dumps(params) if params else None, "tokens_only": tokens_only,
                  "negative_prompt": negative_prompt, "prompt_suffix": prompt_suffix}
        inputs = request_inputs(self._lib, values)
        outputs = [self._lib.InferRequestedOutput(spec.name) for spec in OUTPUTS
                   if not (tokens_only and spec.name == "image")]
        # the server hears when a gRPC client gives up (cancellation) but not when an HTTP client closes its
        # connection (Triton 2.51 does not report it): over HTTP the client's timeout goes with the request
        # as its own deadline (KServe v2 `timeout`, microseconds), so the server ends the image then too
        extra = ({"client_timeout": self.timeout_s} if self.protocol == "grpc"
                 else {"timeout": max(1, int(self.timeout_s * 1e6))})
        try:
            result = self._client.infer(self.model, inputs, outputs=outputs, **extra)
        except Exception as exc:  # tritonclient's, gevent's and socket errors: the request never got an answer
            raise SpecrtError(self._unanswered(exc)) from exc
        error = bytes(result.as_numpy("error")[0, 0]).decode()
        if error:
            raise SpecrtError(error)
        png = b"" if tokens_only else bytes(result.as_numpy("image")[0, 0])
        return ServedImage(png, result.as_numpy("tokens")[0], json.loads(bytes(result.as_numpy("stats")[0, 0])))

    def _unanswered(self, exc: Exception) -> str:
        """One line for a request Triton did not answer with a row: why, and what to check."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        where = f"{self.protocol} {self.url}"
        if any(reason in text for reason in REFUSALS):  # the server is up and said no: HTTP 503 / UNAVAILABLE
            return f"{where}, model {self.model!r} refused the request: {text[:240]}"
        if "unknown model" in text.lower() or ("not found" in text.lower() and self.model in text):
            return (f"{where} serves no model {self.model!r} (or not yet: `specrt serve` prints 'ready' once it "
                    f"does); the name is specrt serve's --model-name, 'specrt' by default")
        if isinstance(exc, (ConnectionError, OSError)) or any(
                word in text.lower() for word in ("connect", "unavailable", "refused", "reset")):
            return (f"no Triton server answers at {where} ({text[:160]}); start one with `specrt serve` and wait for "
                    f"its 'ready' line")
        return f"{where}, model {self.model!r}: the request failed: {text[:240]}"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
