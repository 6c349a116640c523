"""runtime.verification.formulas: the array forms of the per-token formulas against their
definitions and their one-row (Python float) forms."""
from __future__ import annotations

import numpy as np

from _verification_cases import NEIGHBOURS, VOCAB
from specrt.runtime.verification.formulas import acceptance


def test_lanterns_one_row_moved_target_is_the_blocks_row_bit_for_bit():
    """Eq. 6's moved target of one row (a batch-1 rejection, Python floats) equals the block's row
    for that token exactly, under both budgets, for budgets that keep none, some and all neighbours."""
    from specrt.runtime.verification.formulas import lantern_moved_target

    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.full(VOCAB, 0.5), size=30)
    tokens = rng.integers(0, VOCAB, size=30)
    kept_counts = set()
    for budget in ({"tvd_budget": 0.0}, {"tvd_budget": 0.2}, {"tvd_budget": 1.0}, {"ratio": 1.5}, {"ratio": 3.0}):
        block = lantern_moved_target(p, NEIGHBOURS, tokens, **budget)
        for r, token in enumerate(tokens.tolist()):
            one = lantern_moved_target(p[r], NEIGHBOURS, token, **budget)
            assert np.array_equal(one, block[r]), (budget, r)
            kept_counts.add(int(np.count_nonzero(one[NEIGHBOURS[token]] == 0.0)))
    assert {0, NEIGHBOURS.shape[1]} <= kept_counts and len(kept_counts) > 2  # none, some and all moved


def test_acceptance_on_arrays_is_min_one_ratio_with_one_where_the_draft_has_no_mass():
    """The array path (two numpy calls) against its definition and the scalar path, edge cases
    included: equal masses, no draft mass (f = 1 whatever the target), no mass on either side."""
    rng = np.random.default_rng(5)
    target = np.concatenate([rng.random(200), [0.3, 0.0, 0.4, 0.0, 0.2]])
    draft = np.concatenate([rng.random(200) * 2.0, [0.3, 0.0, 0.0, 0.5, 1e-300]])
    expected = np.array([1.0 if d <= 0 else min(1.0, t / d) for t, d in zip(target, draft)])
    f = acceptance(target, draft)
    np.testing.assert_array_equal(f, expected)
    assert [acceptance(float(t), float(d)) for t, d in zip(target, draft)] == f.tolist()
    assert acceptance(target[None, :5], np.float64(0.5)).shape == (1, 5)  # shapes broadcast
