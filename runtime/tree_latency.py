"""What a drafted round costs on the device, the price a tree plan is solved against (runtime.tree_plan).

A round costs one target pass over n + 1 tokens and one draft pass per depth level whose width is
the number of nodes expanded there (the drafters run each node once: runtime.model_drafter,
runtime.eagle); both from measured latencies (`Latency`). A dynamic tree (EAGLE-2, tree=dynamic) is
priced as DynamicGrowth grows it: `depth` draft passes, the first over the root and each later one
over up to tree_top_k frontier nodes, then the target over total_tokens + 1
(`Latency.dynamic_round_s`, with the parameters of a `DynamicTree`). A chain is priced as one
draft_chain call where the runner has one.
Pure Python and numpy-free on purpose: the runtime reads plans with nothing else loaded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from specrt.errors import SpecrtError

DRAFTERS = ("model", "eagle")  # an independent draft model, an EAGLE head (runtime.model_drafter / runtime.eagle)

Path_ = tuple[int, ...]


def level_widths(paths: Iterable[Path_]) -> list[int]:
    """Nodes expanded (given children) at each depth: the width of each draft pass (depth 0: the root)."""
    parents: list[set[Path_]] = []
    for path in paths:
        depth = len(path) - 1
        while len(parents) <= depth:
            parents.append(set())
        parents[depth].add(path[:-1])
    return [len(level) for level in parents]


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

