"""What in-flight batching can gain over whole calls on a device: a queueing model from two throughputs.

Why: whether images entering between rounds cuts latency depends on the device, not the scheduler.
Where a pass costs about the same for one image as for eight (a GPU), a request that arrives during
a whole call waits for it, and in flight it starts at the next round; where a pass costs in proportion
to its images (a small CPU), both ways do the same work in the same order of magnitude of time and
queueing sets the tail in both. Two numbers measured on the device say which: images per second
alone (one image at a time) and together (`slots` images in one call). The model takes the time
for k images decoding together to finish as linear in k through those two points, T(k) = a + b·k,
and runs the same Poisson arrivals through

- whole calls: when the device is free, the requests waiting (at most `slots`) start one call and
  all finish at T(k) (a dynamic batcher with no queue delay);
- in flight: every waiting request enters at once while fewer than `slots` decode, and each of the
  k decoding images progresses at 1/T(k) of an image per second (fluid processor sharing).

It leaves out what both modes pay alike (the prefill, the decoder, a server) and what differs by
image (speculative acceptance), so it bounds what the scheduler can do, not what a server measures.
`python -m specrt.bench.serve_model --alone 13 --together 17` prints its table.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specrt.bench.serve_load import percentile, poisson_arrivals

REQUESTS = 20_000  # arrivals a load: its p99 rests on 200 of them


@dataclass(frozen=True)
class PassCost:
    """T(k) = a + b·k seconds for k images decoding together, through T(1) = 1 / alone_per_s and
    T(slots) = slots / together_per_s."""

    alone_per_s: float
    together_per_s: float
    slots: int = 8

    def __post_init__(self) -> None:
        if not (self.alone_per_s > 0 and self.together_per_s > 0 and self.slots >= 2):
            raise ValueError("throughputs must be positive and slots at least 2")

    def seconds(self, images: int) -> float:
        one, full = 1.0 / self.alone_per_s, self.slots / self.together_per_s
        return one + (full - one) * (images - 1) / (self.slots - 1)


def whole_calls(cost: PassCost, arrivals: np.ndarray) -> np.ndarray:
    """Each request's latency when the waiting requests (at most `slots`) go as one call whenever
    the device is free, all finishing together."""
    latencies = np.empty(len(arrivals))
    now, first = 0.0, 0
    while first < len(arrivals):
        now = max(now, arrivals[first])
        last = min(int(np.searchsorted(arrivals, now, side="right")), first + cost.slots)
        now += cost.seconds(last - first)
        latencies[first:last] = now - arrivals[first:last]
        first = last
    return latencies


def in_flight(cost: PassCost, arrivals: np.ndarray) -> np.ndarray:
    """Each request's latency when it enters at once while fewer than `slots` decode (else waits,
    first come first served) and k images decoding each progress at 1 / T(k) images a second."""
    latencies = np.empty(len(arrivals))
    left: dict[int, float] = {}  # decoding request -> image left to decode (1 at entry)
    now, following = 0.0, 0
    while following < len(arrivals) or left:
        while following < len(arrivals) and arrivals[following] <= now and len(left) < cost.slots:
            left[following] = 1.0
            following += 1
        if not left:
            now = arrivals[following]
            continue
        speed = 1.0 / cost.seconds(len(left))
        finish = min(left.values()) / speed
        arrive = arrivals[following] - now if following < len(arrivals) and len(left) < cost.slots else np.inf
        step = min(finish, arrive)
        now += step
        for request in list(left):
            left[request] -= step * speed
            if left[request] <= 1e-12:
                latencies[request] = now - arrivals[request]
                del left[request]
    return latencies


def predict(cost: PassCost, fractions: Sequence[float], requests: int = REQUESTS, seed: int = 0) -> list[dict]:
    """Per offered load (a fraction of whole calls' saturated throughput, together_per_s): both
    modes' p50 and p99 latency (seconds) on the same arrivals."""
    rows = []
    for index, fraction in enumerate(fractions):
        rate = fraction * cost.together_per_s
        arrivals = poisson_arrivals(rate, 10 * requests / rate, requests, seed=seed * 1000 + index)
        row = {"fraction": fraction, "rate_per_s": rate}
        for mode, latencies in (("inflight", in_flight(cost, arrivals)), ("dynamic", whole_calls(cost, arrivals))):
            row[f"{mode}_p50_s"] = percentile(latencies, 50)
            row[f"{mode}_p99_s"] = percentile(latencies, 99)
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specrt.bench.serve_model", description=__doc__.splitlines()[0])
    parser.add_argument("--alone", type=float, required=True, help="images/s decoding one image at a time")
    parser.add_argument("--together", type=float, required=True, help="images/s decoding --slots images in one call")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--loads", default="0.25,0.5,0.75,0.9", help="fractions of --together (each below 1)")
    args = parser.parse_args(argv)
    fractions = [float(part) for part in args.loads.split(",")]
    if any(not 0 < f < 1 for f in fractions):
        parser.error("--loads: fractions below 1 (above it no queue is stable)")
    try:
        cost = PassCost(args.alone, args.together, args.slots)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"T(k) = {cost.seconds(1) * 1000:.1f} ms for one image .. {cost.seconds(cost.slots) * 1000:.1f} ms "
          f"for {cost.slots}; {REQUESTS} Poisson arrivals a load")
    print("load  in-flight p50 / p99 ms  whole calls p50 / p99 ms  p99 ratio")
    for row in predict(cost, fractions):
        print(f"{row['fraction']:4g}x  {1000 * row['inflight_p50_s']:8.0f} / {1000 * row['inflight_p99_s']:<8.0f}"
              f"    {1000 * row['dynamic_p50_s']:8.0f} / {1000 * row['dynamic_p99_s']:<8.0f}"
              f"     {row['inflight_p99_s'] / row['dynamic_p99_s']:.2f}")


if __name__ == "__main__":
    main()
