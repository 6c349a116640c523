"""Decoding methods by name: ar, sd, cool-sd, lantern, sjd, sjd-pac."""
from __future__ import annotations

from typing import Any

from specrt.errors import SpecrtError
from specrt.runtime.methods.ar import Autoregressive
from specrt.runtime.methods.base import Decoding, Method
from specrt.runtime.methods.jacobi import SJDPAC, JacobiDecoding
from specrt.runtime.methods.speculative import CoolSD, Lantern, SpeculativeDecoding

METHODS: dict[str, type[Method]] = {
    cls.name: cls for cls in (Autoregressive, SpeculativeDecoding, CoolSD, Lantern, JacobiDecoding, SJDPAC)
}

# The largest target window any method feeds at its default parameters: SJD-PAC's L = 64 verified
# tokens plus the pending one. Bundles and the PyTorch backend default to it, so every method runs
# with its defaults on a default export.
DEFAULT_MAX_WINDOW = max(cls().max_window for cls in METHODS.values())


def make_method(name: str, **params: Any) -> Method:
    """The strategy object for `name` with its parameters checked (SpecrtError on mistakes)."""
    if not isinstance(name, str) or name not in METHODS:
        raise SpecrtError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name](**params)


__all__ = ["DEFAULT_MAX_WINDOW", "METHODS", "Decoding", "Method", "make_method"]
