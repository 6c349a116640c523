"""Exact output distributions of tree drafting (sd and cool-sd, static and dynamic trees) on the toy
family, by enumerating every round: what test_planted_bugs compares the pipeline's trees with.

Written from the definitions in float64 over the reference rows of _toy_exact (no runtime code):
- a static tree's node with K shape children draws K distinct tokens from the draft's row q, child
  k from q^(k) (q with children 1..k−1 removed, renormalised); a dynamic tree (EAGLE-2) keeps the
  top_k tokens of each expanded row, expands the top_k best nodes of each depth by cumulative draft
  log-probability and keeps the total_tokens best nodes of all; its children are point masses;
- the children of a node at depth d − 1 are verified one after another (recursive rejection):
  child k, drawn from q_k, is kept with f = min(1, ω_d·p^(k)(c_k)/q_k(c_k)); at a rejection the
  target becomes G* = Norm([p^(k) − q_k·f(·)]_+) (f at every token; ω = 1 is SD's residual); after
  the last child the token is drawn from what remains; at a leaf it is the bonus token from P;
- a round's tree reaches at most the tokens left in the image after the pending one.
`siblings_against_q` tests every static sibling against q itself (a planted bug's distribution).
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional, Sequence

import numpy as np

from _toy_exact import next_token_row
from specrt.runtime.backends.toy import ToyLM
from specrt.runtime.sampling import SamplingParams

Row = Callable[[tuple[int, ...]], np.ndarray]


def exp_weights(positions: int, relaxation_budget: float, decay: float = 0.7) -> np.ndarray:
    """Cool-SD Eq. 16 over draft positions 1..L (L = the tree's depth): ω_i ∝ e^(−ν·i), Σ ω_i = δ·L."""
    i = np.arange(1, positions + 1)
    return relaxation_budget * positions * np.exp(-decay * i) / np.exp(-decay * i).sum()


def _ordered_draws(q: np.ndarray, count: int):
    """(c_1..c_K, probability) of K draws without replacement from q, K = min(count, support)."""
    for order in itertools.permutations(range(len(q)), min(count, int(np.count_nonzero(q)))):
        prob, left = 1.0, 1.0
        for token in order:
            prob, left = prob * q[token] / left, left - q[token]
        if prob > 0:
            yield order, prob


def _without(q: np.ndarray, taken: Sequence[int]) -> np.ndarray:
    rest = np.array(q, dtype=np.float64)
    rest[list(taken)] = 0.0
    return rest / rest.sum()


def _point(token: int, vocab: int) -> np.ndarray:
    row = np.zeros(vocab)
    row[token] = 1.0
    return row


def _relaxed(p: np.ndarray, q: np.ndarray, omega: float) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """f at every token, and G* (None where it has no mass: that branch has probability zero)."""
    f = np.ones_like(p)
    f[q > 0] = np.minimum(1.0, omega * p[q > 0] / q[q > 0])
    mass = np.maximum(p - q * f, 0.0)
    return f, (mass / mass.sum() if mass.sum() > 1e-15 else None)


def _dynamic_tree(Q: Row, prefix: tuple[int, ...], vocab: int, depth: int, top_k: int,
                  total_tokens: int) -> dict[tuple[int, ...], list[int]]:
    """EAGLE-2's tree below the pending token: {token path below the root: its kept children, most
    probable first}."""
    scores: dict[tuple[int, ...], float] = {}
    frontier = [()]
    for _ in range(depth):
        level = {}
        for path in frontier:
            q = Q(prefix + path)
            for token in sorted(range(vocab), key=lambda t: -q[t])[:top_k]:
                if q[token] > 0:
                    level[path + (token,)] = scores.get(path, 0.0) + float(np.log(q[token]))
        scores.update(level)
        frontier = sorted(level, key=lambda path: -level[path])[:top_k]
    kept = sorted(scores, key=lambda path: -scores[path])[:total_tokens]
    children: dict[tuple[int, ...], list[int]] = {}
    for path in sorted(kept, key=lambda path: -scores[path]):
        children.setdefault(path[:-1], []).append(path[-1])
    return children


def tree_distribution(target_lm: ToyLM, draft_lm: ToyLM, condition: int, null: int, vocab: int, length: int,
                      sampling: SamplingParams, *, static: Optional[Sequence[Sequence[int]]] = None,
                      dynamic: Optional[dict] = None, omega: Optional[np.ndarray] = None,
                      siblings_against_q: bool = False) -> dict[tuple[int, ...], float]:
    """P(x_1..x_length) of tree drafting: `static` a shape (paths of child ranks, as runtime.tree's
    STATIC_TREES) or `dynamic` {depth, top_k, total_tokens}; `omega` ω_1.. by depth (Cool-SD),
    None for SD."""
    P: Row = lambda prefix: next_token_row(target_lm, condition, null, prefix, sampling)  # noqa: E731
    Q: Row = lambda prefix: next_token_row(draft_lm, condition, null, prefix, sampling)  # noqa: E731
    ranks: dict[tuple[int, ...], int] = {}  # shape path -> number of children
    for path in static or ():
        ranks[tuple(path[:-1])] = max(ranks.get(tuple(path[:-1]), 0), path[-1] + 1)

    def siblings(p, proposals, depth, below):
        """{appended tokens: probability} of verifying ordered children (token, q_k) at `depth`."""
        out: dict[tuple[int, ...], float] = {}
        target, reach = p, 1.0
        for k, (token, q) in enumerate(proposals):
            f, g = _relaxed(target, q, 1.0 if omega is None else omega[depth - 1])
            if f[token] > 0:
                for rest, prob in below(k, token).items():
                    out[(token,) + rest] = out.get((token,) + rest, 0.0) + reach * f[token] * prob
            reach *= 1.0 - f[token]
            if reach <= 0 or g is None:
                return out
            target = g
        for token in range(vocab):
            out[(token,)] = out.get((token,), 0.0) + reach * target[token]
        return out

    def static_node(context, shape_path, depth, max_depth):
        p = P(context)
        count = ranks.get(shape_path, 0)
        if count == 0 or depth >= max_depth:
            return {(t,): p[t] for t in range(vocab)}
        q = Q(context)
        out: dict[tuple[int, ...], float] = {}
        for order, prob in _ordered_draws(q, count):
            proposals = [(c, q if siblings_against_q else _without(q, order[:k])) for k, c in enumerate(order)]
            below = lambda k, c: static_node(context + (c,), shape_path + (k,), depth + 1, max_depth)  # noqa: E731
            for key, w in siblings(p, proposals, depth + 1, below).items():
                out[key] = out.get(key, 0.0) + prob * w
        return out

    def dynamic_node(context, tree, path, depth):
        p = P(context)
        kids = tree.get(path, [])
        if not kids:
            return {(t,): p[t] for t in range(vocab)}
        below = lambda k, c: dynamic_node(context + (c,), tree, path + (c,), depth + 1)  # noqa: E731
        return siblings(p, [(c, _point(c, vocab)) for c in kids], depth + 1, below)

    def round_(prefix):
        max_depth = length - len(prefix) - 1
        if static is not None:
            return static_node(prefix, (), 0, max_depth)
        tree = _dynamic_tree(Q, prefix, vocab, min(dynamic["depth"], max_depth), dynamic["top_k"],
                             dynamic["total_tokens"])
        return dynamic_node(prefix, tree, (), 0)

    out: dict[tuple[int, ...], float] = {}

    def rounds(prefix, weight):
        if len(prefix) == length:
            out[prefix] = out.get(prefix, 0.0) + weight
            return
        for new, prob in round_(prefix).items():
            if prob > 0:
                rounds(prefix + new, weight * prob)

    first = P(())
    for token in range(vocab):
        rounds((token,), first[token])
    return out
