"""runtime.verification's batched chain verification against its one-row formulas.

verify_chains verifies a whole batch of drafted chains as array operations; these tests hold it to
the per-position definitions (each rule's accept_probability and resample, one row at a time), on
random rows with chains of different lengths, and check that an image's outcome depends on its own
rows and stream alone. Exactness through the public API is test_losslessness's and test_relaxed's.
"""
from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification import (
    CoolRule, LanternRule, VanillaRule, acceptance, positions_walk, read_in_waves, relaxation_schedule,
    rows_by_position, verify_chains,
)

VOCAB, DRAFT_LEN = 12, 4
LENGTHS = [4, 0, 2, 4, 1, 3]  # per image; 0: nothing drafted (the bonus token only)
NEIGHBOURS = np.array([[j for j in sorted(range(VOCAB), key=lambda j: (abs(i - j), j)) if j != i][:5]
                       for i in range(VOCAB)])
RULES = {
    "sd": VanillaRule(),
    "cool-sd": CoolRule(relaxation_schedule("exp", DRAFT_LEN, 2.0)),
    "lantern": LanternRule(NEIGHBOURS, tvd_budget=0.2),
    "lantern++-gstar": LanternRule(NEIGHBOURS, ratio=2.0, resampling="gstar"),
}


def random_batch(seed: int, lengths=LENGTHS):
    """p_block [images, L+1, V], per-image q rows and drafts (drawn from their q), the head's draws
    [images, L+1] (random: only each image's bonus draw, after its chain, is used)."""
    rng = np.random.default_rng(seed)
    sharp = lambda n: rng.dirichlet(np.full(VOCAB, 0.3), size=n).astype(np.float32)  # noqa: E731
    p_block = sharp(len(lengths) * (DRAFT_LEN + 1)).reshape(len(lengths), DRAFT_LEN + 1, VOCAB)
    q_rows = [list(sharp(n)) for n in lengths]
    drafts = [[int(inverse_cdf(row.astype(np.float64), rng.random())) for row in rows] for rows in q_rows]
    draws = rng.integers(0, VOCAB, size=(len(lengths), DRAFT_LEN + 1))
    return p_block, q_rows, drafts, draws


def streams(seed: int, count: int) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, b]) for b in range(count)]


def one_image(p_rows, q_rows, drafts, rule, rng, draws) -> tuple[int, int]:
    """The per-image definition, one position at a time: L + 1 uniforms from the image's stream; accept
    x̃_i while r_i ≤ rule.accept_probability; at the first rejection draw from rule.resample's row with
    the last uniform; else the bonus token (the head's draw from the row after the chain)."""
    uniforms = rng.random(len(drafts) + 1) if drafts else np.zeros(1)
    for i, token in enumerate(drafts):
        if uniforms[i] > rule.accept_probability(p_rows[i], q_rows[i], token, i + 1):
            row = rule.resample(np.asarray(p_rows[i], dtype=np.float64), np.asarray(q_rows[i], dtype=np.float64),
                                token, i + 1)
            return i, int(inverse_cdf(row, uniforms[len(drafts)]))
    return len(drafts), int(draws[len(drafts)])


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


def test_draws_without_replacement_take_held_first_candidates_as_drawn_from_q():
    """With the draft head's draws held (firsts), a row's candidates are that draw, then the rest from
    q without it (the row with the earlier ones zeroed, a fresh cumsum), from the same uniforms; the
    SJD-PAC helper draw_without_replacement(q, count, rng, first) is one such row; a level of one
    child per row draws no uniform and no CDF; a row without mass gives none."""
    from specrt.runtime.sampling import draw_from_cdf
    from specrt.runtime.verification import draw_without_replacement, draws_without_replacement

    def by_definition(row, count, first, rng):
        rest = row.astype(np.float64)
        tokens = [first] if count and row.any() else []
        rest[first] = 0.0
        while tokens and len(tokens) < min(count, int(np.count_nonzero(row))):
            tokens.append(draw_from_cdf(np.cumsum(rest), rng.random()))
            rest[tokens[-1]] = 0.0
        return tokens

    rng = np.random.default_rng(6)
    rows = rng.random((5, VOCAB)) * (rng.random((5, VOCAB)) < 0.6)
    rows[2] = 0.0
    firsts = [int(np.flatnonzero(row)[0]) if row.any() else 0 for row in rows]
    counts = [3, 1, 2, 4, 12]
    got = draws_without_replacement(rows, counts, np.random.default_rng(2), firsts)
    reference = np.random.default_rng(2)
    want = [by_definition(row, count, first, reference) for row, count, first in zip(rows, counts, firsts)]
    assert got == want and got[2] == [] and [g[0] for g in got if g] == [f for f, r in zip(firsts, rows) if r.any()]
    helper = np.random.default_rng(2)
    assert [draw_without_replacement(row, count, helper, first=first) for row, count, first
            in zip(rows, counts, firsts)] == [g or [f] for g, f in zip(got, firsts)]  # it keeps a held first
    stream = np.random.default_rng(2)
    assert draws_without_replacement(rows, [1, 1, 1, 0, 1], stream, firsts) == \
        [[firsts[0]], [firsts[1]], [], [], [firsts[4]]]
    assert stream.random() == np.random.default_rng(2).random()  # no uniform drawn


def test_rows_by_position_takes_per_image_blocks_and_uses_one_images_block_as_it_is():
    """A drafter may give each image's rows as one [L, V] block (an EAGLE head's chain call): the same
    q_block as lists of those rows, for a batch with chains of different lengths; a batch of one
    image gets a view of its block, not a copy."""
    rng = np.random.default_rng(4)
    blocks = [rng.random((n, VOCAB)) for n in (3, 1, 0, 2)]
    np.testing.assert_array_equal(rows_by_position(blocks)[:, [0, 1, 3]],
                                  rows_by_position([list(b) for b in blocks])[:, [0, 1, 3]])
    one = rows_by_position(blocks[:1])
    np.testing.assert_array_equal(one, rows_by_position([list(blocks[0])]))
    assert one.shape == (3, 1, VOCAB) and np.shares_memory(one, blocks[0])
    assert rows_by_position([blocks[2]]) is None


def test_lanterns_one_row_moved_target_is_the_blocks_row_bit_for_bit():
    """Eq. 6's moved target of one row (a batch-1 rejection, Python floats) equals the block's row
    for that token exactly, under both budgets, for budgets that keep none, some and all neighbours."""
    from specrt.runtime.verification import lantern_moved_target

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


@pytest.mark.parametrize("name", RULES)
def test_verify_chains_is_the_per_image_definition_and_each_image_its_own(name):
    """Every image's accepted length and next token equal the per-position definition run on its own
    rows with its own stream, over many random batches (rejections at every position included), and
    equal what the image gets verified alone."""
    rule = RULES[name]
    rejected_at = set()
    for seed in range(40):
        p_block, q_rows, drafts, draws = random_batch(seed)
        out = verify_chains(p_block, rows_by_position(q_rows), drafts, rule, streams(seed, len(drafts)), draws)
        for b, rng in enumerate(streams(seed, len(drafts))):
            expected = one_image(p_block[b], q_rows[b], drafts[b], rule, rng, draws[b])
            assert (int(out.accepted_lengths[b]), int(out.next_tokens[b])) == expected, (seed, b)
            alone = verify_chains(p_block[b:b + 1], rows_by_position(q_rows[b:b + 1]), drafts[b:b + 1], rule,
                                  streams(seed, len(drafts))[b:b + 1], draws[b:b + 1])
            assert (int(alone.accepted_lengths[0]), int(alone.next_tokens[0])) == expected
            if expected[0] < len(drafts[b]):
                rejected_at.add(expected[0])
    assert rejected_at == set(range(DRAFT_LEN))  # the check saw rejections at every position


@pytest.mark.parametrize("name", RULES)
def test_the_device_rounds_block_verification_is_the_per_image_definition(name):
    """verify_chain_block (the device round's verification: torch tensors, every image's chain at
    once, no shape that depends on an outcome) gives the per-image definition's outcome, image for
    image, with the same uniforms — the tests' L, then the draw after the accepted prefix — over many
    batches with rejections at every position, chains of every length down to none (`limits`), and
    the bonus token drawn from the row after the chain."""
    torch = pytest.importorskip("torch")
    from specrt.runtime.verification import verify_chain_block

    rule = RULES[name]
    rejected_at = set()
    for seed in range(40):
        p_block, q_rows, drafts, _ = random_batch(seed)
        count = len(drafts)
        uniforms = np.random.default_rng(seed).random((count, DRAFT_LEN + 1))
        q_block = np.full((count, DRAFT_LEN, VOCAB), 1.0 / VOCAB, dtype=np.float32)  # rows past a chain: unused
        drafted = np.zeros((count, DRAFT_LEN), dtype=np.int64)
        for b, (rows, chain) in enumerate(zip(q_rows, drafts)):
            if chain:
                q_block[b, : len(chain)] = rows
                drafted[b, : len(chain)] = chain
        limits = np.array([len(chain) for chain in drafts])
        next_u = uniforms[np.arange(count), limits]
        accepted, tokens = verify_chain_block(torch.from_numpy(p_block), torch.from_numpy(q_block),
                                              torch.from_numpy(drafted), torch.from_numpy(limits),
                                              torch.from_numpy(uniforms[:, :DRAFT_LEN]), torch.from_numpy(next_u), rule)
        for b, chain in enumerate(drafts):
            bonus = inverse_cdf(p_block[b, len(chain)].astype(np.float64), next_u[b])
            draws = np.full(DRAFT_LEN + 1, bonus)
            expected = one_image(p_block[b], q_rows[b], chain, rule, _Fixed(np.r_[uniforms[b, :len(chain)], next_u[b]]),
                                 draws)
            assert (int(accepted[b]), int(tokens[b])) == expected, (seed, b)
            if expected[0] < len(chain):
                rejected_at.add(expected[0])
    assert rejected_at == set(range(DRAFT_LEN))


class _Fixed:
    """A stand-in random stream handing out given uniforms (one_image draws them all at once)."""

    def __init__(self, values: np.ndarray):
        self.values = values

    def random(self, count: int) -> np.ndarray:
        assert count == len(self.values)
        return self.values


def test_the_device_rounds_re_test_of_stale_drafts_is_the_host_ones():
    """retest_block (SJD-PAC's adaptive continuation in the device round) gives verify_positions'
    token at every position with the same uniforms (n tests, then n residual draws), over draws with
    rejections and acceptances and rows equal to their stale row (a residual without mass: the
    block forms every row's fallback and must keep the draft there)."""
    torch = pytest.importorskip("torch")
    from specrt.runtime.verification import retest_block

    kept = resampled = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        count = 1 + seed % 7
        p_rows = rng.dirichlet(np.full(VOCAB, 0.3), size=count).astype(np.float32)
        q_rows = [rng.dirichlet(np.full(VOCAB, 0.3)).astype(np.float32) for _ in range(count)]
        if seed % 5 == 0:  # a stale row equal to its new one: an empty residual (its draft is kept)
            q_rows[0] = p_rows[0].copy()
        tokens = [int(rng.choice(VOCAB, p=q.astype(np.float64) / q.astype(np.float64).sum())) for q in q_rows]
        host = read_in_waves({0: positions_walk(p_rows, np.arange(count), q_rows, tokens,
                                                np.random.default_rng(seed + 99))})[0]
        uniforms = np.random.default_rng(seed + 99).random(2 * count)
        device = retest_block(torch.from_numpy(p_rows), torch.from_numpy(np.stack(q_rows)),
                              torch.tensor(tokens), torch.from_numpy(uniforms[:count]),
                              torch.from_numpy(uniforms[count:])).tolist()
        assert device == host, seed
        if seed % 5 == 0:
            assert device[0] == tokens[0], seed
        kept += sum(a == b for a, b in zip(host, tokens))
        resampled += sum(a != b for a, b in zip(host, tokens))
    assert kept and resampled


def test_views_that_read_what_they_index_are_read_entry_by_entry():
    """TensorRT's DeviceProbs reads a whole view for any array index: verify_chains reads it one entry
    (and one rejected row) at a time instead, never the whole block, with the same outcome."""
    from specrt.engines.trt_runner import DeviceProbs

    rule = RULES["cool-sd"]
    p_block, q_rows, drafts, draws = random_batch(4)
    q_block = rows_by_position(q_rows)
    host = verify_chains(p_block, q_block, drafts, rule, streams(4, len(drafts)), draws)
    reads = []

    def read(offset, count):
        reads.append(count)
        return p_block.reshape(-1)[offset:offset + count].copy()

    out = verify_chains(DeviceProbs(read, p_block.shape), q_block, drafts, rule, streams(4, len(drafts)), draws)
    np.testing.assert_array_equal(out.accepted_lengths, host.accepted_lengths)
    np.testing.assert_array_equal(out.next_tokens, host.next_tokens)
    assert max(reads) == VOCAB and set(reads) == {1, VOCAB}


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("schedule,budget", [("exp", 1.0), ("exp", 2.0), ("linear", 1.0), ("uniform", 0.6)])
def test_cool_sds_closed_form_g_star_is_g_star_of_its_acceptance_row(schedule, budget, dtype):
    """CoolRule.resample writes G* = Norm([P − Q·f]_+) as Norm(max(P − Q, (1 − ω)·P)) (Q·f = min(Q, ω·P)):
    the same rows as g_star(p, q, acceptance_row) by definition, one row and blocks, for ω above and
    below 1 (the exp schedule spans both; linear's late positions have ω ≤ 0; uniform 0.6 is below 1
    everywhere) and for tokens without draft or target mass."""
    from specrt.runtime.verification import g_star

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


def test_one_row_inverse_cdf_draws_what_the_block_path_draws():
    """draws_from_cdf's binary search for one row counts the same CDF entries at or below u·total as
    the block path, so a zero-mass token is never drawn, even at a boundary uniform."""
    from specrt.runtime.sampling import draws_from_cdf

    rng = np.random.default_rng(6)
    rows = rng.random((40, VOCAB)) * (rng.random((40, VOCAB)) < 0.5)
    rows[:, 3] = 0.0  # a token without mass in every row
    rows[:, 0] += 1e-3
    cdfs = np.cumsum(rows, axis=1)
    uniforms = np.concatenate([rng.random(37), [0.0, 1.0 - 1e-16, cdfs[39, 2] / cdfs[39, -1]]])
    block = draws_from_cdf(cdfs, uniforms)
    alone = [int(draws_from_cdf(cdfs[i:i + 1], uniforms[i:i + 1])[0]) for i in range(len(cdfs))]
    assert alone == block.tolist()
    assert all(rows[i, token] > 0 for i, token in enumerate(alone))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inverse_cdf_of_one_row_is_the_block_draw(dtype):
    """inverse_cdf on one row [V] (a batch-1 rejection) returns the int the block path [1, V] draws,
    for float32 and float64 rows, boundary uniforms and zero-mass tokens included."""
    rng = np.random.default_rng(7)
    rows = (rng.random((30, VOCAB)) * (rng.random((30, VOCAB)) < 0.6)).astype(dtype)
    rows[:, 5] = 0.0
    rows[:, 0] += dtype(1e-3)
    uniforms = np.concatenate([rng.random(27), [0.0, 1.0 - 1e-16, 0.5]])
    for row, u in zip(rows, uniforms):
        one = inverse_cdf(row, u)
        assert isinstance(one, int) and one == int(inverse_cdf(row[None], np.array([u]))[0])
        assert row[one] > 0


class ResampleFromTarget(VanillaRule):
    """Broken on purpose (G = P): the one-image path must reach a rule's own resample."""

    def resample(self, p, q, token, position):
        return np.asarray(p, dtype=np.float64)


def test_one_image_is_verified_with_the_rules_own_methods():
    """A batch of one image (verified position by position) calls the rule's accept_probability and
    resample as the batch path calls its block methods: an override of either is what decides."""
    rule = ResampleFromTarget()
    differs = 0
    for seed in range(30):
        p_block, q_rows, drafts, draws = random_batch(seed, lengths=[DRAFT_LEN])
        alone = verify_chains(p_block, rows_by_position(q_rows), drafts, rule, streams(seed, 1), draws)
        expected = one_image(p_block[0], q_rows[0], drafts[0], rule, streams(seed, 1)[0], draws[0])
        assert (int(alone.accepted_lengths[0]), int(alone.next_tokens[0])) == expected
        vanilla = verify_chains(p_block, rows_by_position(q_rows), drafts, VanillaRule(), streams(seed, 1), draws)
        differs += int(vanilla.next_tokens[0]) != expected[1]
    assert differs  # the broken resample changed some next tokens: the path used it


def test_a_search_without_drawn_candidates_is_the_fresh_cdf_search_and_never_returns_one():
    """_search_without reads q^(k)'s inverse CDF off the row's own CDF: the same token as a search of
    the CDF recomputed without the drawn candidates, for targets across the whole mass (many drawn,
    adjacent ones and the last entry included); and rounding that lands on a drawn candidate (forced
    here with a mass that disagrees with the row) falls back to the recomputed CDF."""
    from specrt.runtime.verification import _search_without

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
    candidates 1..k − 1 zeroed, a fresh cumsum) with the next uniform of the stream; a row with
    fewer tokens with mass than asked gives those and draws no uniform for the rest."""
    from specrt.runtime.sampling import draw_from_cdf
    from specrt.runtime.verification import draws_without_replacement

    rng = np.random.default_rng(8)
    rows = rng.random((6, VOCAB)) * (rng.random((6, VOCAB)) < 0.7)
    rows[1, :2], rows[1, 2:] = (0.3, 0.5), 0.0  # support 2, 4 asked
    rows[4] = 0.0  # no mass at all
    counts = [3, 4, 1, 5, 2, 12]

    def reference(rows, counts, rng):
        picked = []
        for row, count in zip(rows, counts):
            rest, tokens = row.astype(np.float64), []
            for _ in range(min(count, int(np.count_nonzero(rest)))):
                tokens.append(draw_from_cdf(np.cumsum(rest), rng.random()))
                rest[tokens[-1]] = 0.0
            picked.append(tokens)
        return picked

    got = draws_without_replacement(rows.astype(np.float32), counts, np.random.default_rng(9))
    ref_rng = np.random.default_rng(9)
    assert got == reference(rows.astype(np.float32), counts, ref_rng)
    assert len(got[1]) == 2 and got[4] == [] and len(set(got[5])) == len(got[5]) == np.count_nonzero(rows[5])
    stream = np.random.default_rng(9)
    stream.random(sum(map(len, got)))
    assert stream.random() == ref_rng.random()  # the same number of uniforms drawn
