"""What every decoding method shares: the strategy interface with its parameter parsing, and the
batch of images still being decoded.

A method is a small strategy object: `generate(ctx, conditions)` returns image tokens
[N, grid²] for the whole batch, decoded in one pass: every model call runs all unfinished
images, each with its own window, committed length and counter uniforms (ragged acceptance),
and the host verifies each image on its own. It calls the runners (target, draft) through the
decoding context (runtime.decoding) and runtime.verification; it owns no buffers.
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.conditions import Conditions
from specrt.runtime.decoding import Decoding
from specrt.validation import Param


class Method(ABC):
    """A decoding strategy. PARAMS maps each accepted parameter to its specrt.validation.Param
    (default, type and allowed range), so every method parameter is checked in one place."""

    name: ClassVar[str]
    needs_draft: ClassVar[bool] = False
    PARAMS: ClassVar[dict[str, Param]] = {}
    # What `--method auto` may choose (runtime/choosing). `lossless`: every setting samples the
    # target's own distribution, so auto tries it without --relaxed. `auto_settings`: the parameter
    # settings auto measures (each a dict of PARAMS keys; () = auto never tries the method). Neither
    # is inherited: a subclass that changes the acceptance test (a relaxed rule over an exact
    # method's loop) would otherwise inherit its parent's claim, so each class says it itself.
    lossless: ClassVar[bool] = False
    auto_settings: ClassVar[tuple[dict[str, Any], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "lossless" not in cls.__dict__:
            cls.lossless = False
        if "auto_settings" not in cls.__dict__:
            cls.auto_settings = ()

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


def settings_grid(*fixed: dict[str, Any], **axes: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    """Every combination of `axes`' values as parameter dicts, after the `fixed` settings:
    settings_grid({"tree": "static"}, draft_len=(1, 2)) -> ({"tree": "static"}, {"draft_len": 1},
    {"draft_len": 2}). How methods write their auto_settings."""
    keys = list(axes)
    crossed = tuple(dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))) if keys else ()
    return tuple(dict(f) for f in fixed) + crossed


class Batched:
    """Which images of a generate call are still being decoded, and when finished ones leave.

    Methods keep per-image state indexed by image (0..N−1); the runners' batch holds the
    unfinished images, `images[p]` at batch position p. Finished images leave as soon as they
    finish, or, where a shrink costs more (a runner's `retain_share`: CUDA graphs are
    re-captured), in groups once that share of the batch has finished; until then a finished
    image rides along with an empty window (pad slots only).
    """

    def __init__(self, count: int):
        self.images = list(range(count))

    def positions(self) -> range:
        return range(len(self.images))

    def drop(self, ctx: Decoding, finished: Sequence[bool], drafter: Any = None) -> bool:
        """Remove the finished images (finished[image]) when enough have, from the runners, the
        streams and the `drafter`'s per-image state (runtime.drafter.Drafter.retain); False once
        none is left."""
        done = [p for p, image in enumerate(self.images) if finished[image]]
        if len(done) == len(self.images):
            return False
        runners = [r for r in (ctx.target, ctx.draft) if r is not None]
        if done and len(done) >= max(r.retain_share for r in runners) * len(self.images):
            keep = [p for p, image in enumerate(self.images) if not finished[image]]
            ctx.retain(keep)
            if drafter is not None:
                drafter.retain(keep)
            self.images = [self.images[p] for p in keep]
        return True
