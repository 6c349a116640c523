"""Verifying drafted chains (SD, Cool-SD, LANTERN): a prefix of each image's drafts accepted and
one token drawn after it, for a batch of images at once, on the host (verify_chains) or where the
rows live (verify_chain_block, the device round's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.arrays import namespace
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.rules import AcceptanceRule
from specrt.runtime.verification.transport import gather

FIRST_ROWS = 4  # positions a whole-row rule tests first: most windows reject within them (τ ≈ 2-3 on the demo)


@dataclass
class ChainOutcomes:
    """Per image of a batch: the accepted length τ, and the token sampled after the accepted prefix
    (resampled at the first rejection, or the bonus token). Python ints: the loop reads them as such."""

    accepted_lengths: list[int]
    next_tokens: list[int]


def verify_chains(p_block: Any, q_block: Any, drafts: Sequence[Sequence[int]], rule: AcceptanceRule,
                  coins: np.ndarray, next_uniforms: np.ndarray, draws: Any) -> ChainOutcomes:
    """Cool-SD Alg. 1 lines 4-17 for every image of a batch: accept x̃_i while r_i ≤ f_i; at the first
    rejection sample G_i; if all of an image's drafts are accepted its next token is the head's
    draw from its P_{L+1} (the bonus token).

    p_block [images, ≥ L+1, V] with draws [images, ≥ L+1], the target step's rows and the head's
    draw from each: image b's row i predicts its draft i + 1, and draws[b, L_b] is its bonus token.
    q_block [L, images, V]: row (i, b) is the draft distribution image b's draft i + 1 was drawn
    from (one draft pass per position, over the batch; rows_by_position builds it from per-image
    lists). Chains may differ in length, down to none (the bonus token, no uniforms drawn); rows
    past an image's own chain are never used. Rows may be device views: `gather` reads what is tested.

    As array operations over the batch padded to the longest chain L: P and Q at the drafted tokens
    (and whatever else the rule's f reads, rule.columns) in one gather each, every f_i at once, the
    first rejection per image as the count of leading passes; then the resampling rows of the
    rejected images only, as one [R, V] block sampled by inverse CDF. The only whole rows read are
    the two of each rejection; a rule whose f reads whole rows (GSD's) reads each image's rows up to
    its first rejection instead (leading_passes_on_rows).

    Uniforms: coins [images, ≥ L] (image b's test of draft i + 1 in coins[b, i]) and next_uniforms
    [images] (the draw from G at a rejection), the caller's (the round's TEST and NEXT counter
    uniforms: runtime.decoding), so what an image uses depends on its own chain alone and it is the
    same alone or in any batch. As exact as testing position by position with fresh uniforms: the
    tests' uniforms are independent, and the resampling uniform is independent of them.

    A batch of one image on host rows goes position by position instead (_verify_one_chain); device
    rows (the PyTorch backend's DeviceRows) are verified here like host rows, the tested entries
    gathered and a rejection's rows read back. The device round verifies where the rows live
    instead, with verify_chain_block.
    """
    if len(drafts) == 1 and isinstance(p_block, np.ndarray) and isinstance(q_block, (np.ndarray, type(None))):
        return _verify_one_chain(p_block, q_block, drafts[0], rule, coins[0], float(next_uniforms[0]), draws)
    count, sizes = len(drafts), [len(chain) for chain in drafts]
    lengths, images = np.array(sizes, dtype=np.int64), np.arange(count)
    longest = max(sizes, default=0)
    if longest == 0:
        return ChainOutcomes([0] * count, np.asarray(draws)[images, lengths].tolist())
    tokens = np.array([[*chain, *[0] * (longest - len(chain))] for chain in drafts], dtype=np.int64)  # pads: 0
    coins = np.asarray(coins, dtype=np.float64)[:, :longest]
    next_tokens = np.asarray(draws)[images, lengths].astype(np.int64, copy=False)  # bonus tokens; rejections below
    steps = np.arange(longest)
    if rule.reads_rows:  # f reads whole rows (GSD): the rows up to each image's first rejection
        accepted = leading_passes_on_rows(rule, p_block, q_block, tokens, coins, lengths)
    else:
        q_at = gather(q_block, (steps, images[:, None], tokens))  # [images, L]
        p_at = gather(p_block, (images[:, None, None], steps[:, None], rule.columns(tokens)))  # [images, L, c]
        f = rule.accept_probabilities(p_at, q_at, steps + 1)
        passed = np.zeros((count, longest + 1), dtype=bool)  # a failed test after the last: argmin finds one
        np.less_equal(coins, f, out=passed[:, :longest])
        accepted = np.minimum(passed.argmin(axis=1), lengths)  # leading passes within the chain: τ
    rejected = np.flatnonzero(accepted < lengths)
    if rejected.size:
        at = accepted[rejected]
        p_rows, q_rows = gather(p_block, (rejected, at)), gather(q_block, (at, rejected))  # [R, V] each
        resampled = rule.resample(p_rows, q_rows, tokens[rejected, at], at + 1)
        next_tokens[rejected] = inverse_cdf(resampled, np.asarray(next_uniforms, dtype=np.float64)[rejected])
    return ChainOutcomes(accepted.tolist(), next_tokens.tolist())


def verify_chain_block(p: Any, q: Any, drafted: Any, limits: Any, coins: Any, next_uniforms: Any,
                       rule: AcceptanceRule) -> tuple[Any, Any]:
    """verify_chains as the device round runs it: every image's chain at once, in the rows' own array
    library, with no array shape that depends on an outcome (finding the rejected images would make
    the host wait). (accepted τ [I], next token [I]).

    p [I, L + 1, V]: row j predicts draft j + 1 (row L the bonus position); q [I, L, V] the rows the
    drafts drafted [I, L] were drawn from; limits [I]: how many of an image's drafts may count (fewer
    near the image's end, 0 for none); coins [I, L] the tests' uniforms, next_uniforms [I] the one
    draw after the accepted prefix. Every image's pair of rows at its first failed test is resampled
    from rule.resample and its bonus row drawn from, and the one that applies is kept: the same
    tests and draws as verify_chains makes with the same uniforms (tests/runtime/test_verification_chains.py)."""
    xp = namespace(p)
    count, longest = drafted.shape
    images, steps = xp.arange(count, device=p.device), xp.arange(longest, device=p.device)
    if rule.reads_rows:  # f reads whole rows (GSD)
        f = rule.accept_rows(p[:, :longest], q, drafted, steps + 1)
    else:
        q_at = xp.astype(q[images[:, None], steps, drafted], xp.float64)  # [I, L]
        p_at = xp.astype(p[images[:, None, None], steps[:, None], rule.columns(drafted)], xp.float64)  # [I, L, c]
        f = rule.accept_probabilities(p_at, q_at, steps + 1)
    passed = (coins <= f) & (steps < limits[:, None])
    accepted = xp.sum(xp.astype(xp.cumulative_sum(xp.astype(~passed, xp.int64), axis=1) == 0, xp.int64), axis=1)
    stop = xp.minimum(accepted, longest - 1)
    resampled = inverse_cdf(rule.resample(p[images, stop], q[images, stop], drafted[images, stop], stop + 1),
                            next_uniforms)
    bonus = inverse_cdf(p[images, accepted], next_uniforms)
    return accepted, xp.where(accepted < limits, resampled, bonus)


def leading_passes_on_rows(rule: AcceptanceRule, p_block: Any, q_block: Any, tokens: np.ndarray, coins: np.ndarray,
                           lengths: np.ndarray) -> np.ndarray:
    """τ per image for a rule that reads whole rows (rule.reads_rows: GSD's cluster sorts each row it
    tests): the leading passes r ≤ f within each chain, f evaluated a few positions at a time
    (FIRST_ROWS, then twice as many each time) for the images whose tests have all passed so far,
    so a row after an image's first rejection is never read. The same τ as testing every position:
    f at a position depends on that position's rows and token alone.

    p_block [images, ≥ L + 1, V], q_block [L, images, V] (as verify_chains), tokens [images, L]
    (padded), coins [images, ≥ L], lengths [images]: each chain's own length."""
    count, longest = tokens.shape
    accepted = np.zeros(count, dtype=np.int64)
    going = np.flatnonzero(lengths > 0)
    start, width = 0, FIRST_ROWS
    while going.size and start < longest:
        stop = min(start + width, longest)
        steps = np.arange(start, stop)
        f = rule.accept_rows(gather(p_block, (going[:, None], steps)), gather(q_block, (steps, going[:, None])),
                             tokens[going, start:stop], steps + 1)
        passed = (coins[going, start:stop] <= np.asarray(f)) & (steps < lengths[going, None])
        leading = np.cumprod(passed, axis=1).sum(axis=1)  # passes before the first failure
        accepted[going] = start + leading
        going = going[(leading == stop - start) & (lengths[going] > stop)]
        start, width = stop, 2 * width
    return accepted


def _verify_one_chain(p_block: np.ndarray, q_block: Optional[np.ndarray], chain: Sequence[int], rule: AcceptanceRule,
                      coins: Any, next_uniform: float, draws: np.ndarray) -> ChainOutcomes:
    """verify_chains for a batch of one image on host rows: the same uniforms, tests and
    resampling, position by position in Python floats (rule.accept_probability, the tree
    siblings' test; a rule without scalar_tests evaluates the chain's f in one block, and one that
    reads whole rows the rows up to the first rejection, as the batch path does). Between
    two graph runs the caches are cold and each distinct numpy call costs 5-15 us, several times
    its warm cost; the batch path's twenty-odd calls were half of a batch-1 round's host work.
    Identical outcomes: tests/runtime compare it with the batch path and the per-position
    definition."""
    size = len(chain)
    if size == 0:
        return ChainOutcomes([0], [int(draws[0, 0])])
    p_rows, q_rows = p_block[0], q_block[:, 0]
    if rule.reads_rows:  # f reads whole rows (GSD): the rows up to the first rejection, as the batch path
        accepted = int(leading_passes_on_rows(rule, p_block, q_block, np.array([chain], dtype=np.int64),
                                              np.asarray(coins, dtype=np.float64)[None, :size],
                                              np.array([size]))[0])
    else:
        uniforms = np.asarray(coins, dtype=np.float64)[:size].tolist()  # as the batch path: the L tests
        if rule.scalar_tests:
            def f_at(i: int) -> float:
                return rule.accept_probability(p_rows[i], q_rows[i], chain[i], i + 1)
        else:  # f of every position in one block evaluation (a rule without a scalar test)
            steps, tokens = np.arange(size), np.array(chain)
            f_at = rule.accept_probabilities(gather(p_rows, (steps[:, None], rule.columns(tokens))),
                                             gather(q_rows, (steps, tokens)), steps + 1).tolist().__getitem__
        accepted = next((i for i in range(size) if uniforms[i] > f_at(i)), size)
    if accepted == size:
        return ChainOutcomes([size], [int(draws[0, size])])
    # G from the two rows as they are (float32 from a graph): every rule's resample computes in
    # float64, as it does for the batch path's [R, V] block, so the bits are the same
    resampled = rule.resample(p_rows[accepted], q_rows[accepted], chain[accepted], accepted + 1)
    return ChainOutcomes([accepted], [inverse_cdf(resampled, next_uniform)])
