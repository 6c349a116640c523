"""Calling a specrt Triton model from Python (tritonclient, HTTP or gRPC).

    with Client("127.0.0.1:8001", protocol="grpc") as client:
        image = client.generate(class_id=3, method="sjd", seed=1, window=16)
        open("three.png", "wb").write(image.png); print(image.stats["accepted_length"])

A row the server could not serve raises SpecrtError with the server's one-line reason.
Any Triton client in any language works the same way: docs/contracts.md, "Serving".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.serving.protocol import NUMPY_DTYPES, OUTPUTS


@dataclass
class ServedImage:
    """One served image: PNG bytes (b'' with tokens_only), tokens [grid*grid] and the call's stats."""

    png: bytes
    tokens: np.ndarray
    stats: dict


class Client:
    """One connection to a specrt model; `timeout_s` bounds every call (connect and infer)."""

    def __init__(self, url: str = "127.0.0.1:8000", protocol: str = "http", model: str = "specrt",
                 timeout_s: float = 60.0):
        if protocol not in ("http", "grpc"):
            raise SpecrtError(f"protocol must be http or grpc, got {protocol!r}")
        self.protocol, self.model, self.timeout_s = protocol, model, timeout_s
        self._lib = require(f"tritonclient.{protocol}", "the specrt Triton client")
        if protocol == "http":
            self._client = self._lib.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)
        else:
            self._client = self._lib.InferenceServerClient(url)

    def generate(self, class_id: Optional[int] = None, prompt: Optional[str] = None, method: str = "ar",
                 seed: int = 0, tokens_only: bool = False, **params: Any) -> ServedImage:
        """One image; `params` are method parameters and sampling keys, as Pipeline.generate takes."""
        values = {"class_id": class_id, "prompt": prompt, "method": method, "seed": seed,
                  "params": json.dumps(params) if params else None, "tokens_only": tokens_only}
        inputs = []
        for name, value in values.items():
            if value is None:
                continue
            dtype = {"class_id": "INT64", "seed": "UINT64", "tokens_only": "BOOL"}.get(name, "BYTES")
            array = np.array([[value.encode() if isinstance(value, str) else value]], dtype=NUMPY_DTYPES[dtype])
            tensor = self._lib.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        outputs = [self._lib.InferRequestedOutput(spec.name) for spec in OUTPUTS
                   if not (tokens_only and spec.name == "image")]
        extra = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        result = self._client.infer(self.model, inputs, outputs=outputs, **extra)
        error = bytes(result.as_numpy("error")[0, 0]).decode()
        if error:
            raise SpecrtError(error)
        png = b"" if tokens_only else bytes(result.as_numpy("image")[0, 0])
        return ServedImage(png, result.as_numpy("tokens")[0], json.loads(bytes(result.as_numpy("stats")[0, 0])))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
