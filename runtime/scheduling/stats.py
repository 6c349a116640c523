"""What a scheduler reports for metrics: queue depth, slot occupancy, images, tokens, accepted
lengths and a latency histogram.

Counters only grow (Prometheus counters: a scraper takes rates); `queued` and `running` are
gauges of the moment. Latencies are seconds from submit to delivery of a finished image, in
cumulative buckets as Prometheus histograms keep them.
"""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field, replace

# seconds; the last bucket (+Inf) is implicit, as in Prometheus
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)


@dataclass
class SchedulerStats:
    """A snapshot of a scheduler (Scheduler.stats()).

    queued: requests waiting for a slot; running: slots holding a request; slots: the slot count.
    submitted / refused (QueueFull) / completed / failed (a SpecrtError from generate) /
    cancelled / expired (DeadlineExceeded) / closed (SchedulerClosed): requests by how they ended.
    rounds: batch rounds run (each open batch's counted); slot_rounds: the running batch's occupied
    slots summed over rounds (slot_rounds / (rounds · slots) is the mean occupancy). `running`:
    images in every open batch (up to groups x slots). tokens and target_forwards of completed images
    (tokens / target_forwards is the mean accepted length); accepted_lengths: tokens a target
    forward produced -> how often. latency_counts[i]: completed images whose latency was at most
    LATENCY_BUCKETS[i] (cumulative; the last entry counts all), latency_sum their seconds."""

    slots: int
    queued: int = 0
    running: int = 0
    submitted: int = 0
    refused: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0
    closed: int = 0
    rounds: int = 0
    slot_rounds: int = 0
    tokens: int = 0
    target_forwards: int = 0
    accepted_lengths: Counter = field(default_factory=Counter)
    latency_buckets: tuple[float, ...] = LATENCY_BUCKETS
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def occupancy(self) -> float:
        """Mean share of the slots occupied over the rounds run so far."""
        return self.slot_rounds / (self.rounds * self.slots) if self.rounds else 0.0

    def record_latency(self, seconds: float) -> None:
        """One completed image's latency into the cumulative buckets."""
        first = bisect.bisect_left(self.latency_buckets, seconds)
        for i in range(first, len(self.latency_counts)):
            self.latency_counts[i] += 1
        self.latency_sum += seconds

    def copy(self) -> "SchedulerStats":
        return replace(self, accepted_lengths=Counter(self.accepted_lengths), latency_counts=list(self.latency_counts))
