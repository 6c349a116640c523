"""What every decoding method shares: the decoding context, CFG rows, and parameter parsing.

A method is a small strategy object: `generate(ctx, class_ids)` returns image tokens
[N, grid²]. It calls the runners (target, draft) and runtime.verification; it owns no buffers.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.runner import ModelRunner
from specrt.runtime.sampling import SamplingParams, sample, target_probabilities
from specrt.runtime.stats import Stats


@dataclass
class Decoding:
    """The models, sampling distribution, random stream and counters of one generate call."""

    target: ModelRunner
    draft: Optional[ModelRunner]
    sampling: SamplingParams
    rng: np.random.Generator
    stats: Stats

    def condition_rows(self, class_ids: np.ndarray) -> np.ndarray:
        """Model batch for these images: [cond; uncond] with the null class when CFG is on."""
        class_ids = np.asarray(class_ids, dtype=np.int32)
        if not self.sampling.uses_cfg:
            return class_ids
        return np.concatenate([class_ids, np.full_like(class_ids, self.target.spec.null_class)])

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Raw logits [rows, W, V] -> the sampling distribution [images, W, V] (P and Q alike)."""
        with self.stats.timing("verification"):
            return target_probabilities(logits, self.sampling)

    def sample(self, probs: np.ndarray) -> np.ndarray:
        with self.stats.timing("verification"):
            return sample(probs, self.rng)

    @property
    def num_image_tokens(self) -> int:
        return self.target.spec.num_image_tokens


class Method(ABC):
    """A decoding strategy. PARAMS maps each accepted parameter to (type, default)."""

    name: ClassVar[str]
    needs_draft: ClassVar[bool] = False
    PARAMS: ClassVar[dict[str, tuple[type, Any]]] = {}

    def __init__(self, **params: Any):
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            known = ", ".join(sorted(self.PARAMS)) or "none"
            raise SpecrtError(f"method {self.name!r} has no parameter {', '.join(unknown)} (known: {known})")
        for key, (kind, default) in self.PARAMS.items():
            value = params.get(key, default)
            try:
                value = _coerce(kind, value) if value is not None else None
            except ValueError as exc:
                raise SpecrtError(f"method {self.name!r}: parameter {key}={params[key]!r} is not a {kind.__name__}") from exc
            setattr(self, key, value)
        self.validate()

    def validate(self) -> None:
        """Raise SpecrtError for parameter values that make no sense."""

    @property
    def max_window(self) -> int:
        """The largest step window this method feeds the target (checked against the bundle)."""
        return 1

    @abstractmethod
    def generate(self, ctx: Decoding, class_ids: np.ndarray) -> np.ndarray:
        """Image tokens [N, grid²] for these class ids."""


def _coerce(kind: type, value: Any) -> Any:
    if kind is bool and isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(value)
    return kind(value)


class OneImageAtATime(Method):
    """Speculative methods decode one image (and its CFG pair) per pass; this loops over images."""

    def generate(self, ctx: Decoding, class_ids: np.ndarray) -> np.ndarray:
        return np.stack([self.generate_one(ctx, int(cls)) for cls in class_ids])

    @abstractmethod
    def generate_one(self, ctx: Decoding, class_id: int) -> np.ndarray:
        """Tokens [grid²] of one image."""

    def start(self, ctx: Decoding, runner: ModelRunner, class_id: int) -> np.ndarray:
        """Reset `runner` to an empty cache and prefill; returns the distribution of image token 0 [V]."""
        runner.truncate(0)
        return ctx.probabilities(runner.prefill(ctx.condition_rows(np.array([class_id]))))[0, 0]
