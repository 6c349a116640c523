"""The queueing model of in-flight batching against whole calls (bench/serve_model.py): exact on
cases worked by hand, and it tells a device whose pass cost barely grows with its images from one
whose cost grows in proportion."""
from __future__ import annotations

import numpy as np
import pytest

from specrt.bench.serve_model import PassCost, in_flight, predict, whole_calls


def test_pass_cost_runs_through_both_measurements():
    cost = PassCost(alone_per_s=10.0, together_per_s=40.0, slots=8)
    assert cost.seconds(1) == pytest.approx(0.1) and cost.seconds(8) == pytest.approx(0.2)
    assert cost.seconds(4) == pytest.approx(0.1 + 0.1 * 3 / 7)


def test_hand_worked_arrivals():
    """Two requests 0.05 s apart, one image alone 0.1 s, two together 0.15 s. Whole calls: the first
    goes alone (0.1 s), the second waits for it, then goes alone. In flight: the second enters at
    0.05 with the first half done; together each progresses at 1/0.15 a second, so the first
    finishes 0.075 s later (at 0.125), and the second, 0.5 done by then, finishes 0.05 later alone."""
    cost = PassCost(alone_per_s=10.0, together_per_s=8 / (0.1 + 0.05 * 7), slots=8)  # T(k) = 0.1 + 0.05 (k - 1)
    assert cost.seconds(2) == pytest.approx(0.15)
    arrivals = np.array([0.0, 0.05])
    np.testing.assert_allclose(whole_calls(cost, arrivals), [0.1, 0.15])
    np.testing.assert_allclose(in_flight(cost, arrivals), [0.125, 0.125])


def test_a_full_batch_queues_first_come_first_served():
    cost = PassCost(alone_per_s=10.0, together_per_s=20.0, slots=2)  # T(1) = 0.1, T(2) = 0.1
    arrivals = np.zeros(3)
    np.testing.assert_allclose(in_flight(cost, arrivals), [0.1, 0.1, 0.2])
    np.testing.assert_allclose(whole_calls(cost, arrivals), [0.1, 0.1, 0.2])


def test_the_device_decides_what_in_flight_gains():
    """A pass that costs the same for one image as for eight (a GPU-like device): in flight's p99 at
    0.75x is well below whole calls'. A pass that costs in proportion to its images: the two are
    within 15% of each other (the size of what the CPU run measures)."""
    flat = predict(PassCost(alone_per_s=10.0, together_per_s=80.0), [0.75], requests=4000)[0]
    assert flat["inflight_p99_s"] < 0.85 * flat["dynamic_p99_s"], flat
    proportional = predict(PassCost(alone_per_s=10.0, together_per_s=10.0), [0.75], requests=4000)[0]
    assert abs(proportional["inflight_p99_s"] / proportional["dynamic_p99_s"] - 1) < 0.15, proportional
