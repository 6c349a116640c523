"""The load generator's arithmetic (specrt.bench.serve_load) and `specrt bench --serve`'s flags.

Poisson arrivals: the same seed gives the same times, another seed other times; the mean gap is
1/rate within 4 standard errors of the sample (n exponential gaps: standard error (1/rate)/sqrt(n)),
and a generator off by 10% in rate (the planted bug) falls outside that band. Percentiles are
nearest-rank (a measured value). A tiny real run against a server is in
tests/runtime/test_serve_inflight.py (the load client drives its bursts).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from specrt.bench.serve_load import (Outcome, percentile, percentile_interval, percentile_ranks, poisson_arrivals,
                                    request_pool, summarise)
from specrt.commands._serve_bench import check_url, parse_loads, parse_methods
from specrt.errors import SpecrtError


def mean_gap_within_band(arrivals: np.ndarray, rate: float) -> bool:
    gaps = np.diff(np.concatenate([[0.0], arrivals]))
    standard_error = (1.0 / rate) / math.sqrt(len(gaps))
    return abs(gaps.mean() - 1.0 / rate) <= 4 * standard_error


def test_poisson_arrivals_are_reproducible_and_have_the_rate():
    rate, seconds = 20.0, 400.0
    first = poisson_arrivals(rate, seconds, 100_000, seed=7)
    np.testing.assert_array_equal(first, poisson_arrivals(rate, seconds, 100_000, seed=7))
    assert not np.array_equal(first[:50], poisson_arrivals(rate, seconds, 100_000, seed=8)[:50])
    assert np.all(np.diff(first) > 0) and first[-1] < seconds
    n = len(first)  # Poisson(8000): within 5 sigma of its mean
    assert abs(n - rate * seconds) <= 5 * math.sqrt(rate * seconds)
    assert mean_gap_within_band(first, rate)
    # the planted bug: arrivals at 10% more than the rate asked for are caught by the same band
    assert not mean_gap_within_band(poisson_arrivals(rate * 1.1, seconds, 100_000, seed=7), rate)


def test_poisson_arrivals_are_bounded_in_count_and_time():
    assert len(poisson_arrivals(50.0, 10.0, 25, seed=0)) == 25
    assert poisson_arrivals(50.0, 0.5, 10_000, seed=0).max() < 0.5
    assert len(poisson_arrivals(0.0, 10.0, 10, seed=0)) == 0


def test_percentiles_are_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 7.0, 8.0, 9.0]
    assert percentile(values, 50) == 5.0
    assert percentile(values, 95) == 10.0 and percentile(values, 90) == 9.0
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 10.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert math.isnan(percentile([], 50))


def _binomial_cdf(count: int, p: float, k: int) -> float:
    """P(B <= k) for B ~ binomial(count, p), summed exactly in fractions (the test's own formula)."""
    from fractions import Fraction

    p = Fraction(p).limit_denominator(10**6)
    return float(sum(math.comb(count, i) * p**i * (1 - p)**(count - i) for i in range(k + 1)))


@pytest.mark.parametrize("count", [600, 1791])
def test_p99_ranks_miss_at_most_the_tails_asked_and_are_the_tightest(count):
    low, high = percentile_ranks(count, 99)
    below, above = _binomial_cdf(count, 0.99, low - 1), 1 - _binomial_cdf(count, 0.99, high - 1)
    assert below <= 0.025 and above <= 0.025          # P(X_(low) > p99), P(X_(high) < p99)
    assert _binomial_cdf(count, 0.99, low) > 0.025     # one rank higher would miss more often
    assert 1 - _binomial_cdf(count, 0.99, high - 2) > 0.025
    assert low < math.ceil(0.99 * count) < high


def test_p99_intervals_cover_the_true_p99_as_often_as_the_ranks_say():
    """2,000 samples of 600 exponential latencies (fixed seed): the share of intervals holding the
    true p99 (ln 100) is the ranks' exact coverage within 4 standard errors; a planted bug (the
    p95's ranks) lands far outside that band."""
    rng = np.random.default_rng(7)
    trials, count, truth = 2000, 600, math.log(100)
    samples = rng.exponential(1.0, size=(trials, count))

    def coverage(q: float) -> float:
        return float(np.mean([low <= truth <= high for low, high in (percentile_interval(row, q) for row in samples)]))

    low, high = percentile_ranks(count, 99)
    exact = _binomial_cdf(count, 0.99, high - 1) - _binomial_cdf(count, 0.99, low - 1)
    band = 4 * math.sqrt(exact * (1 - exact) / trials)
    assert exact >= 0.95
    assert abs(coverage(99) - exact) <= band
    assert abs(coverage(95) - exact) > band


def test_too_few_latencies_leave_the_p99s_upper_side_open():
    low, high = percentile_interval([float(i) for i in range(1, 51)], 99)
    assert low == 48.0 and math.isnan(high)  # 50 draws: even the slowest is below the p99 too often
    assert all(math.isnan(b) for b in percentile_interval([], 99))


def test_summarise_counts_latencies_and_same_tokens():
    reference = {0: np.array([1, 2]), 1: np.array([3, 4])}
    outcomes = [Outcome(0, 0.0, 0.5, "ok", tokens=np.array([1, 2])),
                Outcome(1, 0.1, 1.5, "ok", tokens=np.array([1, 2])),  # another request's tokens: not the same
                Outcome(1, 0.2, 0.01, "refused", message="the queue is full"),
                Outcome(0, 0.3, 0.2, "error", message="boom")]
    row = summarise("inflight", 0.5, 4.0, outcomes, reference)
    assert (row.sent, row.ok, row.refused, row.errors, row.same_tokens) == (4, 2, 1, 1, 1)
    assert row.p50_s == 0.5 and row.p99_s == 1.5 and row.refused_max_s == 0.01
    assert math.isnan(row.p99_interval_s[1])  # two answers bound no p99 from above
    assert row.seconds == pytest.approx(1.6) and row.throughput_per_s == pytest.approx(2 / 1.6)
    assert row.error_messages == ["boom"]


def test_float_latents_match_alone_within_float_drift_only():
    """A continuous model's latents: last-bit drift (what a batch of other shapes gives) matches, a
    draw from the wrong numbers (order 1) or a shift of 1e-3 does not; VQ codes must be equal."""
    from specrt.bench.serve_load import FLOAT_TOKENS_ATOL, tokens_match

    alone = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32) * 2
    drift = alone + np.float32(3e-5) * np.sign(alone)
    reference = {0: alone}
    outcomes = [Outcome(0, 0.0, 0.5, "ok", tokens=drift), Outcome(0, 0.1, 0.5, "ok", tokens=alone + 1e-3),
                Outcome(0, 0.2, 0.5, "ok", tokens=alone[::-1].copy())]
    assert summarise("inflight", 0.5, 4.0, outcomes, reference).same_tokens == 1
    assert 3e-5 < FLOAT_TOKENS_ATOL < 1e-3
    assert not tokens_match(np.array([1, 2]), np.array([1, 3])) and tokens_match(np.array([1, 2]), np.array([1, 2]))
    assert not tokens_match(alone[:10], alone)


def test_the_pool_cycles_classes_and_methods():
    pool = request_pool(3, 6, [("ar", {}), ("sjd", {"window": 8})], seed=10)
    assert [r.class_id for r in pool] == [0, 1, 2, 0, 1, 2]
    assert [r.method for r in pool] == ["ar", "sjd"] * 3 and [r.seed for r in pool] == list(range(10, 16))
    assert pool[1].params == (("window", 8),)


def test_the_flags_are_checked():
    assert parse_loads("1.5,0.25,0.5") == (0.25, 0.5, 1.5)
    for bad in ("", "0", "-1", "11", "a,b"):
        with pytest.raises(SpecrtError, match="--loads"):
            parse_loads(bad)
    assert parse_methods(None) == (("sjd", {}),)
    assert parse_methods("ar, sjd") == (("ar", {}), ("sjd", {}))
    assert parse_methods('[["sjd", {"window": 8}]]') == (("sjd", {"window": 8}),)
    assert check_url("127.0.0.1:8001") == "127.0.0.1:8001"
    with pytest.raises(SpecrtError, match="127.0.0.1 only"):
        check_url("example.com:8001")
