"""Static trees sized for the device (Sequoia's idea): the shape that drafts the most tokens per
second, from measured sibling acceptance and measured step latencies.

Why: a bigger tree accepts more tokens per target pass, but a pass over W tokens costs t(W).
On a GPU t(W) is flat far beyond 64 tokens, so a 25-node tree pays; on a CPU the demo target's
t(26) is about 2.2 t(5), and the same tree is slower than a chain. No one shape suits both: the
shape has to follow the device, so `specrt plan-tree` measures both sides and solves.

The model (Sequoia's positional acceptance, made per depth):
- a_r(d) = the probability that the child of rank r (0-based: the (r+1)-th drawn without
  replacement, or the (r+1)-th best for top-k trees) at depth d (1-based: the root's children are
  depth 1) is the one accepted, given that its parent was reached and has at least r + 1
  children. Verification tries siblings in rank order, so whether rank r is accepted does not
  depend on how many siblings come after it, and the ranks' events are exclusive: Σ_r a_r(d) ≤ 1.
  Why per depth: acceptance can change with depth (the demo's EAGLE head: a_0 0.77 at depth 1,
  0.61-0.71 deeper, as its own features stand in for the target's; the draft GPT's is flat), and
  one pooled vector then misprices deep paths against wide shallow ones.
- A node reached by the ranks (r_1, ..., r_d) from the root is reached with probability
  s = a_{r_1}(1) · ... · a_{r_d}(d) (its score), and every node reached adds one accepted token,
  so a round verifies 1 + Σ s tokens on average (the 1: the resampled or bonus token).
- With every depth's a_r(d) non-increasing in r, the n highest-scoring paths form a valid tree
  (a parent, and a lower-ranked sibling, score at least as high as the node), and it is the best
  tree of n nodes; with a depth limit D, the best n among the paths of at most D ranks.
- A round costs one target pass over n + 1 tokens and one draft pass per depth level whose width
  is the number of nodes expanded there (runtime.drafting runs each node once); both from
  measured latencies (`Latency`). Tokens per second of tree (n, D): (1 + Σ s) / cost. The plan
  takes the best (n, D), and compares it with the chain of the same draft (a_0(d) at depth d:
  a chain's draft is the rank-0 child), drafted in one draft_chain call where the runner has one.

Dynamic trees (EAGLE-2, tree=dynamic) are planned with the same machinery: their a_r(d) come from a
probe decoded with a wide dynamic tree (its children are top-k, verified as point masses, so their
rates are not a sampled tree's), the best n paths are solved as above, and a round is priced as
DynamicGrowth grows it: `depth` draft passes, the first over the root and each later one over up to
tree_top_k frontier nodes, then the target over total_tokens + 1 (`Latency.dynamic_round_s`). The
plan gives (total_tokens, depth, tree_top_k) = (n, D, K), K wide enough for the paths' ranks and for
the nodes they expand per level (`DynamicTree.covering`). The estimate is conservative: a dynamic
tree picks its n nodes each round by the draft's own confidence, which can only do better than one
fixed set of ranks (when the draft's confidence tracks acceptance), while the price is the same.

A plan file is JSON: the tree as rank paths (the format of runtime.tree.STATIC_TREES, so
`static_tree=PLAN.json` uses it; since version 3 "tree_kind" says "static" or "dynamic", and a
dynamic plan's "dynamic" holds the parameters to use, its paths being the positional tree it was
priced as; static_tree refuses a dynamic plan), the acceptance measured (pooled, and per depth since version
2; version 1 files, pooled only, are read as the pooled vector at every depth), the latencies
used, what it was measured on, and the predicted speed-ups. Written atomically (a temporary file, then a rename).
Pure Python and numpy-free on purpose: the runtime reads plans with nothing else loaded.
"""
from __future__ import annotations

import heapq
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from specrt.errors import SpecrtError

PLAN_FORMAT = "specrt-tree-plan"
PLAN_VERSION = 3
PLAN_VERSIONS = (1, 2, 3)  # read; version 1: no per-depth acceptance; 1 and 2: static trees only
TREE_KINDS = ("static", "dynamic")  # what a plan sizes: a static shape, or EAGLE-2's dynamic tree
# m, the pooled rate's weight in each depth's estimate, in visits (RankCounts.acceptance_by_depth). Why 20:
# a 32-image probe (6 levels; the default is 48) reaches its deepest level 55-70 times, where a depth's own
# rate still weighs about 3/4, while a level seen a handful of times (a short probe) is mostly pooled.
PRIOR_VISITS = 20.0
DRAFTERS = ("model", "eagle")  # an independent draft model, an EAGLE head (runtime.drafting / runtime.eagle)

Path_ = tuple[int, ...]
Acceptance = Sequence[Sequence[float]]  # a_r(d): [depth − 1][rank]; the deepest row serves every deeper depth


# ---- acceptance per depth and sibling rank ----------------------------------------------------------


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
        the nodes the walk accepted, root first (runtime.verification.TreeOutcome.path), so path[i]
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


# ---- the best tree for a node budget ---------------------------------------------------------------


def best_paths(acceptance: Acceptance | Sequence[float], nodes: int,
               max_depth: Optional[int] = None) -> list[tuple[float, Path_]]:
    """The `nodes` highest-scoring rank paths of at most `max_depth` ranks, best first, with their
    scores (Π a_{r_i}(i) along the path): the best static tree of that size. `acceptance`: a_r(d)
    per depth (by_depth), or one vector for every depth.

    Best-first over the paths: each path is pushed by the one that bounds it: its parent for a
    rank-0 child (score × a_0(d) ≤ score), its next-lower-ranked sibling otherwise (same parent,
    a_{r+1}(d) ≤ a_r(d) at the same depth d, as every row is non-increasing in rank; nothing is
    assumed across depths). So a path never scores above the one that pushed it, the pops come in
    score order, and every prefix of them is a valid tree (runtime.tree.StaticShape: parent and
    lower-ranked siblings present). Ties: shorter paths, then lower ranks, first."""
    table = by_depth(acceptance)
    check_acceptance(table)
    depth = nodes if max_depth is None else max_depth
    out: list[tuple[float, Path_]] = []
    if not table or not table[0] or nodes <= 0 or depth <= 0:
        return out
    heap: list[tuple[float, int, Path_, float]] = [(-table[0][0], 1, (0,), 1.0)]  # (−score, len, path, parent's)
    while heap and len(out) < nodes:
        negative, length, path, parent = heapq.heappop(heap)
        score = -negative
        out.append((score, path))
        deeper = rates_at(table, length + 1)
        if length < depth and deeper:
            heapq.heappush(heap, (-score * deeper[0], length + 1, path + (0,), score))
        here, rank = rates_at(table, length), path[-1] + 1
        if rank < len(here):
            heapq.heappush(heap, (-parent * here[rank], length, path[:-1] + (rank,), parent))
    return out


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


def expected_tokens(scores: Iterable[float]) -> float:
    """Tokens a round commits on average: every node reached is one, plus the token after the walk."""
    return 1.0 + sum(scores)


def level_widths(paths: Iterable[Path_]) -> list[int]:
    """Nodes expanded (given children) at each depth: the width of each draft pass (depth 0: the root)."""
    parents: list[set[Path_]] = []
    for path in paths:
        depth = len(path) - 1
        while len(parents) <= depth:
            parents.append(set())
        parents[depth].add(path[:-1])
    return [len(level) for level in parents]


# ---- latencies and the cost of a round --------------------------------------------------------------


@dataclass
class Latency:
    """Measured seconds per call (fastest of repeats) that price a round.

    target[W − 1]: a target step over W tokens. draft[w − 1]: a draft pass over w tokens (a level
    of the tree; for an EAGLE head, also its call on the round's committed pairs). chain[k]: one
    draft_chain call drawing k drafts (empty: the runner has none). `drafter`: "model" (an
    independent draft: a round's first pass also feeds the one committed token its cache may lack)
    or "eagle" (a head: a round first runs its committed pairs, about one per token of the last
    round, in a call of their own). host_*: seconds of host work per round; 0 prices graph time
    alone, which is what a device with a fast loop approaches."""

    target: list[float]
    draft: list[float]
    chain: dict[int, float] = field(default_factory=dict)
    drafter: str = "model"
    # host work (Python between the graph calls: verification, KV commits, growing the tree), from
    # decoding runs: a tree round's fixed part, its part per node and per level, a chain round's
    host_round: float = 0.0
    host_node: float = 0.0
    host_level: float = 0.0  # per draft pass of a tree (each depth is a drafter call and its bookkeeping)
    host_chain: float = 0.0
    host_ar: float = 0.0  # ar's per token: the baseline's own host work

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise SpecrtError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        if any(not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)
               for v in (self.host_round, self.host_node, self.host_level, self.host_chain, self.host_ar)):
            raise SpecrtError("latency host seconds must be finite and non-negative")
        for name, values in (("target", self.target), ("draft", self.draft), ("chain", list(self.chain.values()))):
            if name != "chain" and not values:
                raise SpecrtError(f"latency {name} needs at least one measured window")
            if any(not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0) for v in values):
                raise SpecrtError(f"latency {name} must be positive finite seconds")

    def target_s(self, window: int) -> float:
        return _at(self.target, window, "target")

    def draft_s(self, width: int) -> float:
        return _at(self.draft, width, "draft")

    def catch_up_s(self, tokens_per_round: float) -> float:
        """An EAGLE head's call on the committed pairs (about one per token of a round); 0 otherwise."""
        return self.draft_s(max(1, round(tokens_per_round))) if self.drafter == "eagle" else 0.0

    def tree_round_s(self, nodes: int, widths: Sequence[int], tokens_per_round: float) -> float:
        """One tree round: the target over the root and `nodes` drafts, one draft pass per level
        (the first one feeding a model draft's uncached token too)."""
        first = 1 if self.drafter == "model" else 0
        passes = sum(self.draft_s(w + (first if d == 0 else 0)) for d, w in enumerate(widths))
        host = self.host_round + self.host_node * nodes + self.host_level * len(widths)
        return self.target_s(nodes + 1) + passes + self.catch_up_s(tokens_per_round) + host

    def dynamic_round_s(self, tree: "DynamicTree", tokens_per_round: float) -> float:
        """One EAGLE-2 round of `tree`'s parameters, as a static round whose levels are
        DynamicGrowth's passes (dynamic_widths) and whose target pass is over total_tokens + 1."""
        return self.tree_round_s(tree.total_tokens, dynamic_widths(tree.depth, tree.tree_top_k), tokens_per_round)

    def chain_round_s(self, drafts: int, tokens_per_round: float) -> float:
        """One chain round of `drafts` drafts: in one draft_chain call where one is measured that
        draws at least that many (the extra drafts are computed and ignored, as an EAGLE head's
        runner does; an independent draft's graph must match exactly), else a pass per draft."""
        calls = [k for k in self.chain if k == drafts or (self.drafter == "eagle" and k >= drafts >= 2)]
        if calls:
            return self.target_s(drafts + 1) + self.chain[min(calls)] + self.host_chain
        first = self.draft_s(2) if self.drafter == "model" else self.catch_up_s(tokens_per_round)
        return self.target_s(drafts + 1) + first + (drafts - 1) * self.draft_s(1) + self.host_chain

    def to_json(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "target_s": self.target, "draft_s": self.draft,
                "chain_s": {str(k): v for k, v in sorted(self.chain.items())},
                "host_s": {"tree_round": self.host_round, "tree_node": self.host_node, "tree_level": self.host_level,
                           "chain_round": self.host_chain,
                           "ar_token": self.host_ar}}

    @classmethod
    def from_json(cls, data: Any) -> "Latency":
        if not isinstance(data, dict):
            raise SpecrtError("latency must be an object")
        try:
            chain = {int(k): float(v) for k, v in (data.get("chain_s") or {}).items()}
            host = data.get("host_s") or {}
            return cls([float(v) for v in data["target_s"]], [float(v) for v in data["draft_s"]], chain,
                       str(data.get("drafter", "model")), float(host.get("tree_round", 0.0)),
                       float(host.get("tree_node", 0.0)), float(host.get("tree_level", 0.0)),
                       float(host.get("chain_round", 0.0)), float(host.get("ar_token", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecrtError(f"latency is malformed ({exc})") from None


def monotone(seconds: Sequence[float]) -> list[float]:
    """Each latency lowered to the smallest at the same or a larger window. Why: a call over more
    tokens never costs less, and on a shared machine other processes only ever add time, so a
    window measured slower than a larger one was disturbed; the larger one bounds it."""
    out = list(seconds)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def _at(values: Sequence[float], window: int, name: str) -> float:
    """values[window − 1]; past the last measured window, extrapolated linearly from the last two
    (a step's cost grows at most linearly in its tokens)."""
    if window < 1:
        raise ValueError(f"{name} window {window}")
    if window <= len(values):
        return values[window - 1]
    slope = values[-1] - values[-2] if len(values) > 1 else 0.0
    return values[-1] + max(slope, 0.0) * (window - len(values))


def dynamic_widths(depth: int, top_k: int) -> list[int]:
    """The widths of DynamicGrowth's `depth` draft passes: the root alone, then the top_k best new
    candidates of the pass before (each node has top_k children, so there are always top_k, unless
    rows run out of tokens with mass, which a price need not assume)."""
    return [1] + [top_k] * (depth - 1) if depth > 0 else []


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's parameters as the method takes them: `--param tree=dynamic --param total_tokens=…
    --param depth=… --param tree_top_k=…` (runtime.tree.DynamicGrowth)."""

    total_tokens: int
    depth: int
    tree_top_k: int

    def __post_init__(self) -> None:
        for name in ("total_tokens", "depth", "tree_top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecrtError(f"dynamic tree {name} must be a positive integer, got {value!r}")

    @classmethod
    def covering(cls, paths: Sequence[Sequence[int]]) -> "DynamicTree":
        """The dynamic tree whose candidates include every one of `paths` (a valid rank-path tree):
        n nodes, their depth, and top_k = the highest rank used + 1, or more where a level of the
        paths expands more nodes than that (a pass expands at most top_k frontier nodes)."""
        if not paths:
            raise SpecrtError("a dynamic tree needs at least one path")
        ranks = max(r for p in paths for r in p) + 1
        widest = max(level_widths(tuple(p) for p in paths))
        return cls(len(paths), max(len(p) for p in paths), max(1, ranks, widest))

    def params(self) -> dict[str, int]:
        return {"total_tokens": self.total_tokens, "depth": self.depth, "tree_top_k": self.tree_top_k}

    def flags(self) -> str:
        """The generate / bench flags that use it."""
        return "--param tree=dynamic " + " ".join(f"--param {k}={v}" for k, v in self.params().items())


# ---- choosing the tree ------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One candidate: its rank paths (best first), expected tokens and seconds per round."""

    paths: list[Path_]
    tokens_per_round: float
    seconds_per_round: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_round / self.seconds_per_round

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)


def best_tree(acceptance: Acceptance | Sequence[float], latency: Latency, max_nodes: int,
              max_depth: Optional[int] = None, kind: str = "static") -> Candidate:
    """The tree of at most `max_nodes` nodes (and `max_depth` levels) with the most tokens per
    second under `latency`: for every depth limit D, the best-n-paths trees for n = 1..max_nodes
    (each a prefix of the same best-first order), priced and compared. `kind` "static" prices a
    round as that shape's (a draft pass per level, as wide as the nodes it expands); "dynamic" as
    the EAGLE-2 tree that covers the paths (DynamicTree.covering, Latency.dynamic_round_s): a
    positional, so conservative, estimate of what a tree chosen by draft confidence accepts."""
    if kind not in TREE_KINDS:
        raise SpecrtError(f"tree kind must be one of {', '.join(TREE_KINDS)}, got {kind!r}")
    if max_nodes < 1:
        raise SpecrtError(f"max_nodes must be at least 1, got {max_nodes}")
    if not _measured(acceptance):
        raise SpecrtError("no sibling acceptance measured: the probe run verified no tree")
    best: Optional[Candidate] = None
    for depth in range(1, (max_depth or max_nodes) + 1):
        ranked = best_paths(acceptance, max_nodes, depth)
        total = 1.0
        for count, (score, _) in enumerate(ranked, 1):
            total += score
            paths = [p for _, p in ranked[:count]]
            if kind == "static":
                seconds = latency.tree_round_s(count, level_widths(paths), total)
            else:
                seconds = latency.dynamic_round_s(DynamicTree.covering(paths), total)
            if best is None or total / seconds > best.tokens_per_s * (1 + 1e-12):
                best = Candidate(paths, total, seconds)
        if max(len(p) for _, p in ranked) < depth:
            break  # the limit did not bind: every deeper limit gives the same trees
    assert best is not None
    return best


def best_chain(acceptance: Acceptance | Sequence[float], latency: Latency, max_drafts: int) -> Candidate:
    """The chain (every draft rank 0) of 1..max_drafts drafts with the most tokens per second."""
    options = [chain_choice(acceptance, latency, k) for k in range(1, max_drafts + 1)]
    return max(options, key=lambda c: c.tokens_per_s)  # ties: the shorter chain (max keeps the first)


def chain_choice(acceptance: Acceptance | Sequence[float], latency: Latency, drafts: int) -> Candidate:
    """A chain of `drafts` drafts priced as a chain round (one draft_chain call where measured):
    the draft at depth d is reached with probability Π_{i ≤ d} a_0(i)."""
    if not _measured(acceptance):
        raise SpecrtError("no sibling acceptance measured: the probe run verified no tree")
    table = by_depth(acceptance)
    check_acceptance(table)
    reached, scores = 1.0, []
    for depth in range(1, drafts + 1):
        reached *= rates_at(table, depth)[0]
        scores.append(reached)
    tokens = expected_tokens(scores)
    return Candidate([(0,) * d for d in range(1, drafts + 1)], tokens, latency.chain_round_s(drafts, tokens))


def chain_rate(tokens_per_round: float, drafts: int) -> float:
    """The flat a_0 at which a chain of `drafts` drafts commits `tokens_per_round` tokens a round
    (1 + a + a² + … + a^drafts, solved by bisection; clamped to [0, 1]). Why: a dynamic tree's probe
    measures top-k children, verified as point masses (accepted with p(x)), while a chain's drafts
    are sampled (accepted with min(1, p/q)): its chains are priced from measured chain rounds instead."""
    if not (isinstance(drafts, int) and drafts >= 1 and math.isfinite(tokens_per_round)):
        raise SpecrtError(f"chain_rate needs drafts ≥ 1 and finite tokens, got {drafts!r}, {tokens_per_round!r}")
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if sum(middle ** k for k in range(drafts + 1)) < tokens_per_round:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _measured(acceptance: Acceptance | Sequence[float]) -> bool:
    """Whether there is an a_0 at depth 1 (without it no tree or chain can be priced)."""
    table = by_depth(acceptance)
    return bool(table and table[0])


# ---- plan files -------------------------------------------------------------------------------------


@dataclass
class TreePlan:
    """What `specrt plan-tree` writes: the chosen tree, the numbers it was chosen from, the prediction."""

    tree: list[list[int]]
    acceptance: list[float]  # pooled a_r (all depths)
    latency: Optional[Latency] = None
    counts: Optional[RankCounts] = None
    predicted: dict[str, Any] = field(default_factory=dict)
    measured_on: dict[str, Any] = field(default_factory=dict)
    acceptance_by_depth: list[list[float]] = field(default_factory=list)  # a_r(d), the model solved; [] = pooled
    dynamic: Optional[DynamicTree] = None  # a dynamic tree's parameters; None: `tree` is a static shape

    @property
    def tree_kind(self) -> str:
        return "static" if self.dynamic is None else "dynamic"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "tree_kind": self.tree_kind,
                               "tree": self.tree, "nodes": len(self.tree),
                               "depth": max((len(p) for p in self.tree), default=0)}
        if self.dynamic is not None:
            out["dynamic"] = self.dynamic.params()
        out.update({"acceptance": self.acceptance, "acceptance_by_depth": self.acceptance_by_depth})
        if self.counts is not None:
            out["acceptance_counts"] = self.counts.to_json()
        if self.latency is not None:
            out["latency"] = self.latency.to_json()
        out["predicted"] = self.predicted
        out["measured_on"] = self.measured_on
        return out


def write_plan(path: str | os.PathLike, plan: TreePlan) -> Path:
    """Write `plan` as JSON at `path` through a temporary file in the same folder and a rename,
    so a reader (a bench run using the plan) never sees half a file."""
    path = Path(path)
    text = json.dumps(plan.to_json(), indent=1) + "\n"
    fd, partial = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path


def read_plan(path: str | os.PathLike, kind: Optional[str] = "static") -> TreePlan:
    """The plan in `path`; SpecrtError (one line naming the file) when it cannot be read, is not
    JSON, or is not a tree plan, or not one of `kind` (None: either). Why static by default: the
    runtime reads plans as static_tree values (runtime.tree.static_shape), and a dynamic plan's
    paths are only the positional tree it was priced as, not a shape to draft; the refusal says
    which parameters to use instead. The tree's own shape rules are runtime.tree.StaticShape's."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecrtError(f"cannot read tree plan {path}: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecrtError(f"tree plan {path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise SpecrtError(f"{path} is not a tree plan (no \"format\": \"{PLAN_FORMAT}\"; write one with "
                          f"`specrt plan-tree`)")
    version = data.get("version")
    if isinstance(version, bool) or version not in PLAN_VERSIONS:
        raise SpecrtError(f"tree plan {path} has version {version!r}; this specrt reads versions "
                          f"{', '.join(map(str, PLAN_VERSIONS))}")
    tree = data.get("tree")
    if not (isinstance(tree, list) and tree and all(
            isinstance(p, list) and p and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in p)
            for p in tree)):
        raise SpecrtError(f"tree plan {path}: \"tree\" must be a non-empty list of rank paths such as [[0], [1], [0, 0]]")
    acceptance = data.get("acceptance", [])
    if not isinstance(acceptance, list) or not all(isinstance(a, (int, float)) for a in acceptance):
        raise SpecrtError(f"tree plan {path}: \"acceptance\" must be a list of numbers")
    acceptance = [float(a) for a in acceptance]
    dynamic = _plan_dynamic(path, data, version)
    if kind is not None and (dynamic is None) != (kind == "static"):
        if dynamic is not None:
            raise SpecrtError(f"tree plan {path} is for a dynamic tree, not a static_tree shape: use {dynamic.flags()}")
        raise SpecrtError(f"tree plan {path} is for a static tree: use --param tree=static --param static_tree={path}")
    by_depth_ = _plan_by_depth(path, data, version, acceptance)
    try:
        latency = Latency.from_json(data["latency"]) if data.get("latency") is not None else None
    except SpecrtError as exc:
        raise SpecrtError(f"tree plan {path}: {exc}") from None
    return TreePlan(tree, acceptance, latency, None, dict(data.get("predicted") or {}),
                    dict(data.get("measured_on") or {}), by_depth_, dynamic)


def _plan_dynamic(path: str | os.PathLike, data: dict[str, Any], version: int) -> Optional[DynamicTree]:
    """A plan's dynamic tree parameters, or None for a static plan (every version 1 and 2 file)."""
    kind = data.get("tree_kind", "static") if version >= 3 else "static"
    if kind not in TREE_KINDS:
        raise SpecrtError(f"tree plan {path}: \"tree_kind\" must be one of {', '.join(TREE_KINDS)}, got {kind!r}")
    if kind == "static":
        return None
    params = data.get("dynamic")
    if not isinstance(params, dict):
        raise SpecrtError(f"tree plan {path}: a dynamic plan needs \"dynamic\": {{\"total_tokens\": n, \"depth\": D, "
                          f"\"tree_top_k\": K}}")
    try:
        return DynamicTree(params.get("total_tokens"), params.get("depth"), params.get("tree_top_k"))
    except SpecrtError as exc:
        raise SpecrtError(f"tree plan {path}: {exc}") from None


def _plan_by_depth(path: str | os.PathLike, data: dict[str, Any], version: int,
                   acceptance: list[float]) -> list[list[float]]:
    """A plan's a_r(d): version 1 files have only the pooled vector, which then holds at every depth
    (what they were solved with); version 2 files keep "acceptance_by_depth", checked row by row
    (a list per depth of probabilities non-increasing in rank), since a plan is also read to
    re-price its tree."""
    rows = data.get("acceptance_by_depth") if version >= 2 else None
    if rows is None:
        return [list(acceptance)] if acceptance else []
    if not (isinstance(rows, list) and all(isinstance(row, list) for row in rows)):
        raise SpecrtError(f"tree plan {path}: \"acceptance_by_depth\" must be a list with one list of "
                          f"probabilities per depth, such as [[0.7, 0.1], [0.6, 0.1]]")
    try:
        check_acceptance(rows)
    except SpecrtError as exc:
        raise SpecrtError(f"tree plan {path}: \"acceptance_by_depth\": {exc}") from None
    return [[float(a) for a in row] for row in rows]


def is_plan_reference(value: str) -> bool:
    """Whether a static_tree value names a file rather than a built-in shape: a .json name, a path
    with a folder in it, or a file that exists."""
    return value.endswith(".json") or os.sep in value or "/" in value or os.path.isfile(value)


# ---- probe shapes -----------------------------------------------------------------------------------


def fan_paths(width: int, depth: int) -> list[list[int]]:
    """A probe tree for measuring a_r: `width` children under the root and under each rank-0
    descendant, `depth` levels (width · depth nodes). Every node the walk can reach with children
    offers all `width` ranks, so each visit counts for every rank, and the walk goes as deep as
    the draft's first choices are accepted."""
    return [[0] * d + [r] for d in range(depth) for r in range(width)]


def make_plan(acceptance: Acceptance | Sequence[float], latency: Latency, max_nodes: int,
              max_depth: Optional[int] = None, counts: Optional[RankCounts] = None,
              measured_on: Optional[dict[str, Any]] = None, default_draft_len: int = 4,
              kind: str = "static", chain_acceptance: Optional[Acceptance | Sequence[float]] = None) -> TreePlan:
    """The best tree of `kind` (static, or EAGLE-2's dynamic: best_tree) under `latency` for a_r(d)
    = `acceptance` (per depth, or one vector for every depth), with its prediction beside the
    chains' (the best chain of up to max_nodes drafts, and the one of `default_draft_len`) and ar's
    (one target pass of 1 token per token): speed-ups are ratios of predicted tokens per second, of
    graph time alone unless `latency` has host seconds. The chains are priced with
    `chain_acceptance` where given (a dynamic probe's rates are not a sampled chain's: chain_rate),
    else with `acceptance`. The plan's pooled "acceptance" is `counts`' where given, else the one
    vector given."""
    table = by_depth(acceptance)
    tree = best_tree(acceptance, latency, max_nodes, max_depth, kind)
    dynamic = DynamicTree.covering(tree.paths) if kind == "dynamic" else None
    chained = acceptance if chain_acceptance is None else chain_acceptance
    chain = best_chain(chained, latency, max(1, min(max_nodes, max_depth or max_nodes)))
    usual = chain_choice(chained, latency, default_draft_len)
    ar = 1.0 / (latency.target_s(1) + latency.host_ar)

    def summary(candidate: Candidate) -> dict[str, Any]:
        return {"tokens_per_round": round(candidate.tokens_per_round, 4),
                "seconds_per_round": candidate.seconds_per_round,
                "speedup_vs_ar": round(candidate.tokens_per_s / ar, 4)}

    shape = {"kind": kind, "nodes": len(tree.paths), "depth": tree.depth, **(dynamic.params() if dynamic else {})}
    predicted = {"tree": {**shape, **summary(tree)},
                 "chain": {"draft_len": len(chain.paths), **summary(chain)},
                 f"chain_draft_len_{default_draft_len}": summary(usual),
                 "speedup_vs_chain": round(tree.tokens_per_s / chain.tokens_per_s, 4),
                 "faster": "tree" if tree.tokens_per_s > chain.tokens_per_s else "chain",
                 "counts": "target and draft calls as measured" + (", and host work per round" if latency.host_round
                                                                   or latency.host_node or latency.host_level
                                                                   or latency.host_chain else "; host work is not counted")}
    pooled = counts.acceptance() if counts is not None else (list(table[0]) if len(table) == 1 else [])
    return TreePlan([list(p) for p in tree.paths], pooled, latency, counts, predicted, dict(measured_on or {}), table,
                    dynamic)
