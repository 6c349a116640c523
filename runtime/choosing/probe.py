"""Measure the cost model's terms for each candidate on the user's own pipeline, through generate.

Two passes (choose.py): every candidate decodes the same SCREEN_IMAGES images, then ar and the
CONFIRMED best by the cost model decode CONFIRM_IMAGES more, so most of the time goes where the
choice is decided. A pass makes generate calls of `batch` images (the conditions cycling, image i
of call c seeded PROBE_SEED + c · batch + i), round-robin in a fresh random order each round, so a
busy phase of a shared machine falls on all candidates alike; a candidate's first call warms it
up (first-touch buffers, a round's capture) and counts for its accepted length, not its time. From each call (the family's call_stats and serving_stats, so every family
measures the same way):

- accepted length τ: tokens per target forward over all the candidate's images (exact counts);
- straggle s: target graph runs × batch / target forwards (1 at batch 1, ar 1 always);
- a round's seconds, split as the formula prices it: the target step t(W) (its graph seconds per
  target run), the draft's work per round (n_draft · t_draft: draft graph seconds per target run),
  and the host work between the calls (the call's wall time less both, per target run), all three
  from the call whose round was fastest: other processes only ever add time. (Not each part's own
  fastest call: on a busy machine the sum of three separate minima undercuts every real round, the
  more so the more parts a round has, and a drafted setting looked 1.5x faster than it ran.)

A family whose stats have no per-part seconds (the continuous family) charges the whole wall time
to the target step: the same for ar and its speculative method, so their ratio stays the measured
one. A candidate that cannot run here (its window beyond the bundle's, a sampling filter its fused
draft refuses) is kept with the one line generate gave, and not chosen.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.choosing.candidates import Candidate

PROBE_SEED = 2_000_003  # not the bench's seeds (0, 1, ...): auto is judged on images it was not measured on
SCREEN_IMAGES = 4  # images per candidate in the first pass (the first call of each warms up, untimed)
CONFIRM_IMAGES = 8  # more images for the few best and ar in the second pass
CONFIRMED = 6  # candidates besides ar that the second pass measures again


def probe_calls(batch: int, images: int) -> int:
    """Generate calls for `images` images at `batch` a call, at least two (a fastest-of needs a
    timed call after the warm-up)."""
    return max(2, math.ceil(images / batch))


@dataclass
class Measured:
    """One candidate's measured terms (seconds per round; see the module docstring) and the
    counts they come from."""

    candidate: Candidate
    target_s: float = math.inf
    draft_s: float = math.inf
    host_s: float = math.inf
    tokens: int = 0
    forwards: int = 0
    passes: int = 0
    images: int = 0
    calls: int = 0
    error: Optional[str] = None  # why it cannot run here (then it is not chosen)

    @property
    def accepted_length(self) -> float:
        """τ: tokens per target forward over every image measured."""
        return self.tokens / self.forwards if self.forwards else 0.0

    @property
    def straggle(self) -> float:
        """s: target graph runs × batch / target forwards (images per call = images / calls)."""
        if not self.forwards or not self.calls:
            return 1.0
        return max(1.0, self.passes * (self.images / self.calls) / self.forwards)

    @property
    def timed(self) -> bool:
        return math.isfinite(self.target_s)

    @property
    def round_s(self) -> float:
        """A round's cost as the formula prices it: t(W) + n_draft · t_draft + host."""
        return self.target_s + self.draft_s + self.host_s

    def add(self, tokens: int, forwards: int, passes: int, images: int, seconds: Optional[tuple[float, float, float]]):
        """One call's counts, and its seconds per round (target, draft, host) unless it was a warm-up."""
        self.tokens, self.forwards, self.passes = self.tokens + tokens, self.forwards + forwards, self.passes + passes
        self.images, self.calls = self.images + images, self.calls + 1
        if seconds is not None and sum(seconds) < self.round_s:  # the fastest call's round, its parts together
            self.target_s, self.draft_s, self.host_s = seconds

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (seconds never measured are None)."""
        finite = lambda value: value if math.isfinite(value) else None  # noqa: E731
        return {"method": self.candidate.method, "params": self.candidate.params, "label": self.candidate.label,
                "accepted_length": self.accepted_length, "straggle": self.straggle, "target_s": finite(self.target_s),
                "draft_s": finite(self.draft_s), "host_s": finite(self.host_s), "images": self.images,
                "error": self.error}


def conditions_for(conditions: Mapping[str, Any], start: int, count: int) -> dict[str, Any]:
    """generate's condition keyword for `count` images from row `start` on, the rows cycling:
    `conditions` holds one keyword (class_ids or prompts: a list; captions: a tuple of row arrays)."""
    (key, rows), = conditions.items()
    if isinstance(rows, tuple):  # (embeddings, mask or None): rows of arrays
        total = len(rows[0])
        picked = [(start + i) % total for i in range(count)]
        return {key: tuple(None if part is None else np.asarray(part)[picked] for part in rows)}
    rows = list(rows)
    if not rows:
        raise SpecrtError("--method auto needs a condition to measure with (a class id or a prompt)")
    return {key: [rows[(start + i) % len(rows)] for i in range(count)]}


def call_costs(family: Any, result: Any, wall_s: float) -> tuple[int, int, int, float, float]:
    """(tokens, target forwards, target graph runs, target seconds, draft seconds) of one call,
    in the names every family shares; without per-part seconds, the wall time is the target's."""
    shared, serving = family.call_stats(result), family.serving_stats(result)
    tokens, forwards = int(shared["tokens"]), int(shared["target_forwards"])
    passes = int(serving.get("target_passes") or forwards)
    if "seconds_target" not in shared:
        return tokens, forwards, passes, wall_s, 0.0
    return tokens, forwards, passes, float(shared["seconds_target"]), float(shared.get("seconds_draft", 0.0))


def measure(pipe: Any, family: Any, measured: Sequence[Measured], batch: int, conditions: Mapping[str, Any],
            sampling: Optional[Mapping[str, Any]] = None, calls: int = 2, first_call: int = 0,
            progress: Optional[Callable[[str], None]] = None) -> None:
    """`calls` more generate calls of `batch` images for each candidate in `measured` that can run,
    round-robin in a fresh random order each round; image seeds and conditions continue from call
    `first_call`. A candidate's first call ever is its warm-up: counted, not timed. A candidate
    generate refuses keeps the refusal as its `error` and is measured no further."""
    sampling = dict(sampling or {})
    order = np.random.default_rng(PROBE_SEED + first_call)
    for call in range(first_call, first_call + calls):
        for index in order.permutation(len(measured)):
            entry = measured[int(index)]
            if entry.error is not None:
                continue
            seeds = [PROBE_SEED + call * batch + i for i in range(batch)]
            feeds = conditions_for(conditions, call * batch, batch)
            began = time.perf_counter()
            try:
                result = pipe.generate(**feeds, method=entry.candidate.method, seed=seeds, decode=False, **sampling,
                                       **entry.candidate.params)
            except SpecrtError as exc:
                entry.error = str(exc)
                continue
            wall = time.perf_counter() - began
            tokens, forwards, passes, target, draft = call_costs(family, result, wall)
            rounds = max(passes, 1)
            seconds = (target / rounds, draft / rounds, max(wall - target - draft, 0.0) / rounds) if entry.calls else None
            entry.add(tokens, forwards, passes, batch, seconds)
        if progress:
            progress(f"auto: call {call - first_call + 1}/{calls} of {sum(e.error is None for e in measured)} settings "
                     f"done")
