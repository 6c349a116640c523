"""runtime.verification.rules: each rule's block methods (a batch's tests and resampling rows)
against its one-row methods and the papers' definitions."""
from __future__ import annotations

import numpy as np
import pytest

from _verification_cases import DRAFT_LEN, RULES, VOCAB, random_batch
from specrt.runtime.verification.formulas import acceptance, relaxation_schedule
from specrt.runtime.verification.rules import CoolRule, LanternRule


def relaxed_mass_by_definition(p: np.ndarray, token: int, rule: LanternRule) -> float:
    """p̃(x̃) written out: add the nearest neighbours' mass while the sum stays within budget."""
    limit = rule.tvd_budget if rule.tvd_budget is not None else (rule.ratio - 1.0) * float(p[token])
    total = 0.0
    for neighbour in rule.neighbours[token]:
        if total + float(p[neighbour]) > limit:
            break
        total += float(p[neighbour])
    return float(p[token]) + total


@pytest.mark.parametrize("name", RULES)
def test_batched_acceptance_probabilities_are_the_rules_per_position_ones(name):
    rule = RULES[name]
    p_block, q_rows, drafts, _ = random_batch(0, lengths=[DRAFT_LEN] * 5)
    tokens = np.array(drafts)
    steps = np.arange(DRAFT_LEN)
    p_at = p_block[np.arange(5)[:, None, None], steps[None, :, None], rule.columns(tokens)].astype(np.float64)
    q_at = np.array([[q_rows[b][i][tokens[b, i]] for i in steps] for b in range(5)], dtype=np.float64)
    batched = rule.accept_probabilities(p_at, q_at, steps + 1)
    for b in range(5):
        for i in steps:
            p, q, token = p_block[b, i], q_rows[b][i], int(tokens[b, i])
            one = rule.accept_probability(p, q, token, i + 1)
            assert batched[b, i] == one  # the same bits: a batch of one image tests with accept_probability
            assert batched[b, i] == pytest.approx(rule.acceptance_row(p, q, i + 1)[token], rel=1e-12, abs=1e-15)
            if isinstance(rule, LanternRule):
                expected = float(acceptance(relaxed_mass_by_definition(p.astype(np.float64), token, rule), q[token]))
                assert batched[b, i] == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", RULES)
def test_block_resampling_rows_are_the_per_row_ones(name):
    rule = RULES[name]
    p_block, q_rows, drafts, _ = random_batch(1, lengths=[DRAFT_LEN] * 3)
    p = p_block[:, :DRAFT_LEN].reshape(-1, VOCAB).astype(np.float64)
    q = np.array([row for rows in q_rows for row in rows], dtype=np.float64)
    tokens = np.array(drafts).reshape(-1)
    positions = np.tile(np.arange(1, DRAFT_LEN + 1), 3)
    block = rule.resample(p, q, tokens, positions)
    for r in range(len(tokens)):
        np.testing.assert_allclose(block[r], rule.resample(p[r], q[r], int(tokens[r]), int(positions[r])),
                                   rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("schedule,budget", [("exp", 1.0), ("exp", 2.0), ("linear", 1.0), ("uniform", 0.6)])
def test_cool_sds_closed_form_g_star_is_g_star_of_its_acceptance_row(schedule, budget, dtype):
    """CoolRule.resample writes G* = Norm([P − Q·f]_+) as Norm(max(P − Q, (1 − ω)·P)) (Q·f = min(Q, ω·P)):
    the same rows as g_star(p, q, acceptance_row) by definition, one row and blocks, for ω above and
    below 1 (the exp schedule spans both; linear's late positions have ω ≤ 0; uniform 0.6 is below 1
    everywhere) and for tokens without draft or target mass."""
    from specrt.runtime.verification.formulas import g_star

    rule = CoolRule(relaxation_schedule(schedule, 9, budget))
    assert (rule.weights > 1).any() or schedule == "uniform"
    rng = np.random.default_rng(8)
    p = (rng.dirichlet(np.full(VOCAB, 0.4), size=27) * (rng.random((27, VOCAB)) < 0.8)).astype(dtype)
    q = (rng.dirichlet(np.full(VOCAB, 0.4), size=27) * (rng.random((27, VOCAB)) < 0.8)).astype(dtype)
    p[:, 0] += dtype(1e-3)  # every row keeps some target mass
    positions = np.tile(np.arange(1, 10), 3)
    expected = np.array([g_star(p[r], q[r], rule.acceptance_row(p[r], q[r], int(positions[r])))
                         for r in range(len(p))])
    np.testing.assert_allclose(rule.resample(p, q, None, positions), expected, rtol=1e-12, atol=1e-15)
    for r in range(len(p)):
        np.testing.assert_allclose(rule.resample(p[r], q[r], None, int(positions[r])), expected[r],
                                   rtol=1e-12, atol=1e-15)
