"""Token trees for tree drafting (sd, cool-sd, lantern): shapes, and how a drafter grows them.

A TokenTree is one round's proposal. Node 0 is the root, the pending token (sampled last round,
its KV not yet computed); every later node is a drafted token whose parent is an earlier node, so
node order is window slot order and `window()` is what the target verifies in one pass
(runtime.window: positions = committed length + depth, the tree mask = each node's ancestry).

How a node's children were drafted decides which draft distribution each child is verified
against (runtime.verification.candidate_proposals):
- `SAMPLED` (static trees, EAGLE-1 / LANTERN++): a node's children are drawn without replacement
  from the draft's row after the node, child k from q^(k) (q with children 1..k−1 removed,
  renormalised), as EAGLE-1's and LANTERN's code draw them (`torch.multinomial(..., replacement=False)`).
- `TOP` (dynamic trees, EAGLE-2): children are the top-k tokens of the row, a deterministic
  function of the draft's rows, so each child is a draw from the point mass on itself.

Static shapes are lists of paths of child ranks ([0] = the root's first child, [0, 1] = that
child's second child), as EAGLE-1's `choices.py` and LANTERN's `models/drafters/choices.py`
write them. The shapes below are those files' (facts: which ranks are in each tree).
Dynamic trees follow EAGLE-2: expand the `top_k` best nodes of each depth by cumulative draft
log-probability, each getting its row's top_k tokens as children, then keep the `total_tokens`
best nodes of all. EAGLE-2's code counts `depth` expansion passes after the root's, so its
trees reach depth + 1; here `depth` is the tree's own depth (the most drafts verified on one
path, as draft_len is for a chain): LANTERN's default dynamic tree (63 tokens, depth 5, top-k 8)
is total_tokens=63, depth=6, tree_top_k=8 here.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.verification import SAMPLED, TOP, draw_without_replacement
from specrt.runtime.window import Window

if TYPE_CHECKING:  # pragma: no cover
    from specrt.runtime.drafting import Drafter
    from specrt.runtime.methods.base import Decoding

TREES = ("chain", "static", "dynamic")

# EAGLE-1's eagle/model/choices.py (also in LANTERN's models/drafters/choices.py): 25 drafts.
MC_SIM_7B_63 = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
                [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
                [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
# LANTERN's models/drafters/choices.py (its static-tree experiments; naive_extend_57 is the
# default of its ea_model_llamagen.generate, mc_sim_7b_63 of its generate_images.py).
STATIC_TREES: dict[str, list[list[int]]] = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    "mc_sim_7b_63_balanced": [[0], [1], [2], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2], [2, 0], [2, 1],
                              [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [1, 0, 0], [1, 0, 1], [1, 1, 0],
                              [1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]],
    "naive_extend_57": [[0], [1], [2], [3], [4],
                        [0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2], [3, 0], [3, 1],
                        [4, 0],
                        [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 1, 0], [0, 1, 1], [0, 1, 2], [0, 2, 0],
                        [0, 2, 1], [0, 2, 2], [0, 3, 0], [0, 3, 1], [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0],
                        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 1, 0], [0, 0, 1, 1],
                        [0, 0, 1, 2], [0, 0, 2, 0], [0, 0, 2, 1], [0, 0, 3, 0], [0, 1, 0, 0], [0, 1, 0, 1],
                        [0, 1, 1, 0], [0, 2, 0, 0],
                        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1],
                        [0, 0, 1, 0, 0], [0, 0, 1, 0, 1], [0, 0, 1, 1, 0], [0, 0, 2, 0, 0]],
    "reverse_balanced_25": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0],
                            [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [1, 0, 0],
                            [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 1, 1],
                            [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 0, 3], [0, 0, 0, 1, 0],
                            [0, 0, 0, 1, 1], [0, 0, 0, 1, 2]],
}


class TokenTree:
    """Tokens, parents and depths of one round's proposal; `rows[n]` is the draft's row after node
    n (the q its children were drawn from), `drawn` how children were drafted (SAMPLED or TOP)."""

    def __init__(self, root: int, drawn: str):
        self.tokens: list[int] = [int(root)]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.children: list[list[int]] = [[]]  # in verification order
        self.rows: dict[int, Any] = {}
        self.drawn = drawn

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int) -> int:
        """Append a drafted child of `parent` (tried after its earlier children); its node id."""
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append([])
        self.children[parent].append(node)
        return node

    def window(self) -> Window:
        """The nodes as one step window: slot n = node n."""
        return Window.tree(self.tokens, self.parents)

    def closure(self, nodes: Sequence[int]) -> list[int]:
        """`nodes` and all their ancestors, root included, in node order (a tree window's slots)."""
        seen = set()
        for node in nodes:
            while node >= 0 and node not in seen:
                seen.add(node)
                node = self.parents[node]
        return sorted(seen)

    def path(self, node: int) -> list[int]:
        """Nodes from the root down to `node`."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]

    def keep(self, nodes: Sequence[int]) -> "TokenTree":
        """The subtree of `nodes` (each one's parent kept too), renumbered in node order; rows carried."""
        kept = sorted(set(nodes) | {0})
        index = {old: new for new, old in enumerate(kept)}
        tree = TokenTree(self.tokens[0], self.drawn)
        for old in kept[1:]:
            tree.add(index[self.parents[old]], self.tokens[old])
        tree.rows = {index[n]: row for n, row in self.rows.items() if n in index}
        return tree


# ---- static shapes ------------------------------------------------------------------------------


class StaticShape:
    """A static tree's shape: per shape node, its children's shape nodes by rank (0 = root)."""

    def __init__(self, choices: Sequence[Sequence[int]]):
        paths = sorted((tuple(int(r) for r in c) for c in choices), key=lambda p: (len(p), p))
        index: dict[tuple[int, ...], int] = {(): 0}
        self.children: list[list[int]] = [[]]
        for path in paths:
            parent = index.get(path[:-1])
            if not path or parent is None or path in index or path[-1] != len(self.children[parent]):
                # ranks must be 0, 1, 2, ... under each parent: rank k is the k-th draw without
                # replacement, and q^(k) removes every earlier draw, so none may be skipped
                raise SpecrtError(f"static tree path {list(path)}: every path's parent path and lower-ranked "
                                  f"siblings must be in the tree (ranks 0, 1, 2, ... under each node)")
            index[path] = len(self.children)
            self.children.append([])
            self.children[parent].append(index[path])
        self.size = len(paths)
        self.depth = max((len(p) for p in paths), default=0)


def static_shape(name: str) -> StaticShape:
    if name not in STATIC_TREES:
        raise SpecrtError(f"unknown static tree {name!r}; choose one of {', '.join(STATIC_TREES)}")
    return StaticShape(STATIC_TREES[name])


def draft_static(ctx: "Decoding", drafter: "Drafter", root: int, shape: StaticShape, max_depth: int) -> TokenTree:
    """Grow `shape` below `root`, one draft pass per depth: every node with children in the shape
    gets them drawn without replacement from its row (fewer where the row has fewer tokens with
    mass; their subtrees go too). Nodes deeper than `max_depth` (the image's end) are left out."""
    tree = TokenTree(root, SAMPLED)
    frontier = [(0, 0)]  # (tree node, shape node)
    while frontier:
        expanding = [(n, s) for n, s in frontier if shape.children[s] and tree.depths[n] < max_depth]
        if not expanding:
            break
        rows = drafter.expand(ctx, tree, [n for n, _ in expanding])
        frontier = []
        for (node, at), row in zip(expanding, rows):
            tree.rows[node] = row
            for rank, token in enumerate(draw_without_replacement(row, len(shape.children[at]), ctx.rng)):
                frontier.append((tree.add(node, token), shape.children[at][rank]))
    return tree


# ---- dynamic trees (EAGLE-2) ---------------------------------------------------------------------


def top_tokens(row: Any, count: int) -> list[int]:
    """The `count` most probable tokens of a draft row with mass, most probable first (ties: lower id)."""
    row = np.asarray(row)
    count = min(count, int(np.count_nonzero(row)))
    if count <= 0:
        return []
    best = np.argpartition(-row, count - 1)[:count] if count < row.shape[-1] else np.arange(row.shape[-1])
    return [int(t) for t in best[np.lexsort((best, -row[best]))]]


def draft_dynamic(ctx: "Decoding", drafter: "Drafter", root: int, depth: int, top_k: int, total_tokens: int,
                  max_depth: int) -> TokenTree:
    """EAGLE-2's tree: each depth, the top_k frontier nodes (by cumulative draft log-probability)
    get their row's top_k tokens as children; the top_k best of those are the next frontier;
    finally the total_tokens best nodes of all are kept (a child never scores above its parent,
    and ties go to the earlier node, so every kept node's parent is kept)."""
    tree = TokenTree(root, TOP)
    score = [0.0]
    frontier = [0]
    for _ in range(min(depth, max_depth)):
        rows = drafter.expand(ctx, tree, frontier)
        new = []
        for node, row in zip(frontier, rows):
            tree.rows[node] = row  # not needed to verify (point masses), kept for inspection
            for token in top_tokens(row, top_k):
                new.append(tree.add(node, token))
                score.append(score[node] + math.log(float(row[token])))
        if not new:
            break
        frontier = sorted(new, key=lambda n: (-score[n], n))[:top_k]
    best = sorted(range(1, len(tree)), key=lambda n: (-score[n], n))[:total_tokens]
    return tree.keep(best)
