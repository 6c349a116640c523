"""runtime.verification.siblings: candidates drawn without replacement (q^(k), held first draws,
a row's support) against their definition, fresh CDFs searched anew."""
from __future__ import annotations

import numpy as np

from _verification_cases import VOCAB


def test_draws_without_replacement_take_held_first_candidates_as_drawn_from_q():
    """With the draft head's draws held (firsts), a row's candidates are that draw, then the rest from
    q without it (the row with the earlier ones zeroed, a fresh cumsum), candidate k with the row's
    uniform k; the SJD-PAC helper draw_without_replacement(q, count, uniforms, first) is one such row;
    a level of one child per row reads no uniform and makes no CDF; a row without mass gives none."""
    from specrt.runtime.sampling import draw_from_cdf
    from specrt.runtime.verification.siblings import draw_without_replacement, draws_without_replacement

    def by_definition(row, count, first, uniforms):
        rest = row.astype(np.float64)
        tokens = [first] if count and row.any() else []
        rest[first] = 0.0
        while tokens and len(tokens) < min(count, int(np.count_nonzero(row))):
            tokens.append(draw_from_cdf(np.cumsum(rest), uniforms[len(tokens)]))
            rest[tokens[-1]] = 0.0
        return tokens

    rng = np.random.default_rng(6)
    rows = rng.random((5, VOCAB)) * (rng.random((5, VOCAB)) < 0.6)
    rows[2] = 0.0
    firsts = [int(np.flatnonzero(row)[0]) if row.any() else 0 for row in rows]
    counts = [3, 1, 2, 4, 12]
    uniforms = np.random.default_rng(2).random((5, 12))
    got = draws_without_replacement(rows, counts, uniforms, firsts)
    want = [by_definition(row, count, first, u) for row, count, first, u in zip(rows, counts, firsts, uniforms)]
    assert got == want and got[2] == [] and [g[0] for g in got if g] == [f for f, r in zip(firsts, rows) if r.any()]
    assert [draw_without_replacement(row, count, u, first=first) for row, count, first, u
            in zip(rows, counts, firsts, uniforms)] == [g or [f] for g, f in zip(got, firsts)]  # it keeps a held first
    unread = np.full((5, 12), np.nan)  # a NaN uniform read would break a search
    assert draws_without_replacement(rows, [1, 1, 1, 0, 1], unread, firsts) == \
        [[firsts[0]], [firsts[1]], [], [], [firsts[4]]]


def test_a_search_without_drawn_candidates_is_the_fresh_cdf_search_and_never_returns_one():
    """_search_without reads q^(k)'s inverse CDF off the row's own CDF: the same token as a search of
    the CDF recomputed without the drawn candidates, for targets across the whole mass (many drawn,
    adjacent ones and the last entry included); and rounding that lands on a drawn candidate (forced
    here with a mass that disagrees with the row) falls back to the recomputed CDF."""
    from specrt.runtime.verification.siblings import _search_without

    rng = np.random.default_rng(3)
    for trial in range(200):
        row = rng.random(VOCAB) * (rng.random(VOCAB) < 0.5)
        taken = sorted(set(rng.choice(np.flatnonzero(row), size=min(6, np.count_nonzero(row) - 1), replace=False).tolist())
                       | ({VOCAB - 1} if trial % 3 == 0 and row[-1] > 0 else set()))
        drawn = [(int(c), float(row[c])) for c in rng.permutation(taken)]
        rest = row.copy()
        rest[taken] = 0.0
        fresh = np.cumsum(rest)
        for u in (0.0, *rng.random(5), 1.0 - 1e-12):
            target = u * fresh[-1]
            want = min(int(fresh.searchsorted(target, side="right")), VOCAB - 1)
            assert _search_without(row, np.cumsum(row), target, drawn) == want
    row = np.ones(3)
    assert _search_without(row, np.cumsum(row), 1.2, [(1, 0.5)]) == 2  # the stated mass lands it on 1


def test_draws_without_replacement_follow_q_k_row_by_row_and_stop_at_the_support():
    """A level's candidates, row after row: candidate k the inverse CDF of q^(k) (the row with
    candidates 1..k − 1 zeroed, a fresh cumsum) with the row's uniform k; a row with fewer tokens
    with mass than asked gives those and no more."""
    from specrt.runtime.sampling import draw_from_cdf
    from specrt.runtime.verification.siblings import draws_without_replacement

    rng = np.random.default_rng(8)
    rows = rng.random((6, VOCAB)) * (rng.random((6, VOCAB)) < 0.7)
    rows[1, :2], rows[1, 2:] = (0.3, 0.5), 0.0  # support 2, 4 asked
    rows[4] = 0.0  # no mass at all
    counts = [3, 4, 1, 5, 2, 12]

    def reference(rows, counts, uniforms):
        picked = []
        for row, count, row_uniforms in zip(rows, counts, uniforms):
            rest, tokens = row.astype(np.float64), []
            for k in range(min(count, int(np.count_nonzero(rest)))):
                tokens.append(draw_from_cdf(np.cumsum(rest), row_uniforms[k]))
                rest[tokens[-1]] = 0.0
            picked.append(tokens)
        return picked

    uniforms = np.random.default_rng(9).random((len(counts), max(counts)))
    got = draws_without_replacement(rows.astype(np.float32), counts, uniforms)
    assert got == reference(rows.astype(np.float32), counts, uniforms)
    assert len(got[1]) == 2 and got[4] == [] and len(set(got[5])) == len(got[5]) == np.count_nonzero(rows[5])
