"""A static tree drafted in one draft call: the host's side of runtime/chain.py's DraftTree.

Why: drafting a static tree level by level costs a draft pass per depth, and around each pass
~100 µs of host work on the demo's CPU (the level's window inputs, staging its rows, the draws
without replacement, copies of its rows): more than a third of a tree round's host time. DraftTree
runs the catch-up window and every level of the shape inside one graph (the `draft_tree` graph
of a bundle exported with --draft-tree, or the PyTorch module), drawing each node's children
without replacement in the graph; the host then builds the TokenTree from the draws in one go.

The layout (`TreeLayout`) fixes what both sides agree on, from the shape alone:
- node ids: the shape's (runtime.tree.StaticShape, breadth first), 0 the root;
- `inner`: the nodes with children, in node order, the root first: the graph's `probs` rows
  (the q each node's children were drawn from);
- `fed`: the inner nodes below the root, in node order (a level after another): fed after the
  window, their KV rows at present slots W, W + 1, ... (W the window width);
- `draws[:, n − 1]`: node n's token (where its parent's row still had mass for it: the host
  checks, tree_from_draws);
- `uniforms[:, n − 1]`: the uniform node n is drawn with: the round's CANDIDATE counter uniform of
  part n at node n's token index (runtime.decoding Decoding.tree_uniforms), the one the
  level-by-level drafter (runtime.tree.StaticGrowth) and the device round (runtime/rounds/trees.py)
  draw node n with, so the three draw the same tokens, up to float32 against float64 at a CDF
  boundary (a rare token). Both are exact in distribution.

Both drafters (runtime.model_drafter, runtime.eagle) build their trees from a call's outputs here
(root_only_trees, tree_from_draws, grown_trees).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.tree import StaticShape, TokenTree
from specrt.runtime.verification.siblings import SAMPLED, TOP


class TreeLayout:
    """The node layout of a static shape drafted in one call (module docstring)."""

    def __init__(self, shape: StaticShape):
        self.children = [list(kids) for kids in shape.children]
        count = len(self.children)
        self.parents, self.depths = [-1] * count, [0] * count
        for node, kids in enumerate(self.children):
            for child in kids:
                self.parents[child], self.depths[child] = node, self.depths[node] + 1
        self.inner = [n for n in range(count) if self.children[n]]
        rows = {node: k for k, node in enumerate(self.inner)}
        self.row_of = [rows.get(parent, 0) for parent in self.parents]  # a node's parent's row in `inner` order
        self.fed = self.inner[1:]
        self.levels = [[n for n in self.fed if self.depths[n] == depth]
                       for depth in range(1, max((self.depths[n] for n in self.inner), default=0) + 1)]
        self.key = tuple(tuple(kids) for kids in self.children)  # the shape, hashable
        self.depth = max(self.depths)
        # for the whole-tree check: each node's parent row, and per row its children but the last
        self._row_index = np.array(self.row_of[1:], dtype=np.int64)
        self._all_but_last = np.zeros((len(self.inner), count - 1))
        for k, node in enumerate(self.inner):
            self._all_but_last[k, np.array(self.children[node][:-1], dtype=np.int64) - 1] = 1.0

    @property
    def nodes(self) -> int:
        return len(self.children)


def root_only_trees(roots: Sequence[int], max_depths: Sequence[int], drawn: str) -> list[Optional[TokenTree]]:
    """A one-call tree round's trees before the call: the root alone for an image with no drafts
    left (max_depths[p] == 0), None for the rest (no tree, < 0, or the call's to fill)."""
    return [TokenTree(root, drawn) if depth == 0 else None for root, depth in zip(roots, max_depths)]


def tree_from_draws(layout: TreeLayout, root: int, draws: Sequence[int], rows: Any,
                    max_depth: int) -> tuple[TokenTree, list[tuple[int, int]]]:
    """The TokenTree an image's draws [nodes − 1] make, with rows[k] [V] as inner[k]'s q, and its
    nodes to stage, in fed order: (tree node, index in `fed`) of each fed node it keeps above
    max_depth (its KV row sits at present slot W + that index).

    Left out, with their subtrees: nodes deeper than max_depth, and children their row had no
    mass for, as draws_without_replacement stops: child j of a row needs more than 1e-12 of it
    left after children 1..j − 1 (float64 sums of the row's float32 entries, as there)."""
    rows = np.asarray(rows)
    tokens = [int(t) for t in draws]
    totals = rows.sum(axis=1, dtype=np.float64)
    masses = rows[layout._row_index, tokens].astype(np.float64)  # each node's mass in its parent's row
    if max_depth >= layout.depth and (totals - layout._all_but_last @ masses > 1e-12).all():
        return _whole_tree(layout, root, tokens, rows)  # the usual round: every row had mass for every child
    totals, masses = totals.tolist(), masses.tolist()
    index, left = {0: 0}, {}
    kept_tokens, kept_parents = [int(root)], [-1]
    for node in range(1, layout.nodes):
        parent = layout.parents[node]
        before = left.get(parent, totals[layout.row_of[node]])  # the parent's row's mass not yet drawn
        left[parent] = before - masses[node - 1]
        if before > 1e-12 and parent in index and layout.depths[node] <= max_depth:
            index[node] = len(kept_tokens)
            kept_tokens.append(tokens[node - 1])
            kept_parents.append(index[parent])
        else:
            left[parent] = 0.0  # a row that ran out stops: no later sibling either
    tree = TokenTree.from_parents(kept_tokens, kept_parents, SAMPLED)
    tree.parts = sorted(index)  # the kept layout nodes, in node order: what their draws and tests are keyed by
    for k, node in enumerate(layout.inner):
        at = index.get(node)
        if at is not None and tree.children[at]:
            tree.rows[at] = rows[k]
    staged = [(index[n], k) for k, n in enumerate(layout.fed) if n in index and layout.depths[n] < max_depth]
    return tree, staged


def _whole_tree(layout: TreeLayout, root: int, tokens: list[int], rows: np.ndarray) -> tuple[TokenTree, list[tuple[int, int]]]:
    """tree_from_draws where every node is kept: the layout's own structure (node n is tree node n)."""
    tree = TokenTree(root, SAMPLED)
    tree.tokens = [int(root), *tokens]
    tree.parents, tree.depths = list(layout.parents), list(layout.depths)
    tree.children = [list(kids) for kids in layout.children]
    tree.rows = dict(zip(layout.inner, rows))
    return tree, [(node, k) for k, node in enumerate(layout.fed)]


# ---- dynamic trees (EAGLE-2's growth) in one call ------------------------------------------------


class GrowthLayout:
    """What runtime/chain.py's DraftGrowth and the host agree on for a dynamic tree of `depth`
    passes with `top_k` children per expanded node (total_tokens is the host's alone: which of the
    candidates make the tree). Pass 1 has top_k candidates (the root's row), every later pass
    top_k² (its frontier's rows, frontier node-major); `fed` = (depth − 1)·top_k frontier nodes,
    pass d's at present slots W + (d − 2)·top_k, ..."""

    def __init__(self, depth: int, top_k: int):
        if depth < 1 or top_k < 1:
            raise ValueError(f"a dynamic tree needs depth and top_k >= 1, got {depth}, {top_k}")
        self.depth, self.top_k = depth, top_k
        self.fed = (depth - 1) * top_k
        self.key = ("dynamic", depth, top_k)
        # every pass's first candidate; per candidate, the fed node that is its parent (−1: the root)
        self.starts = [0, *(top_k + (d - 2) * top_k * top_k for d in range(2, depth + 2))]
        self.candidates = self.starts[-1]
        self._parent_fed = np.concatenate([np.full(top_k, -1, dtype=np.int64),
                                           *((d - 2) * top_k + np.arange(top_k * top_k) // top_k
                                             for d in range(2, depth + 1))])
        self._first_of_fed = np.repeat(np.array(self.starts[:depth - 1], dtype=np.int64), top_k)


def grown_tree(layout: GrowthLayout, root: int, tokens: np.ndarray, scores: np.ndarray, fronts: np.ndarray,
               passes: int, total_tokens: int) -> tuple[TokenTree, TokenTree, list[int]]:
    """One image's dynamic tree from DraftGrowth's outputs (tokens, scores [C], fronts [fed]), as
    runtime.tree.DynamicGrowth grows it in `passes` passes (min(depth, drafts left)): the
    total_tokens best candidates with mass (ties: the earlier, parents first), drafted as TOP.

    Also: the tree of the root and the frontier nodes run (the drafter's staged nodes: `extend`
    follows the accepted path through it) and their fed indices in that order (present slot W + f).
    """
    real = np.isfinite(scores)
    real[layout.starts[passes]:] = False  # passes past the image's end
    at = layout._first_of_fed + fronts  # fed node f is candidate at[f]
    parents = np.where(layout._parent_fed >= 0, at[np.maximum(layout._parent_fed, 0)] if layout.fed else 0, -1)
    ranked = np.flatnonzero(real)[np.argsort(-scores[real], kind="stable")][:total_tokens]
    chosen = np.sort(ranked)
    node_of = {-1: 0, **{c: n for n, c in enumerate(chosen.tolist(), 1)}}  # a kept node's parent is kept
    tree = TokenTree.from_parents([int(root), *tokens[chosen].tolist()],
                                  [-1, *(node_of[int(parents[c])] for c in chosen.tolist())], TOP)
    # the frontier nodes run: passes 1..passes − 1's real ones (−inf ranks last in a frontier)
    expanded, staged, node_at = TokenTree(int(root), TOP), [], {-1: 0}
    for f in range(min(passes, layout.depth) * layout.top_k - layout.top_k):
        c = int(at[f])
        if real[c]:
            node_at[c] = expanded.add(node_at[int(parents[c])], int(tokens[c]))
            staged.append(f)
    return tree, expanded, staged


def grown_trees(layout: GrowthLayout, out: Any, windows: Sequence[Optional[Sequence[int]]], max_depths: Sequence[int],
                total_tokens: int) -> list[Optional[tuple[TokenTree, TokenTree, list[int]]]]:
    """grown_tree for each image of a grow_tree call (`out`: its GrownTrees; windows[p]: image p's
    window tokens, its root last; None: no tree). Nothing random: the tree is the rows' top-k."""
    grown: list[Optional[tuple[TokenTree, TokenTree, list[int]]]] = []
    for p, window in enumerate(windows):
        if window is None:
            grown.append(None)
            continue
        tree, expanded, fed = grown_tree(layout, window[-1], out.tokens[p], out.scores[p], out.fronts[p],
                                         min(layout.depth, max_depths[p]), total_tokens)
        grown.append((tree, expanded, fed))
    return grown
