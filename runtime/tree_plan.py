"""Static trees sized for the device (Sequoia's idea): the shape that drafts the most tokens per
second, from measured sibling acceptance and measured step latencies.

Why: a bigger tree accepts more tokens per target pass, but a pass over W tokens costs t(W).
On a GPU t(W) is flat far beyond 64 tokens, so a 25-node tree pays; on a CPU the demo target's
t(26) is about 2.2 t(5), and the same tree is slower than a chain. No one shape suits both: the
shape has to follow the device, so `specrt plan-tree` measures both sides and solves.

The model (Sequoia's positional acceptance, made per depth):
- a_r(d): the probability that the child of rank r (0-based) at depth d (1-based) is the one
  accepted, given that its parent was reached and has at least r + 1 children; measured per
  depth and rank (runtime.tree_acceptance), Σ_r a_r(d) ≤ 1.
- A node reached by the ranks (r_1, ..., r_d) from the root is reached with probability
  s = a_{r_1}(1) · ... · a_{r_d}(d) (its score), and every node reached adds one accepted token,
  so a round verifies 1 + Σ s tokens on average (the 1: the resampled or bonus token).
- With every depth's a_r(d) non-increasing in r, the n highest-scoring paths form a valid tree
  (a parent, and a lower-ranked sibling, score at least as high as the node), and it is the best
  tree of n nodes; with a depth limit D, the best n among the paths of at most D ranks.
- A round costs one target pass over n + 1 tokens and one draft pass per depth level whose width
  is the number of nodes expanded there; both from measured latencies (runtime.tree_latency).
  Tokens per second of tree (n, D): (1 + Σ s) / cost. The plan takes the best (n, D), and
  compares it with the chain of the same draft (a_0(d) at depth d: a chain's draft is the rank-0
  child), drafted in one draft_chain call where the runner has one.

Dynamic trees (EAGLE-2, tree=dynamic) are planned with the same machinery: their a_r(d) come from a
probe decoded with a wide dynamic tree (its children are top-k, verified as point masses, so their
rates are not a sampled tree's), the best n paths are solved as above, and a round is priced as
DynamicGrowth grows it (runtime.tree_latency). The plan gives (total_tokens, depth, tree_top_k) =
(n, D, K), K wide enough for the paths' ranks and for the nodes they expand per level
(`DynamicTree.covering`). The estimate is conservative: a dynamic tree picks its n nodes each round
by the draft's own confidence, which can only do better than one fixed set of ranks (when the
draft's confidence tracks acceptance), while the price is the same.

The pieces: the acceptance measured (runtime.tree_acceptance), the price of a round
(runtime.tree_latency), the plan file written and read (runtime.tree_plan_file); this module solves.
Pure Python and numpy-free on purpose: the runtime reads plans with nothing else loaded.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from specrt.errors import SpecrtError
from specrt.runtime.tree_acceptance import Acceptance, RankCounts, by_depth, check_acceptance, rates_at
from specrt.runtime.tree_latency import DynamicTree, Latency, Path_, level_widths
from specrt.runtime.tree_plan_file import TREE_KINDS, TreePlan


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



def expected_tokens(scores: Iterable[float]) -> float:
    """Tokens a round commits on average: every node reached is one, plus the token after the walk."""
    return 1.0 + sum(scores)


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
