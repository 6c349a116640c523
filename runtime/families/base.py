"""The interface every model family implements (runtime/families/__init__.py registers them).

A family is what a bundle's manifest names: how its graphs are opened into a pipeline on a
backend, which methods it offers, what a generate call is conditioned on and gives back (VQ
codes or continuous latents), and how `specrt inspect` describes it. The pipelines share one
calling convention — `generate(class_ids, method=..., seed=..., decode=..., **sampling_and_params)`
returning a result with `tokens`, `images` (None when not decoded) and `stats` — so serving, the
C API and the CLI need nothing family-specific beyond what this interface says.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar


class Family(ABC):
    """One model family's plug-in."""

    name: ClassVar[str]                  # the manifest's "family"
    methods: ClassVar[tuple[str, ...]]   # what generate(method=...) accepts
    token_dtype: ClassVar[str]           # "int64" (VQ codes) or "float32" (continuous latents)
    backends: ClassVar[tuple[str, ...]]  # what open(backend=...) accepts

    @abstractmethod
    def open(self, path: Path, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
        """The family's pipeline over the bundle at `path` (its manifest checked first, one line if not)."""

    @abstractmethod
    def describe(self, path: Path) -> str:
        """The manifest as a human reads it, after the family's own checks of the bundle (inspect)."""

    def conditions(self, pipeline: Any) -> str:
        """What generate is conditioned on: "class ids" or "prompts" (serving and the C API ask)."""
        return "class ids"

    def has_decoder(self, pipeline: Any) -> bool:
        """True when generate(decode=True) gives images (else tokens only)."""
        return True
