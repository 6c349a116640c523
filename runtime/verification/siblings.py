"""Sibling candidates of one node: drawing them without replacement (SJD-PAC App. A.3, static
trees), the draft distribution each is verified against, and recursive rejection sampling over them.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from specrt.runtime.sampling import draw_from_cdf
from specrt.runtime.verification.formulas import normalise
from specrt.runtime.verification.rules import VANILLA, AcceptanceRule
from specrt.runtime.verification.transport import stack_rows

SAMPLED, TOP = "sampled", "top"  # how a node's children were drafted (runtime.tree)


def without_replacement(q: np.ndarray, taken: Sequence[int]) -> np.ndarray:
    """q^(k): the draft row with the already drawn candidates removed and renormalised (Eq. 7)."""
    if not len(taken):
        return q  # the first candidate is tested against q itself
    rest = np.array(q, dtype=np.float64)
    rest[list(taken)] = 0.0
    return normalise(rest, rest)


def draw_without_replacement(q: np.ndarray, count: int, uniforms: Sequence[float],
                             first: Optional[int] = None) -> list[int]:
    """`count` distinct candidates, candidate k drawn from q^(k) with uniforms[k]; `first` fixes
    candidate 1 when the caller already holds a draw from q (SJD-PAC keeps its adaptive-continuation
    token there, and keeps it even from a row without mass). One row of draws_without_replacement."""
    if first is None:
        return draws_without_replacement([q], [count], [uniforms])[0]
    return draws_without_replacement([q], [count], [uniforms], [first])[0] or [int(first)]


def draws_without_replacement(rows: Any, counts: Sequence[int], uniforms: Sequence[Sequence[float]],
                              firsts: Optional[Sequence[int]] = None) -> list[list[int]]:
    """draw_without_replacement(rows[r], counts[r], uniforms[r]) for each row (a tree level's nodes):
    min(counts[r], support) distinct candidates of row r, candidate k the inverse CDF of q^(k), the
    row without candidates 1..k − 1 (Eq. 7), not renormalised: its uniform is scaled by the mass
    left instead; a row whose mass runs out (≤ 1e-12 left) stops, so a row's support caps its
    candidates. Candidate k of row r is drawn with uniforms[r][k] (the caller's counter uniforms:
    each candidate's own coordinates, so a row that runs out leaves the others' draws as they are).
    `firsts[r]`, where given, is candidate 1 of row r, a draw from q the caller holds: no search
    for it (uniforms[r][0] is not read), and no CDF at all for a level whose rows want one
    candidate each.

    Every row's CDF is made once, in one block operation; q^(k)'s CDF is never formed: it is the
    row's CDF less the masses of the candidates at or before each entry, so a draw is a binary
    search of the row's CDF (_search_without). Recomputing the CDF's tail after each candidate cost
    a pass over V per candidate: at LlamaGen's V = 16384 a level of 4 rows and 11 candidates took
    464 µs that way and takes 259 µs now (of which 228 µs is the four rows' one cumsum)."""
    if firsts is not None and max(counts, default=0) <= 1:  # one child each: the held draws
        return [[int(first)] if count and np.asarray(row).sum() > 1e-12 else []
                for row, count, first in zip(rows, counts, firsts)]
    # [R, V]; a float64 copy first: cumsum casting float32 rows as it goes is ~3x slower (numpy 1.26);
    # entries are read from the copy (the same numbers): device rows are read back (stack_rows)
    if not isinstance(rows, np.ndarray) and not all(isinstance(row, np.ndarray) for row in rows):
        rows = stack_rows(rows)
    rows = np.asarray(rows, dtype=np.float64)  # a copy unless the caller's block is float64 already
    cdf = rows.cumsum(axis=1)
    picked: list[list[int]] = []
    for r, (row, row_cdf, total, count) in enumerate(zip(rows, cdf, cdf[:, -1].tolist(), counts)):
        if total <= 1e-12 or not count:
            picked.append([])
            continue
        row_uniforms = uniforms[r]
        # nothing drawn yet: the held draw, or the row's own inverse CDF
        tokens = [int(firsts[r]) if firsts is not None else draw_from_cdf(row_cdf, float(row_uniforms[0]))]
        if count > 1:
            drawn = [(tokens[0], float(row[tokens[0]]))]  # (candidate, its mass in q), in draw order
            left = total - drawn[0][1]
            while left > 1e-12 and len(tokens) < count:
                token = _search_without(row, row_cdf, float(row_uniforms[len(tokens)]) * left, drawn)
                tokens.append(token)
                drawn.append((token, float(row[token])))
                left = total - sum(m for _, m in drawn)
        picked.append(tokens)
    return picked


def _search_without(row: np.ndarray, cdf: np.ndarray, target: float, drawn: Sequence[tuple[int, float]]) -> int:
    """The inverse CDF of `row` (q, its CDF `cdf`) without the `drawn` candidates at `target` (an
    unnormalised u·mass): the first entry i whose CDF without them, cdf[i] − Σ_{c ≤ i} q_c, exceeds
    target, capped at V − 1 (with nothing drawn, sampling.draw_from_cdf's search).

    A search of cdf at target + the mass removed below the last answer finds it: the answer only
    moves right, each move past a drawn candidate adds that mass, so it settles within
    len(drawn) + 1 searches. Rounding that lands on a drawn candidate (a zero-mass entry; ~1e-16)
    falls back to the CDF recomputed without them."""
    shift = 0.0
    while True:
        token = int(cdf.searchsorted(target + shift, side="right"))
        below = sum(m for c, m in drawn if c <= token)
        if below == shift:
            break
        shift = below
    token = min(token, len(cdf) - 1)
    if any(c == token for c, _ in drawn):
        rest = np.array(row, dtype=np.float64)
        rest[[c for c, _ in drawn]] = 0.0
        fresh = np.cumsum(rest)
        token = min(int(fresh.searchsorted(target, side="right")), len(cdf) - 1)
    return token


def verify_siblings(p: np.ndarray, q: np.ndarray, candidates: Sequence[int], coins: Sequence[float],
                    next_uniform: float) -> tuple[Optional[int], int]:
    """Sequential rejection sampling over candidates c_1..c_K drawn without replacement from q.

    Candidate k is tested against the residual target p^(k) with the adjusted draft q^(k)
    (p^(1) = p, p^(k+1) = Norm([p^(k) − q^(k)]_+)); returns (index accepted or None, token).
    On total rejection the token is drawn from p^(K+1). Exact for any K (SJD-PAC Theorem 2).
    coins[k] tests candidate k; next_uniform draws the token after a total rejection.
    """
    return verify_candidates(p, candidate_proposals(q, candidates, SAMPLED), VANILLA, 1, coins, next_uniform)


def candidate_proposals(q: Any, candidates: Sequence[int], drawn: str,
                        vocab: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(token, the draft distribution it was drawn from) for the children c_1..c_K of one node, made
    lazily (verification stops at the first accepted child).

    SAMPLED: c_k was drawn from q^(k) = q without c_1..c_{k−1}, renormalised (sampling without
    replacement, EAGLE-1's and LANTERN's static trees, SJD-PAC's siblings).
    TOP: the children are the row's top-k tokens, a deterministic function of the draft's rows
    (EAGLE-2's dynamic trees), so c_k is a draw from the point mass on c_k. This is what EAGLE-2's
    evaluate_posterior does with `qx = 1.0` and `gtp[xi] = 0` on a rejection (the residual
    Norm([p − δ_x]_+) is p with x removed); testing the top-k tokens against q^(k) instead would not
    be exact, because they were never drawn from q.
    """
    for k, token in enumerate(candidates):
        if drawn == SAMPLED:
            yield int(token), without_replacement(q, candidates[:k])
        elif drawn == TOP:
            yield int(token), point_mass(int(token), vocab)
        else:
            raise ValueError(f"unknown drafting {drawn!r}")


def point_mass(token: int, vocab: int) -> np.ndarray:
    row = np.zeros(vocab, dtype=np.float64)
    row[token] = 1.0
    return row


def verify_candidates(p: np.ndarray, proposals: Iterable[tuple[int, np.ndarray]], rule: AcceptanceRule,
                      position: int, coins: Sequence[float], next_uniform: float) -> tuple[Optional[int], int]:
    """Recursive rejection sampling over the sibling candidates of one tree node (SpecInfer; EAGLE's
    evaluate_posterior): candidate k, drawn from q_k, is kept with the rule's f(p^(k), q_k, c_k); on a
    rejection the target becomes the rule's resampling distribution G(p^(k), q_k, c_k) and the next
    sibling is tried; after the last, the token is drawn from what remains. (index or None, token).

    For VanillaRule (f = min(1, p/q), G = Norm([p − q]_+)) this is exactly lossless whenever q_k is
    the distribution c_k was really drawn from given c_1..c_{k−1} (candidate_proposals): each step
    is one SD step from p^(k) with proposal q_k, which returns a draw from p^(k) when it accepts
    and a draw from p^(k+1) in the rejecting branch, so by induction over k the result is a draw
    from p (SJD-PAC Theorem 2 for draws without replacement; point masses are the K = 1 case of
    each step). With K = 1 it is one position of verify_chains. The relaxed rules are applied the
    same way, to the current residual p^(k) at every sibling: neither the Cool-SD paper nor
    LANTERN's defines multi-candidate verification; LANTERN's code (evaluate_posterior, _v1)
    likewise computes the relaxed p̃ on the residual at each sibling. Cool-SD's ω is that of the
    siblings' depth (draft position `position`, 1-based). coins[k] is candidate k's test uniform,
    next_uniform the draw after the last rejection (the caller's counter uniforms).
    """
    target = p
    for k, (token, q) in enumerate(proposals):
        if coins[k] <= rule.accept_probability(target, q, token, position):
            return k, int(token)
        target = rule.resample(target, q, token, position)
    return None, draw_from_cdf(np.cumsum(np.asarray(target)), next_uniform)
