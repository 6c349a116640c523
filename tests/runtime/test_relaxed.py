"""Relaxed methods (Cool-SD, UniformRSD): schedules, and Theorem 2 of the Cool-SD paper.

One verification round is sampled 20,000 times from a fixed prefix on the toy family and
virtually extended from P to L + 1 tokens, exactly the setting of Theorem 2, so the measured
TV distance to P and the mean accepted length can be compared with Eq. 7-9 evaluated by
enumeration with the same per-position functions the runtime uses.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.runtime.backends.toy import ToyLM
from specrt.runtime.methods import make_method
from _toy_exact import next_token_row, one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.runtime.sampling import SamplingParams, inverse_cdf
from specrt.runtime.verification.chains import verify_chains
from specrt.runtime.verification.formulas import exponential_schedule, linear_schedule, relaxation_schedule
from specrt.runtime.verification.rules import CoolRule, VanillaRule
from specrt.runtime.verification.theory import accepted_mass, theorem2_along_path, tv_bound_term

VOCAB, DRAFT_LEN, SAMPLES = 3, 2, 20_000
SAMPLING = SamplingParams(cfg_scale=1.0)
TARGET = ToyLM(VOCAB, seed=5)
DRAFT = ToyLM(VOCAB, seed=6, base=TARGET, noise=1.5)


def sample(row: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from `row` with the stream's next uniform (the reference's own sampling)."""
    return inverse_cdf(np.asarray(row, dtype=np.float64), rng.random())


@functools.lru_cache(maxsize=None)
def row(lm: ToyLM, prefix: tuple[int, ...]) -> np.ndarray:
    return next_token_row(lm, 0, 1, prefix, SAMPLING)


def exact_theorem2(rule) -> tuple[float, float]:
    """Eq. 7 and Eq. 8-9 by enumerating every drafted prefix."""
    length, bound = 1.0, 0.0
    for i in range(DRAFT_LEN):
        for prefix in itertools.product(range(VOCAB), repeat=i):
            weight = 1.0  # Q(x_{1:i}) Π f_k
            for k in range(i):
                p, q = row(TARGET, prefix[:k]), row(DRAFT, prefix[:k])
                weight *= q[prefix[k]] * rule.acceptance_row(p, q, k + 1)[prefix[k]]
            p, q = row(TARGET, prefix), row(DRAFT, prefix)
            f = rule.acceptance_row(p, q, i + 1)
            length += weight * accepted_mass(q, f)
            bound += weight * tv_bound_term(p, q, f, rule.resample(p, q, 0, i + 1))
    return length, bound


def sampled_round(rule, seed: int = 0) -> tuple[float, float, float]:
    """(measured TV to P over L+1 tokens, its sampling slack, mean accepted length τ+1)."""
    rng = np.random.default_rng(seed)
    counts: dict[tuple[int, ...], int] = {}
    produced = 0
    for _ in range(SAMPLES):
        drafts, q_rows = [], []
        for _ in range(DRAFT_LEN):
            q_rows.append(row(DRAFT, tuple(drafts)))
            drafts.append(int(sample(q_rows[-1], rng)))
        p_rows = np.stack([row(TARGET, tuple(drafts[:i])) for i in range(DRAFT_LEN + 1)])
        draws = np.zeros((1, DRAFT_LEN + 1), dtype=np.int64)
        draws[0, DRAFT_LEN] = sample(p_rows[DRAFT_LEN], rng)  # the bonus token, the head's draw from P_{L+1}
        out = verify_chains(p_rows[None], np.stack(q_rows)[:, None], [drafts], rule, rng.random((1, DRAFT_LEN)),
                            rng.random(1), draws)
        seq = drafts[: out.accepted_lengths[0]] + [int(out.next_tokens[0])]
        produced += len(seq)
        while len(seq) < DRAFT_LEN + 1:  # Theorem 2's virtual extension from P
            seq.append(int(sample(row(TARGET, tuple(seq)), rng)))
        counts[tuple(seq)] = counts.get(tuple(seq), 0) + 1
    tv, slack = 0.0, 0.0
    for seq in itertools.product(range(VOCAB), repeat=DRAFT_LEN + 1):
        p = np.prod([row(TARGET, seq[:k])[seq[k]] for k in range(DRAFT_LEN + 1)])
        tv += 0.5 * abs(counts.get(seq, 0) / SAMPLES - p)
        slack += 0.5 * np.sqrt(p * (1 - p) / SAMPLES)
    return tv, slack, produced / SAMPLES


def test_exponential_schedule_sums_to_budget_and_decays_by_e_minus_nu():
    weights = exponential_schedule(8, relaxation_budget=3.0, decay=0.7)
    assert weights.sum() == pytest.approx(3.0 * 8)
    np.testing.assert_allclose(weights[1:] / weights[:-1], np.exp(-0.7))


def test_linear_schedule_is_eq17():
    weights = linear_schedule(4, relaxation_budget=2.0, slope_len=8)
    raw = (8 - np.arange(1, 5)) / (8 * 9)
    np.testing.assert_allclose(weights, 2.0 * 4 * raw / raw.sum())
    assert weights.sum() == pytest.approx(8.0)
    np.testing.assert_allclose(relaxation_schedule("uniform", 3, 1.5), [1.5, 1.5, 1.5])


def test_exp_schedule_is_eq16_at_every_budget_with_no_special_case_at_one():
    """Eq. 16 at δ = 1 relaxes the early positions; δ = 1 and δ = 1.0001 are nearly the same rule."""
    np.testing.assert_allclose(relaxation_schedule("exp", 4, 1.0), [2.14, 1.07, 0.53, 0.26], atol=0.01)
    at_one, just_above = (exact_theorem2(CoolRule(relaxation_schedule("exp", DRAFT_LEN, budget)))
                          for budget in (1.0, 1.0001))
    assert at_one[1] > 0.01  # relaxed: a positive TV bound, unlike vanilla SD's 0
    assert at_one[0] == pytest.approx(just_above[0], abs=1e-3)
    assert at_one[1] == pytest.approx(just_above[1], abs=1e-3)


def test_pipeline_cool_sd_is_continuous_in_budget_at_one():
    """Same seed through the public API: δ = 1 and 1.0001 (exp) give nearly the same tokens and
    accepted length, and neither is vanilla SD (which the removed δ == 1 special case made it)."""
    from specrt.runtime.backends.toy import toy_models
    from specrt.runtime.pipeline import Pipeline

    target, draft, vq = toy_models(vocab_size=4, grid_size=3, seed=2)
    pipe = Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 1.0})
    runs = [pipe.generate([0] * 300, method="cool-sd", seed=5, draft_len=3, relaxation_budget=budget)
            for budget in (1.0, 1.0001)]
    sd = pipe.generate([0] * 300, method="sd", seed=5, draft_len=3).tokens
    lengths = [run.stats.mean_accepted_length for run in runs]
    assert lengths[0] == pytest.approx(lengths[1], abs=0.02)
    assert np.mean(runs[0].tokens == runs[1].tokens) > 0.99
    assert np.mean(runs[0].tokens != sd) > 0.05


def test_cool_sd_rejects_budget_below_one_and_unknown_parameters():
    with pytest.raises(SpecrtError, match="relaxation_budget"):
        make_method("cool-sd", relaxation_budget=0.5)
    with pytest.raises(SpecrtError, match="no parameter"):
        make_method("cool-sd", delta=2)
    with pytest.raises(SpecrtError, match="unknown method"):
        make_method("medusa")


def test_vanilla_rule_has_zero_bound_and_matches_eq7():
    length, bound = exact_theorem2(VanillaRule())
    assert bound == pytest.approx(0.0, abs=1e-12)
    tv, slack, measured_length = sampled_round(VanillaRule())
    assert tv < 3 * slack
    assert measured_length == pytest.approx(length, abs=0.03)


@pytest.mark.parametrize("schedule", ["uniform", "exp"])
def test_measured_tv_grows_with_budget_and_stays_within_theorem2(schedule):
    measured, bounds = [], []
    for budget in (1.0, 2.0, 4.0):
        rule = CoolRule(relaxation_schedule(schedule, DRAFT_LEN, budget))
        length, bound = exact_theorem2(rule)
        tv, slack, measured_length = sampled_round(rule, seed=int(budget))
        assert tv <= bound + 2 * slack, f"δ={budget}: TV {tv:.4f} > bound {bound:.4f} + {2 * slack:.4f}"
        assert measured_length == pytest.approx(length, abs=0.03)
        measured.append(tv)
        bounds.append(bound)
    assert measured[0] < measured[1] < measured[2]
    assert bounds[0] <= bounds[1] <= bounds[2]


def test_path_estimates_average_to_theorem2():
    """The per-round estimates the runtime reports are unbiased for Eq. 7 and Eq. 8-9."""
    rule = CoolRule(relaxation_schedule("exp", DRAFT_LEN, 2.0))
    length, bound = exact_theorem2(rule)
    rng = np.random.default_rng(1)
    lengths, tvs = [], []
    for _ in range(4000):
        drafts, q_rows = [], []
        for _ in range(DRAFT_LEN):
            q_rows.append(row(DRAFT, tuple(drafts)))
            drafts.append(int(sample(q_rows[-1], rng)))
        p_rows = np.stack([row(TARGET, tuple(drafts[:i])) for i in range(DRAFT_LEN + 1)])
        estimate = theorem2_along_path(p_rows, q_rows, drafts, rule)
        lengths.append(estimate.expected_accepted_length)
        tvs.append(estimate.tv_bound)
    assert np.mean(lengths) == pytest.approx(length, abs=4 * np.std(lengths) / np.sqrt(4000))
    assert np.mean(tvs) == pytest.approx(bound, abs=4 * np.std(tvs) / np.sqrt(4000) + 1e-9)


@pytest.mark.parametrize("method,params", [("cool-sd", {"relaxation_budget": 1.0, "schedule": "uniform"}),
                                           ("lantern", {"tvd_budget": 0.0}), ("lantern", {"ratio": 1.0, "resampling": "gstar"})])
def test_relaxations_at_zero_budget_are_exactly_sd(method, params):
    """δ = 1 (UniformRSD) and an empty LANTERN neighbourhood draw the same counter uniforms as SD
    and accept/resample identically, so the same seed gives the same tokens."""
    from specrt.runtime.backends.toy import toy_models
    from specrt.runtime.pipeline import Pipeline

    target, draft, vq = toy_models(vocab_size=4, grid_size=3, seed=2)
    neighbours = np.array([[1, 2], [0, 2], [3, 1], [2, 0]])
    pipe = Pipeline(target, vq, draft, neighbours=neighbours, sampling_defaults={"cfg_scale": 1.0})
    reference = pipe.generate([0] * 200, method="sd", seed=4, draft_len=3).tokens
    np.testing.assert_array_equal(pipe.generate([0] * 200, method=method, seed=4, draft_len=3, **params).tokens, reference)


def test_lantern_accepts_more_as_the_budget_grows():
    from specrt.runtime.backends.toy import toy_models
    from specrt.runtime.pipeline import Pipeline

    target, draft, vq = toy_models(vocab_size=4, grid_size=3, seed=2)
    neighbours = np.array([[1, 2], [0, 2], [3, 1], [2, 0]])
    pipe = Pipeline(target, vq, draft, neighbours=neighbours, sampling_defaults={"cfg_scale": 1.0})
    lengths = [pipe.generate([0] * 300, method="lantern", seed=0, draft_len=3, tvd_budget=budget).stats.mean_accepted_length
               for budget in (0.0, 0.2, 0.6)]
    assert lengths[0] < lengths[1] < lengths[2]


def test_pipeline_reports_theorem2_estimates_on_request():
    from specrt.runtime.backends.toy import toy_models
    from specrt.runtime.pipeline import Pipeline

    target, draft, vq = toy_models(vocab_size=4, grid_size=3, seed=2)
    pipe = Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 1.0})
    plain = pipe.generate([0] * 50, method="cool-sd", seed=0, relaxation_budget=2.0).stats.summary()
    assert "theorem2_expected_accepted_length" not in plain
    stats = pipe.generate([0] * 300, method="cool-sd", seed=0, relaxation_budget=2.0, draft_len=3, theorem2=True).stats
    summary = stats.summary()
    rounds = sum(v for k, v in stats.accepted_lengths.items()) - 300  # minus the prefill forwards
    measured = (stats.tokens - 300) / rounds
    assert summary["theorem2_expected_accepted_length"] == pytest.approx(measured, rel=0.1)
    assert 0.0 < summary["theorem2_tv_bound_per_round"] < 1.0
