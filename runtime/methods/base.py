"""What every decoding method shares: the decoding context, CFG rows, and parameter parsing.

A method is a small strategy object: `generate(ctx, conditions)` returns image tokens
[N, grid²]. It calls the runners (target, draft) and runtime.verification; it owns no buffers.
What the images are conditioned on (class ids or captions, runtime.conditions) passes through
the decoding context untouched: methods only count it and hand it to Decoding.prefill.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.conditions import Conditions, as_conditions
from specrt.runtime.runner import ModelRunner, StepOutput
from specrt.runtime.sampling import SamplingParams, inverse_cdf, needs_restriction, restrict
from specrt.runtime.stats import Stats
from specrt.runtime.window import Window
from specrt.validation import Param


@dataclass
class Decoding:
    """The models, sampling distribution, random stream and counters of one generate call."""

    target: ModelRunner
    draft: Optional[ModelRunner]
    sampling: SamplingParams
    rng: np.random.Generator
    stats: Stats

    def condition_rows(self, conditions: Conditions) -> Conditions:
        """Model batch for these images: [cond; uncond] when CFG is on (null class, or the
        uncond caption flag), the images' own conditions otherwise."""
        conditions = as_conditions(conditions)
        return conditions.with_uncond(self.target.spec.null_class) if self.sampling.uses_cfg else conditions

    def prefill(self, runner: ModelRunner, conditions: Conditions) -> StepOutput:
        """The condition rows of these images through `runner`: image token 0's rows and draws."""
        uniforms = self.rng.random((runner.images, 1))
        return self._restricted(runner.prefill(self.condition_rows(conditions), uniforms), uniforms)

    def run(self, runner: ModelRunner, window: Window, row_ids: np.ndarray | None = None) -> StepOutput:
        """One step of `runner` over `window`: the sampling distribution of every slot (P and Q
        alike) and one draw per slot, made on the device with uniforms from this call's stream."""
        uniforms = self.rng.random((runner.images, len(window)))
        return self._restricted(runner.step(window, uniforms, row_ids), uniforms)

    def _restricted(self, out: StepOutput, uniforms: np.ndarray) -> StepOutput:
        """Greedy, top-k and top-p act on the host (sampling.restrict): they need whole rows, and
        the draws are redone on the restricted rows with the same uniforms."""
        if not needs_restriction(self.sampling):
            return out
        with self.stats.timing("verification"):
            probs = restrict(np.asarray(out.probs), self.sampling)
            return StepOutput(probs, inverse_cdf(probs, uniforms))

    @property
    def num_image_tokens(self) -> int:
        return self.target.spec.num_image_tokens


class Method(ABC):
    """A decoding strategy. PARAMS maps each accepted parameter to its specrt.validation.Param
    (default, type and allowed range), so every method parameter is checked in one place."""

    name: ClassVar[str]
    needs_draft: ClassVar[bool] = False
    PARAMS: ClassVar[dict[str, Param]] = {}

    def __init__(self, **params: Any):
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            known = ", ".join(sorted(self.PARAMS)) or "none"
            raise SpecrtError(f"method {self.name!r} has no parameter {', '.join(unknown)} (known: {known})")
        for key, spec in self.PARAMS.items():
            setattr(self, key, spec.parse(f"{self.name} {key}", params.get(key, spec.default)))
        self.validate()

    def validate(self) -> None:
        """Raise SpecrtError for combinations of parameters that make no sense (single values
        are already checked against their PARAMS range)."""

    @property
    def max_window(self) -> int:
        """The largest step window this method feeds the target (checked against the bundle)."""
        return 1

    @abstractmethod
    def generate(self, ctx: Decoding, conditions: Conditions) -> np.ndarray:
        """Image tokens [N, grid²] for these images' conditions."""


class OneImageAtATime(Method):
    """Speculative methods decode one image (and its CFG pair) per pass; this loops over images."""

    def generate(self, ctx: Decoding, conditions: Conditions) -> np.ndarray:
        conditions = as_conditions(conditions)
        return np.stack([self.generate_one(ctx, conditions.image(i)) for i in range(len(conditions))])

    @abstractmethod
    def generate_one(self, ctx: Decoding, condition: Conditions) -> np.ndarray:
        """Tokens [grid²] of one image."""

    def start(self, ctx: Decoding, runner: ModelRunner, condition: Conditions) -> StepOutput:
        """Reset `runner` to an empty cache and prefill; image token 0's row and draw ([1, 1, V], [1, 1])."""
        runner.truncate(0)
        return ctx.prefill(runner, condition)
