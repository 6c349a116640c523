"""Tree plan files: what `specrt plan-tree` writes and `static_tree=PLAN.json` reads.

A plan file is JSON: the tree as rank paths (the format of runtime.tree.STATIC_TREES, so
`static_tree=PLAN.json` uses it; since version 3 "tree_kind" says "static" or "dynamic", and a
dynamic plan's "dynamic" holds the parameters to use, its paths being the positional tree it was
priced as; static_tree refuses a dynamic plan), the acceptance measured (pooled, and per depth since
version 2; version 1 files, pooled only, are read as the pooled vector at every depth), the
latencies used, what it was measured on, and the predicted speed-ups (runtime.tree_plan solves them).
Written atomically (a temporary file, then a rename).
Pure Python and numpy-free on purpose: the runtime reads plans with nothing else loaded.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specrt.atomic_file import write_text
from specrt.errors import SpecrtError
from specrt.runtime.tree_acceptance import RankCounts, check_acceptance
from specrt.runtime.tree_latency import DynamicTree, Latency

PLAN_FORMAT = "specrt-tree-plan"
PLAN_VERSION = 3
PLAN_VERSIONS = (1, 2, 3)  # read; version 1: no per-depth acceptance; 1 and 2: static trees only
TREE_KINDS = ("static", "dynamic")  # what a plan sizes: a static shape, or EAGLE-2's dynamic tree


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
    return write_text(path, json.dumps(plan.to_json(), indent=1) + "\n")


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

