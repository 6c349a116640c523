"""Grouped acceptance (GSD: So et al., "Grouped Speculative Decoding for Autoregressive Image
Generation", ICCV 2025): a drafted token is tested with the odds of its cluster, not its own.

Visual tokens are redundant: several tokens fit a position about as well. So the test of a drafted
token x is f(x) = min(1, Σ_{C(x)} p / Σ_{C(x)} q) over a cluster C(x) built per position from the
target's own row: rank the vocabulary by p (largest first, ties by token id), take the tokens ranked
within ±G/2 of x, and keep those whose probability lies within δ of p(x) and whose token embedding
lies within squared Euclidean distance d of x's. At a rejection the token is drawn from
Norm([p − q]_+), as in SD. x is always in its own cluster (offset 0, no probability gap, distance 0),
and G = 0 (or δ = 0, or d = 0 with distinct embeddings) leaves C(x) = {x}: plain SD's test. The output
is not p's distribution (the method is relaxed); because C(x) depends on p, f reads whole rows where
the other rules gather a few entries (AcceptanceRule.reads_rows).

Not that f(x) ≥ min(1, p(x)/q(x)) token by token: a neighbour the draft over-weights (q > p) lowers
the cluster's odds below x's own. What merging does give is, for clusters that partition the
vocabulary, an acceptance rate Σ_x q(x)f(x) = Σ_C min(P(C), Q(C)) ≥ Σ_x min(p(x), q(x)), plain SD's.
GSD's clusters overlap, so even that is not a theorem for them; tests/runtime/test_grouped_rule.py
measures both on random rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specrt.runtime.arrays import Constants, as_array, descending_order, is_host, namespace, unsorted
from specrt.runtime.verification.formulas import acceptance, residual
from specrt.runtime.verification.rules import AcceptanceRule


def grouped_masses(p: Any, q: Any, tokens: Any, embeddings: Any, half: int, gap: float,
                   radius: float) -> tuple[Any, Any]:
    """(Σ_{C(x)} p, Σ_{C(x)} q) for rows p, q [R, V] and tokens x [R, T] (T tokens tested against each
    row): [R, T] each, float64, in the rows' own array library (numpy or torch). On torch no shape
    depends on the numbers, so a device round traces it whole; numpy measures the embedding distance
    only of the candidates the rank and probability tests kept.

    C(x): the tokens at ranks rank(x) − half .. rank(x) + half of p's descending order (a stable sort:
    ties in token order, numpy and torch alike) with |p(x′) − p(x)| ≤ gap and
    ‖e(x′) − e(x)‖² ≤ radius, e = `embeddings` [V, D] where the rows live. Everything is computed in
    float64 from the entries it reads (the rows themselves are sorted as they are: widening float32
    keeps their order)."""
    xp = namespace(p)
    count = p.shape[0]
    rows = xp.reshape(xp.arange(count, device=getattr(p, "device", None)), (count, 1, 1))  # [R, 1, 1]
    members, inside = ranked_window(p, tokens, half)  # [R, T, G + 1]
    token_mass = xp.astype(p[rows[..., 0], tokens], xp.float64)  # [R, T]
    p_members, q_members = xp.astype(p[rows, members], xp.float64), xp.astype(q[rows, members], xp.float64)
    difference = p_members - token_mass[..., None]
    near = inside & (xp.maximum(difference, -difference) <= gap)
    kept = near & within_radius(embeddings, members, tokens, near, radius)
    return xp.sum(xp.where(kept, p_members, 0.0), axis=-1), xp.sum(xp.where(kept, q_members, 0.0), axis=-1)


def ranked_window(p: Any, tokens: Any, half: int) -> tuple[Any, Any]:
    """The tokens ranked rank(x) − half .. rank(x) + half in each row of p [R, V] (descending, ties
    in token order), for tokens x [R, T]: (members [R, T, 2·half + 1], inside: the rank exists)."""
    xp = namespace(p)
    count, vocab = p.shape
    device = getattr(p, "device", None)
    rows = xp.reshape(xp.arange(count, device=device), (count, 1))  # [R, 1]
    order = descending_order(p)  # order[r, k]: the token ranked k in row r
    ranks = unsorted(xp.zeros((count, vocab), dtype=xp.int64, device=device) + xp.arange(vocab, device=device),
                     order)  # ranks[r, v]: token v's rank in row r
    at = ranks[rows, tokens][..., None] + xp.arange(2 * half + 1, device=device) - half  # [R, T, G + 1]
    inside = (at >= 0) & (at < vocab)
    return order[rows[..., None], xp.minimum(xp.maximum(at, 0), vocab - 1)], inside


def within_radius(embeddings: Any, members: Any, tokens: Any, candidates: Any, radius: float) -> Any:
    """‖e(x′) − e(x)‖² ≤ radius for members x′ [R, T, G + 1] of tokens x [R, T], in float64. numpy
    measures only where `candidates` holds (elsewhere False: the caller's test has failed there);
    torch measures every member, so that no shape depends on the numbers."""
    if is_host(members):
        out = np.zeros(members.shape, dtype=bool)
        at = np.nonzero(candidates)
        offset = embeddings[members[at]].astype(np.float64) - embeddings[tokens[at[:2]]].astype(np.float64)
        out[at] = np.sum(offset * offset, axis=-1) <= radius
        return out
    xp = namespace(members)
    offset = xp.astype(embeddings[members], xp.float64) - xp.astype(embeddings[tokens], xp.float64)[..., None, :]
    return xp.sum(offset * offset, axis=-1) <= radius


@dataclass
class GroupedRule(AcceptanceRule):
    """GSD's test: f(x) = min(1, Σ_{C(x)} p / Σ_{C(x)} q) (grouped_masses), resampling Norm([p − q]_+).

    `group` G: the cluster's candidates are the tokens ranked within ±G/2 of x (GSD's code: ±7);
    `gap` δ: |p(x′) − p(x)| ≤ δ; `radius` d: squared L2 distance between token embeddings ≤ d, in
    the embeddings' own units (the method scales its parameter to them). Whole rows in, as
    `reads_rows` says: accept_rows instead of columns / accept_probabilities."""

    embeddings: np.ndarray  # [V, D]: the target's token embeddings, one row per token of its vocabulary
    group: int = 14
    gap: float = 0.15
    radius: float = 0.5
    reads_rows = True
    _on_device: Constants = field(default_factory=Constants, init=False, repr=False, compare=False)

    def _embeddings(self, like: Any) -> Any:
        return self._on_device.get("embeddings", lambda: self.embeddings, like)

    def prepare(self, like: Any) -> None:
        self._embeddings(like)

    def grouped(self, p: Any, q: Any, tokens: Any) -> tuple[Any, Any]:
        """grouped_masses for rows p, q [..., V] and one token per row [...] (or, for one row [V], the
        tokens [T] tested against it): the cluster masses, shaped as `tokens`."""
        p, q = as_array(p), as_array(q)
        xp = namespace(p)
        tokens = as_array(tokens)
        vocab = p.shape[-1]
        if p.ndim == 1:  # one row, any number of tokens
            shape, p, q, tokens = tokens.shape, p[None], q[None], xp.reshape(tokens, (1, -1))
        else:
            shape, p, q = tokens.shape, xp.reshape(p, (-1, vocab)), xp.reshape(q, (-1, vocab))
            tokens = xp.reshape(tokens, (-1, 1))
        p_mass, q_mass = grouped_masses(p, q, xp.astype(tokens, xp.int64), self._embeddings(p), self.group // 2,
                                        self.gap, self.radius)
        return xp.reshape(p_mass, shape), xp.reshape(q_mass, shape)

    def accept_rows(self, p: Any, q: Any, tokens: Any, positions: Any) -> Any:
        return acceptance(*self.grouped(p, q, tokens))

    def accept_probability(self, p, q, token, position):
        return float(self.accept_rows(np.asarray(p), np.asarray(q), np.asarray(int(token)), position))

    def acceptance_row(self, p, q, position):
        """f at every token of one row [V] (Theorem 2's quantities and the one-step output law)."""
        p = as_array(p)
        xp = namespace(p)
        return self.accept_rows(p, q, xp.arange(p.shape[-1], device=getattr(p, "device", None)), position)

    def resample(self, p, q, token, position):
        return residual(p, q)
