"""runtime.verification.chains' batched chain verification against its one-row formulas.

verify_chains verifies a whole batch of drafted chains as array operations; these tests hold it to
the per-position definitions (each rule's accept_probability and resample, one row at a time), on
random rows with chains of different lengths, and check that an image's outcome depends on its own
rows and uniforms alone. Exactness through the public API is test_losslessness's and test_relaxed's.
"""
from __future__ import annotations

import numpy as np
import pytest

from _verification_cases import DRAFT_LEN, RULES, VOCAB, one_image, random_batch, uniforms
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.chains import verify_chains
from specrt.runtime.verification.rules import VanillaRule
from specrt.runtime.verification.transport import rows_by_position


@pytest.mark.parametrize("name", RULES)
def test_verify_chains_is_the_per_image_definition_and_each_image_its_own(name):
    """Every image's accepted length and next token equal the per-position definition run on its own
    rows with its own uniforms, over many random batches (rejections at every position included), and
    equal what the image gets verified alone."""
    rule = RULES[name]
    rejected_at = set()
    for seed in range(40):
        p_block, q_rows, drafts, draws = random_batch(seed)
        coins, nexts = uniforms(seed, len(drafts))
        out = verify_chains(p_block, rows_by_position(q_rows), drafts, rule, coins, nexts, draws)
        for b in range(len(drafts)):
            expected = one_image(p_block[b], q_rows[b], drafts[b], rule, coins[b], nexts[b], draws[b])
            assert (int(out.accepted_lengths[b]), int(out.next_tokens[b])) == expected, (seed, b)
            alone = verify_chains(p_block[b:b + 1], rows_by_position(q_rows[b:b + 1]), drafts[b:b + 1], rule,
                                  coins[b:b + 1], nexts[b:b + 1], draws[b:b + 1])
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
    from specrt.runtime.verification.chains import verify_chain_block

    rule = RULES[name]
    rejected_at = set()
    for seed in range(40):
        p_block, q_rows, drafts, _ = random_batch(seed)
        count = len(drafts)
        values = np.random.default_rng(seed).random((count, DRAFT_LEN + 1))
        q_block = np.full((count, DRAFT_LEN, VOCAB), 1.0 / VOCAB, dtype=np.float32)  # rows past a chain: unused
        drafted = np.zeros((count, DRAFT_LEN), dtype=np.int64)
        for b, (rows, chain) in enumerate(zip(q_rows, drafts)):
            if chain:
                q_block[b, : len(chain)] = rows
                drafted[b, : len(chain)] = chain
        limits = np.array([len(chain) for chain in drafts])
        next_u = values[np.arange(count), limits]
        accepted, tokens = verify_chain_block(torch.from_numpy(p_block), torch.from_numpy(q_block),
                                              torch.from_numpy(drafted), torch.from_numpy(limits),
                                              torch.from_numpy(values[:, :DRAFT_LEN]), torch.from_numpy(next_u), rule)
        for b, chain in enumerate(drafts):
            bonus = inverse_cdf(p_block[b, len(chain)].astype(np.float64), next_u[b])
            draws = np.full(DRAFT_LEN + 1, bonus)
            expected = one_image(p_block[b], q_rows[b], chain, rule, values[b, :len(chain)], next_u[b], draws)
            assert (int(accepted[b]), int(tokens[b])) == expected, (seed, b)
            if expected[0] < len(chain):
                rejected_at.add(expected[0])
    assert rejected_at == set(range(DRAFT_LEN))


def test_a_device_view_is_read_through_its_own_indexing_with_the_host_rows_outcome():
    """TensorRT's DeviceProbs reads a whole view for any array index: verify_chains gathers from it
    as from a host block (the tested entries, then the rejected rows: a read each), with the outcome
    of host rows."""
    from specrt.engines.trt_runner import DeviceProbs

    rule = RULES["cool-sd"]
    p_block, q_rows, drafts, draws = random_batch(4)
    q_block = rows_by_position(q_rows)
    host = verify_chains(p_block, q_block, drafts, rule, *uniforms(4, len(drafts)), draws)
    reads = []

    def read(offset, count):
        reads.append(count)
        return p_block.reshape(-1)[offset:offset + count].copy()

    out = verify_chains(DeviceProbs(read, p_block.shape), q_block, drafts, rule, *uniforms(4, len(drafts)), draws)
    np.testing.assert_array_equal(out.accepted_lengths, host.accepted_lengths)
    np.testing.assert_array_equal(out.next_tokens, host.next_tokens)
    assert reads == [p_block.size] * 2  # this batch has rejections


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
        coins, nexts = uniforms(seed, 1)
        alone = verify_chains(p_block, rows_by_position(q_rows), drafts, rule, coins, nexts, draws)
        expected = one_image(p_block[0], q_rows[0], drafts[0], rule, coins[0], nexts[0], draws[0])
        assert (int(alone.accepted_lengths[0]), int(alone.next_tokens[0])) == expected
        vanilla = verify_chains(p_block, rows_by_position(q_rows), drafts, VanillaRule(), coins, nexts, draws)
        differs += int(vanilla.next_tokens[0]) != expected[1]
    assert differs  # the broken resample changed some next tokens: the path used it
