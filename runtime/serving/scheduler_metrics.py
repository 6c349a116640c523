"""A scheduler's numbers as Triton custom metrics (Prometheus text on Triton's metrics port, /metrics).

Triton's Python backend registers metric families with the server (`pb_utils.MetricFamily`), so
they appear beside Triton's own `nv_inference_*` lines. Every metric carries the label
model="<model name>":

    specrt_queue_depth                      gauge      requests waiting for a slot
    specrt_slots                            gauge      the scheduler's slots
    specrt_slots_occupied                   gauge      images decoding now (every open batch)
    specrt_images_per_second                gauge      images finished per second over the last RATE_WINDOW_S
    specrt_tokens_per_second                gauge      tokens of those images per second, same window
    specrt_accepted_length                  gauge      tokens per target forward of every image finished so far
    specrt_images_total                     counter    images finished
    specrt_tokens_total                     counter    their tokens
    specrt_target_forwards_total            counter    their target forwards
    specrt_forwards_by_accepted_total       counter    target forwards by tokens they produced (label accepted="n")
    specrt_requests_total                   counter    requests by how they ended (label outcome=completed,
                                                       refused, failed, cancelled, expired, closed)
    specrt_request_latency_seconds          histogram  arrival to answer of answered requests (LATENCY_BUCKETS)

Counters follow the scheduler's (SchedulerStats only grows): each update adds what grew since the
last. The rates are the server's own view for a dashboard without PromQL; a Prometheus server
would take rate(specrt_images_total[1m]) instead.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any

from specrt.runtime.scheduling import LATENCY_BUCKETS, SchedulerStats

LOG = logging.getLogger("specrt.serve")
RATE_WINDOW_S = 10.0
OUTCOMES = ("completed", "refused", "failed", "cancelled", "expired", "closed")
GAUGES = {
    "specrt_queue_depth": "Requests waiting for a slot",
    "specrt_slots": "Slots of the in-flight scheduler",
    "specrt_slots_occupied": "Images decoding now, in every open batch",
    "specrt_images_per_second": f"Images finished per second over the last {RATE_WINDOW_S:.0f} s",
    "specrt_tokens_per_second": f"Tokens of finished images per second over the last {RATE_WINDOW_S:.0f} s",
    "specrt_accepted_length": "Tokens per target forward over every finished image",
}
COUNTERS = {
    "specrt_images_total": "Images finished",
    "specrt_tokens_total": "Tokens of finished images",
    "specrt_target_forwards_total": "Target forwards of finished images",
}
METRIC_NAMES = (*GAUGES, *COUNTERS, "specrt_forwards_by_accepted_total", "specrt_requests_total",
                "specrt_request_latency_seconds")


class SchedulerMetrics:
    """Owns the metric families of one model; `update` copies a SchedulerStats snapshot in,
    `observe_latency` records one answered request. Without MetricFamily (an old stub) it does nothing."""

    def __init__(self, pb_utils: Any, model_name: str, slots: int):
        self.labels = {"model": model_name}
        self.enabled = hasattr(pb_utils, "MetricFamily")
        self._last = SchedulerStats(slots)
        self._history: deque[tuple[float, int, int]] = deque()  # (time, images, tokens)
        if not self.enabled:
            LOG.warning("this Triton Python backend has no custom metrics: specrt_* metrics are off")
            return
        family = pb_utils.MetricFamily
        self._families = []  # a family must outlive its metrics

        def make(name: str, doc: str, kind: Any) -> Any:
            self._families.append(family(name=name, description=doc, kind=kind))
            return self._families[-1]

        self.gauges = {name: make(name, doc, family.GAUGE).Metric(labels=self.labels) for name, doc in GAUGES.items()}
        self.counters = {name: make(name, doc, family.COUNTER).Metric(labels=self.labels)
                         for name, doc in COUNTERS.items()}
        self._by_accepted = make("specrt_forwards_by_accepted_total", "Target forwards by the tokens each produced",
                                 family.COUNTER)
        self._accepted: dict[int, Any] = {}
        outcomes = make("specrt_requests_total", "Requests by how they ended", family.COUNTER)
        self.outcomes = {outcome: outcomes.Metric(labels={**self.labels, "outcome": outcome}) for outcome in OUTCOMES}
        latency = make("specrt_request_latency_seconds", "Seconds from a request's arrival to its answer",
                       family.HISTOGRAM)
        self.latency = latency.Metric(labels=self.labels, buckets=list(LATENCY_BUCKETS))
        self.gauges["specrt_slots"].set(slots)

    def observe_latency(self, seconds: float) -> None:
        if self.enabled:
            self.latency.observe(seconds)

    def update(self, stats: SchedulerStats, now: float) -> None:
        """Copy `stats` (a Scheduler.stats() snapshot taken at time.monotonic() `now`) into the metrics."""
        if not self.enabled:
            return
        last, self._last = self._last, stats
        self.gauges["specrt_queue_depth"].set(stats.queued)
        self.gauges["specrt_slots_occupied"].set(stats.running)
        self.gauges["specrt_accepted_length"].set(stats.mean_accepted_length)
        for name, field in (("specrt_images_total", "completed"), ("specrt_tokens_total", "tokens"),
                            ("specrt_target_forwards_total", "target_forwards")):
            grown = getattr(stats, field) - getattr(last, field)
            if grown > 0:
                self.counters[name].increment(grown)
        for outcome, metric in self.outcomes.items():
            grown = getattr(stats, outcome) - getattr(last, outcome)
            if grown > 0:
                metric.increment(grown)
        for accepted, count in stats.accepted_lengths.items():
            grown = count - last.accepted_lengths.get(accepted, 0)
            if grown > 0:
                if accepted not in self._accepted:
                    self._accepted[accepted] = self._by_accepted.Metric(labels={**self.labels,
                                                                                "accepted": str(accepted)})
                self._accepted[accepted].increment(grown)
        self._history.append((now, stats.completed, stats.tokens))
        while len(self._history) > 1 and now - self._history[0][0] > RATE_WINDOW_S:
            self._history.popleft()
        then, images, tokens = self._history[0]
        span = now - then
        self.gauges["specrt_images_per_second"].set((stats.completed - images) / span if span > 0 else 0.0)
        self.gauges["specrt_tokens_per_second"].set((stats.tokens - tokens) / span if span > 0 else 0.0)
