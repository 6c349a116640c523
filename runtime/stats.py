"""What a generate call reports: token and forward counts, accepted lengths, a time breakdown.

Forward and cache times come from the runners' own counters; verification/sampling time is
measured by the methods around their sampling and acceptance code; VQ decode by the pipeline.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass
class Stats:
    """Per generate call. `accepted_lengths` holds tokens produced per target forward (prefill included).

    Forwards count per image: a batched step that runs 8 images counts 8 (so tokens per
    forward is the accepted length whatever the batch); `target_calls` and `draft_calls` count
    graph runs (a draft chain runs its L draft passes in one call: runtime/chain.py)."""

    tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    accepted_lengths: Counter = field(default_factory=Counter)
    seconds: dict = field(default_factory=lambda: dict.fromkeys(
        ("target_forward", "draft_forward", "verification", "cache", "vq_decode", "total"), 0.0))
    host_numbers: Optional[int] = None  # read back from the device (4 bytes each); None: backend does not meter
    host_syncs: Optional[int] = None  # transfers that waited for the device (reads back, index copies to it)
    theorem2_accepted_length: list = field(default_factory=list)
    theorem2_tv_bound: list = field(default_factory=list)

    _timing_now: set = field(default_factory=set, repr=False, compare=False)

    def timing(self, part: str) -> "_Timing":
        """A context manager that adds the block's time to seconds[part]; a block nested in one of
        the same part (a sample drawn inside verification) is already being timed and must not be
        counted twice. A small class, not a generator: it runs once per speculative round."""
        return _Timing(self, part)

    def add(self, other: "Stats") -> None:
        """Fold another call's counters and times into these (a pipeline's chunks of one call)."""
        self.tokens += other.tokens
        self.target_forwards += other.target_forwards
        self.draft_forwards += other.draft_forwards
        self.target_calls += other.target_calls
        self.draft_calls += other.draft_calls
        self.accepted_lengths.update(other.accepted_lengths)
        for part, seconds in other.seconds.items():
            self.seconds[part] = self.seconds.get(part, 0.0) + seconds
        if other.host_numbers is not None:
            self.host_numbers = (self.host_numbers or 0) + other.host_numbers
        if other.host_syncs is not None:
            self.host_syncs = (self.host_syncs or 0) + other.host_syncs
        self.theorem2_accepted_length += other.theorem2_accepted_length
        self.theorem2_tv_bound += other.theorem2_tv_bound

    def record_round(self, produced: int, images: int = 1) -> None:
        """One target forward produced `produced` tokens (its accepted length) for each of `images`."""
        self.accepted_lengths[produced] += images

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target forward (the paper's 'step compression' / accepted length)."""
        return self.tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def overhead_share(self) -> float:
        """Share of the total time spent outside model forwards and VQ decode."""
        total = self.seconds["total"]
        forward = self.seconds["target_forward"] + self.seconds["draft_forward"] + self.seconds["vq_decode"]
        return (total - forward) / total if total else 0.0

    def as_dict(self) -> dict:
        """Flat numbers for the C API (runtime/embedding.py STATS_FIELDS)."""
        s = self.seconds
        return {"tokens": self.tokens, "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
                "mean_accepted_length": self.mean_accepted_length, "seconds_total": s["total"],
                "seconds_target": s["target_forward"], "seconds_draft": s["draft_forward"],
                "seconds_verify": s["verification"], "seconds_cache": s["cache"], "seconds_decode": s["vq_decode"]}

    def summary(self) -> dict:
        """JSON-ready numbers (bench and the CLI print these)."""
        out = {
            "tokens": self.tokens,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "accepted_length_histogram": {int(k): int(v) for k, v in sorted(self.accepted_lengths.items())},
            "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
            "overhead_share": round(self.overhead_share, 4),
            "host_bytes": None if self.host_numbers is None else 4 * self.host_numbers,
            "host_syncs": self.host_syncs,
        }
        if self.theorem2_accepted_length:
            out["theorem2_expected_accepted_length"] = float(np.mean(self.theorem2_accepted_length))
            out["theorem2_tv_bound_per_round"] = float(np.nanmean(self.theorem2_tv_bound)) \
                if not np.all(np.isnan(self.theorem2_tv_bound)) else None
        return out


class _Timing:
    """Stats.timing's context manager."""

    __slots__ = ("stats", "part", "start")

    def __init__(self, stats: Stats, part: str):
        self.stats, self.part, self.start = stats, part, None

    def __enter__(self) -> None:
        if self.part not in self.stats._timing_now:
            self.stats._timing_now.add(self.part)
            self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.start is not None:
            self.stats.seconds[self.part] += time.perf_counter() - self.start
            self.stats._timing_now.discard(self.part)
