"""Measured sibling acceptance, the input a tree plan is solved from (runtime.tree_plan): a_r(d) per
depth and rank (Sequoia's positional acceptance, made per depth).

a_r(d) = the probability that the child of rank r (0-based: the (r+1)-th drawn without replacement,
or the (r+1)-th best for top-k trees) at depth d (1-based: the root's children are depth 1) is the
one accepted, given that its parent was reached and has at least r + 1 children. Verification tries
siblings in rank order, so whether rank r is accepted does not depend on how many siblings come
after it, and the ranks' events are exclusive: Σ_r a_r(d) ≤ 1.

Why per depth: acceptance can change with depth (the demo's EAGLE head: a_0 0.77 at depth 1,
0.61-0.71 deeper, as its own features stand in for the target's; the draft GPT's is flat), and one
pooled vector then misprices deep paths against wide shallow ones.
Pure Python and numpy-free on purpose: the runtime reads plans with nothing else loaded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from specrt.errors import SpecrtError

# m, the pooled rate's weight in each depth's estimate, in visits (RankCounts.acceptance_by_depth). Why 20:
# a 32-image probe (6 levels; the default is 48) reaches its deepest level 55-70 times, where a depth's own
# rate still weighs about 3/4, while a level seen a handful of times (a short probe) is mostly pooled.
PRIOR_VISITS = 20.0

Acceptance = Sequence[Sequence[float]]  # a_r(d): [depth − 1][rank]; the deepest row serves every deeper depth


@dataclass
class RankCounts:
    """Verification outcomes by depth and sibling rank: `tried_by_depth[d − 1][r]` = visits of a
    node at depth d − 1 with more than r children (its rank-r child, at depth d, could have been
    accepted), `accepted_by_depth[d − 1][r]` = visits where it was. `tried` and `accepted` are the
    per-rank totals over all depths."""

    tried_by_depth: list[list[int]] = field(default_factory=list)
    accepted_by_depth: list[list[int]] = field(default_factory=list)

    @property
    def tried(self) -> list[int]:
        return _column_sums(self.tried_by_depth)

    @property
    def accepted(self) -> list[int]:
        return _column_sums(self.accepted_by_depth)

    def add(self, children: Sequence[Sequence[int]], path: Sequence[int]) -> None:
        """One verified round: `children[n]` are node n's children in verification order and `path`
        the nodes the walk accepted, root first (runtime.verification.trees.TreeOutcome.path), so path[i]
        is at depth i and its children at depth i + 1. Every node of the path that has children was
        visited; the next node of the path is the child accepted there, and a visited node last on
        the path rejected all its children."""
        for depth, node in enumerate(path):
            kids = children[node]
            if not kids:
                continue  # a leaf: the bonus token, no sibling test
            tried, accepted = self._row(depth, len(kids))
            for rank in range(len(kids)):
                tried[rank] += 1
            if depth + 1 < len(path):
                accepted[kids.index(path[depth + 1])] += 1

    def _row(self, depth: int, ranks: int) -> tuple[list[int], list[int]]:
        while len(self.tried_by_depth) <= depth:
            self.tried_by_depth.append([])
            self.accepted_by_depth.append([])
        tried, accepted = self.tried_by_depth[depth], self.accepted_by_depth[depth]
        while len(tried) < ranks:
            tried.append(0)
        while len(accepted) < len(tried):
            accepted.append(0)
        return tried, accepted

    def acceptance(self) -> list[float]:
        """The pooled a_r (all depths together) = accepted[r] / tried[r], made non-increasing (each
        a_r at most the one before).

        Why non-increasing: the tree solver's best-n-paths argument needs it, and a later rank
        accepted more often than an earlier one is sampling noise (or a draft whose later draws
        are better than its first, which no draft-then-verify scheme assumes); lowering the
        estimate only keeps the plan from relying on it. Ranks never tried are left out."""
        return _non_increasing(_rates(self.tried, self.accepted))

    def acceptance_by_depth(self, prior_visits: float = PRIOR_VISITS) -> list[list[float]]:
        """a_r(d) for every depth visited, each row made non-increasing in r (as the pooled one) and
        as long as the pooled vector:

            a_r(d) = (accepted_d[r] + m · p_r) / (tried_d[r] + m),   p_r = the pooled rate, m = prior_visits

        Why this rule: it is the posterior mean of a rate whose Beta prior is centred on the pooled
        rate and worth m visits (empirical Bayes shrinkage), so a depth visited far more than m times
        keeps its own rate, a rarely visited one (deep levels: they are reached only through
        accepted rank-0 nodes) borrows from all depths, and the weight moves smoothly with the
        visits instead of jumping at a threshold; a depth that never offered rank r gets p_r. With
        m = 0 each depth stands alone (a rank it never tried: p_r). The pooled rate is the raw one
        (not its non-increasing version), so every row is the same kind of estimate before its own
        ranks are made non-increasing. Depths beyond the last row use the last row (`rates_at`)."""
        if not (isinstance(prior_visits, (int, float)) and math.isfinite(prior_visits) and prior_visits >= 0):
            raise SpecrtError(f"prior_visits must be a finite number ≥ 0, got {prior_visits!r}")
        pooled = _rates(self.tried, self.accepted)
        rows: list[list[float]] = []
        for tried, accepted in zip(self.tried_by_depth, self.accepted_by_depth):
            row = []
            for rank, p in enumerate(pooled):
                t = tried[rank] if rank < len(tried) else 0
                k = accepted[rank] if rank < len(accepted) else 0
                row.append(p if t + prior_visits == 0 else (k + prior_visits * p) / (t + prior_visits))
            rows.append(_non_increasing(row))
        while rows and not any(self.tried_by_depth[len(rows) - 1]):
            rows.pop()  # a trailing depth never visited: the one before it serves
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"tried": self.tried, "accepted": self.accepted,
                "tried_by_depth": self.tried_by_depth, "accepted_by_depth": self.accepted_by_depth}


def _column_sums(rows: Sequence[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for row in rows:
        out.extend([0] * (len(row) - len(out)))
        for rank, value in enumerate(row):
            out[rank] += value
    return out


def _rates(tried: Sequence[int], accepted: Sequence[int]) -> list[float]:
    """accepted / tried per rank, up to the first rank never tried."""
    out: list[float] = []
    for t, k in zip(tried, accepted):
        if t == 0:
            break
        out.append(k / t)
    return out


def _non_increasing(rates: Sequence[float]) -> list[float]:
    out: list[float] = []
    for rate in rates:
        out.append(min(rate, out[-1]) if out else rate)
    return out


def by_depth(acceptance: Acceptance | Sequence[float]) -> list[list[float]]:
    """The a_r(d) table of `acceptance`: one row per depth (depth 1 first), or one vector of numbers,
    which is then one row serving every depth (the pooled model)."""
    if _is_vector(acceptance):
        return [list(acceptance)] if len(acceptance) else []  # type: ignore[arg-type]
    return [list(row) if isinstance(row, (list, tuple)) else row for row in acceptance]  # type: ignore[misc]


def _is_vector(acceptance: Any) -> bool:
    """One vector of numbers (the pooled model), rather than a row per depth."""
    return all(isinstance(v, (int, float)) for v in acceptance)


def rates_at(table: Sequence[Sequence[float]], depth: int) -> Sequence[float]:
    """a_·(depth) (1-based): its row, or the deepest row past the measured depths (the nearest
    measured depth is the best guess for deeper levels; repeating the first would over-predict
    them where acceptance falls with depth)."""
    return table[min(depth, len(table)) - 1]



def check_acceptance(acceptance: Acceptance | Sequence[float]) -> None:
    """SpecrtError unless every a_r(d) is a probability and each depth's do not increase with r."""
    table, nested = by_depth(acceptance), not _is_vector(acceptance)
    for depth, row in enumerate(table, 1):
        where = f" at depth {depth}" if nested else ""
        if not isinstance(row, (list, tuple)):
            raise SpecrtError(f"acceptance{where} must be a list of probabilities, got {row!r}")
        for rank, value in enumerate(row):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and 0.0 <= value <= 1.0):
                raise SpecrtError(f"acceptance a_{rank}{where} must be a probability in [0, 1], got {value!r}")
            if rank and value > row[rank - 1] + 1e-12:
                raise SpecrtError(f"acceptance must not increase with the sibling rank: a_{rank}{where} = "
                                  f"{value:g} > a_{rank - 1} = {row[rank - 1]:g}")

