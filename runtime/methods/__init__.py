"""Decoding methods by name: ar, sd, cool-sd, lantern, sjd, sjd-pac, gsd."""
from __future__ import annotations

from typing import Any

from specrt.errors import SpecrtError
from specrt.runtime.methods.ar import Autoregressive
from specrt.runtime.methods.base import Method
from specrt.runtime.methods.grouped import GroupedDecoding
from specrt.runtime.methods.jacobi import SJDPAC, JacobiDecoding
from specrt.runtime.methods.speculative import CoolSD, Lantern, SpeculativeDecoding

METHODS: dict[str, type[Method]] = {
    cls.name: cls for cls in (Autoregressive, SpeculativeDecoding, CoolSD, Lantern, JacobiDecoding, SJDPAC,
                           GroupedDecoding)
}

# The largest target window any method feeds at its default parameters: SJD-PAC's L = 64 verified
# tokens plus the pending one. Bundles and the PyTorch backend default to it, so every method runs
# with its defaults on a default export.
DEFAULT_MAX_WINDOW = max(cls().max_window for cls in METHODS.values())


def checked_max_window(max_window: int, tokens: int, flag: str = "--max-window") -> int:
    """`max_window` if a model whose images have `tokens` tokens can use it, else one line.

    Why a bound: no method's window is longer than an image's tokens plus the pending one, and the
    runners allocate their step inputs for the largest window (a mask of batch · W · (capacity + W)):
    --max-window 100000 asked for 37 GiB. The default always passes, so every method runs with its
    defaults on any model; export and the PyTorch backend apply the same rule."""
    longest = max(tokens + 1, DEFAULT_MAX_WINDOW)
    if max_window > longest:
        raise SpecrtError(f"{flag} {max_window}: this model's images have {tokens} tokens, so no window is longer "
                          f"than {tokens + 1}; give at most {longest}")
    return max_window


def make_method(name: str, **params: Any) -> Method:
    """The strategy object for `name` with its parameters checked (SpecrtError on mistakes)."""
    if not isinstance(name, str) or name not in METHODS:
        from specrt.runtime.family_registry import where_method_runs

        raise SpecrtError(f"unknown method {name!r} for this model; choose one of {', '.join(METHODS)}"
                          + where_method_runs(name, "llamagen"))
    return METHODS[name](**params)


__all__ = ["DEFAULT_MAX_WINDOW", "METHODS", "Method", "checked_max_window", "make_method"]
