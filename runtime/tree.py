"""Token trees for tree drafting (sd, cool-sd, lantern): shapes, and how a drafter grows them.

A TokenTree is one round's proposal. Node 0 is the root, the pending token (sampled last round,
its KV not yet computed); every later node is a drafted token whose parent is an earlier node, so
node order is window slot order and `window()` is what the target verifies in one pass
(runtime.window: positions = committed length + depth, the tree mask = each node's ancestry).

How a node's children were drafted decides which draft distribution each child is verified
against (runtime.verification.siblings.candidate_proposals):
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

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.validation import Param
from specrt.runtime.verification.siblings import SAMPLED, TOP, draws_without_replacement
from specrt.runtime.tree_plan_file import is_plan_reference, read_plan
from specrt.runtime.window import Window

TREES = ("chain", "static", "dynamic")

# EAGLE-1's eagle/model/choices.py (also in LANTERN's models/drafters/choices.py): 25 drafts.
MC_SIM_7B_63 = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
                [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
                [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
DEFAULT_STATIC_TREE = "mc_sim_7b_63"  # the methods' static_tree, and the tree `export --draft-tree` drafts in one call
DEFAULT_GROWTH = (6, 8)  # the methods' dynamic depth and tree_top_k, and what `export --draft-growth` grows in one call
# LANTERN's models/drafters/choices.py (its static-tree experiments; naive_extend_57 is the
# default of its ea_model_llamagen.generate, mc_sim_7b_63 of its generate_images.py; its `chain`
# is tree=chain draft_len=5 here).
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
    "medusa_2_7b_63": [[i] for i in range(10)]
                      + [[0, i] for i in range(10)] + [[1, i] for i in range(5)]
                      + [[2, 0], [2, 1], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0]]
                      + [[0, 0, i] for i in range(9)] + [[0, 1, i] for i in range(4)]
                      + [[0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [1, 0, 0], [1, 0, 1], [1, 0, 2],
                         [1, 1, 0], [2, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 1, 0],
                         [0, 0, 2, 0], [0, 1, 0, 0]],
    "reverse_balanced_25": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0],
                            [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [1, 0, 0],
                            [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 1, 0], [0, 0, 1, 1],
                            [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 0, 3], [0, 0, 0, 1, 0],
                            [0, 0, 0, 1, 1], [0, 0, 0, 1, 2]],
}


class TokenTree:
    """Tokens, parents and depths of one round's proposal; `rows[n]` is the draft's row after node
    n (the q its children were drawn from), `drawn` how children were drafted (SAMPLED or TOP);
    `parts[n]`, where set, node n's number in the counter coordinates of its draws and test (a static
    shape's node id, which a tree that lost nodes no longer equals; None: the node ids)."""

    def __init__(self, root: int, drawn: str):
        self.tokens: list[int] = [int(root)]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.children: list[list[int]] = [[]]  # in verification order
        self.rows: dict[int, Any] = {}
        self.drawn = drawn
        self.parts: Optional[list[int]] = None

    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int], drawn: str) -> "TokenTree":
        """The tree of these nodes (parents[n] < n, −1 for the root), children in node order."""
        tree = cls(tokens[0], drawn)
        tree.tokens, tree.parents = [int(t) for t in tokens], list(parents)
        tree.children = [[] for _ in tokens]
        for node, parent in enumerate(parents[1:], 1):
            tree.depths.append(tree.depths[parent] + 1)
            tree.children[parent].append(node)
        return tree

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

    def add_children(self, parent: int, tokens: Sequence[int]) -> range:
        """Append drafted children of `parent` in order (as `add` one after another); their node ids."""
        start, count, depth = len(self.tokens), len(tokens), self.depths[parent] + 1
        self.tokens += tokens
        self.parents += [parent] * count
        self.depths += [depth] * count
        self.children += [[] for _ in range(count)]
        self.children[parent] += range(start, start + count)
        return range(start, start + count)

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


def level_window(tree: TokenTree, nodes: Sequence[int], staged: dict[int, int]) -> Window:
    """The window that runs `nodes` of `tree` (in node order, parents first) when the nodes in
    `staged` (node -> staged cache row, runner.stage) were run earlier this round: each node sits
    at its depth, sees its parent chain inside the window and its staged ancestors in the cache."""
    slot = {n: w for w, n in enumerate(nodes)}
    parents, tree_parents = [], tree.parents
    seen: list[tuple[int, ...]] = []
    for node in nodes:
        parent = tree_parents[node]
        parents.append(slot.get(parent, -1))
        rows = []
        while parent >= 0:
            if parent in staged:
                rows.append(staged[parent])
            parent = tree_parents[parent]
        seen.append(tuple(rows))
    return Window.level([tree.tokens[n] for n in nodes], parents, [tree.depths[n] for n in nodes], seen, len(staged))


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
        self.paths = [list(p) for p in paths]  # in node order (breadth first): path n − 1 is node n's
        self.size = len(paths)
        self.depth = max((len(p) for p in paths), default=0)


# plan file -> ((mtime_ns, size) it was read at, its shape): each generate call asks for the shape
# three times (the parameter check, max_window, the tree loop), each read and parse ~0.1 ms
_PLANNED: dict[str, tuple[tuple[int, int], StaticShape]] = {}


def static_shape(name: str) -> StaticShape:
    """The shape `static_tree` names: a STATIC_TREES name, or a tree plan file (runtime.tree_plan_file,
    written by `specrt plan-tree`: the tree sized for a device). A plan is parsed once per version
    of its file (modification time and size), so a rewritten plan is still seen at once."""
    if name in STATIC_TREES:
        return StaticShape(STATIC_TREES[name])
    if not is_plan_reference(name):
        raise SpecrtError(f"unknown static tree {name!r}; choose one of {', '.join(STATIC_TREES)}, "
                          f"or give a tree plan file (specrt plan-tree)")
    try:
        stat = os.stat(name)
        stamp: Optional[tuple[int, int]] = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None  # read_plan says why in one line
    cached = _PLANNED.get(name)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    tree = read_plan(name).tree
    try:
        shape = StaticShape(tree)
    except SpecrtError as exc:
        raise SpecrtError(f"tree plan {name}: {exc}") from None
    if stamp is not None:
        _PLANNED[name] = (stamp, shape)
    return shape


@dataclass(frozen=True)
class StaticTreeParam(Param):
    """The `static_tree` method parameter: a STATIC_TREES name, or the path of a tree plan file,
    which is read and checked here, when the method is made (a CLI typo fails before a model loads)."""

    def check(self, name: str, value: Any) -> str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str) and value in STATIC_TREES:
            return value
        if not isinstance(value, str) or not is_plan_reference(value):
            shown = repr(value) if isinstance(value, str) else str(value)
            raise SpecrtError(f"{name} must be one of {', '.join(STATIC_TREES)} or a tree plan file "
                              f"(specrt plan-tree), got {shown}")
        try:
            static_shape(value)
        except SpecrtError as exc:
            raise SpecrtError(f"{name}: {exc}") from None
        return value


class StaticGrowth:
    """Grows `shape` below `root`, one draft pass per depth: every node with children in the shape
    gets them drawn without replacement from its row (fewer where the row has fewer tokens with
    mass; their subtrees go too). Nodes deeper than `max_depth` (the image's end) are left out.

    Greedy decoding (`greedy`): every row is one-hot, so draws without replacement would give one
    child per node and the tree would collapse to a chain. As EAGLE does at temperature 0, a node's
    children are then its row's top-k tokens by the head's softmax before the argmax
    (StepOutput.ranking), drafted as TOP: each child is verified as a point mass, which accepts
    it exactly when it is the target's argmax, so the output is greedy decoding's."""

    def __init__(self, root: int, shape: StaticShape, max_depth: int, greedy: bool = False,
                 uniforms: Optional[Sequence[float]] = None):
        self.tree = TokenTree(root, TOP if greedy else SAMPLED)
        self.tree.parts = [0]
        self.shape, self.max_depth, self.greedy = shape, max_depth, greedy
        self.uniforms = uniforms  # [shape nodes − 1]: shape node m drawn with uniforms[m − 1] (not greedy)
        self._frontier = [(0, 0)]  # (tree node, shape node)
        self._expanding: list[tuple[int, int]] = []

    def pending(self) -> list[int]:
        """The nodes whose draft rows the next pass must give ([] once the tree is grown)."""
        self._expanding = [(n, s) for n, s in self._frontier if self.shape.children[s] and self.tree.depths[n] < self.max_depth]
        return [n for n, _ in self._expanding]

    def receive(self, rows: Sequence[Any]) -> None:
        """The draft's rows after the pending nodes: their children drawn (each shape node with its
        own uniform, `uniforms`), or under greedy decoding their top tokens."""
        ranks = [self.shape.children[at] for _, at in self._expanding]  # each node's children in the shape
        if self.greedy:
            best = [top_rows(np.asarray(row, dtype=np.float64)[None], len(kids))[0].tolist() for row, kids in zip(rows, ranks)]
            drawn = [[t for t in tokens if row[t] > 0] for row, tokens in zip(rows, best)]
        else:  # the level's draws together, node after node
            uniforms = [[self.uniforms[kid - 1] for kid in kids] for kids in ranks]
            drawn = draws_without_replacement(rows, [len(kids) for kids in ranks], uniforms)
        self._frontier = []
        for (node, _), row, children, kids in zip(self._expanding, rows, drawn, ranks):
            self.tree.rows[node] = row
            self._frontier += zip(self.tree.add_children(node, children), kids)
            self.tree.parts += kids[:len(children)]

    def result(self) -> TokenTree:
        return self.tree


# ---- dynamic trees (EAGLE-2) ---------------------------------------------------------------------


def top_rows(block: np.ndarray, count: int) -> np.ndarray:
    """Each row's `count` most probable tokens, most probable first (ties: lower id): [F, count] of [F, V]."""
    return np.array([[token for _, token in row] for row in _ranked(block, count)], dtype=np.int64).reshape(len(block), -1)


def _ranked(block: np.ndarray, count: int) -> list[list[tuple[float, int]]]:
    """Per row of `block` [F, V], its `count` most probable tokens as (−value, token), most probable
    first (ties: lower id): one partition of the block, then the few winners sorted in Python."""
    count = min(count, block.shape[1])
    if count < block.shape[1]:
        best = np.argpartition(-block, count - 1, axis=1)[:, :count]
    else:
        best = np.broadcast_to(np.arange(block.shape[1]), block.shape)
    values = block[np.arange(len(best))[:, None], best]
    return [sorted(zip((-v for v in row_values), row_best))
            for row_values, row_best in zip(values.tolist(), best.tolist())]


class DynamicGrowth:
    """EAGLE-2's tree: each depth, the top_k frontier nodes (by cumulative draft log-probability)
    get their row's top_k tokens (with mass) as children; the top_k best of those are the next
    frontier; finally the total_tokens best nodes of all are kept (a child never scores above its
    parent, and ties go to the earlier node, so every kept node's parent is kept).

    Candidates live in lists (id 0 = the root); only the expanded ones join the tree the drafter
    sees (`tree`), and the kept ones make the result, children in order of draft probability."""

    def __init__(self, root: int, depth: int, top_k: int, total_tokens: int, max_depth: int):
        self.tree = TokenTree(root, TOP)  # the frontiers the drafter expands (and their ancestors)
        self.top_k, self.total_tokens = top_k, total_tokens
        self._passes = min(depth, max_depth)
        # per candidate (id 0 = the root): parent id, token, cumulative draft log-probability;
        # Python lists: a pass adds at most top_k² of them, fewer than numpy calls would cost
        self._parent, self._token, self._score = [-1], [int(root)], [0.0]
        self._node = {0: 0}  # candidate id -> node of `tree`
        self._frontier = [0]

    def pending(self) -> list[int]:
        return [self._node[c] for c in self._frontier] if self._passes > 0 else []

    def receive(self, rows: Sequence[Any]) -> None:
        """The draft's rows after the frontier; children are each row's top-k."""
        self._passes -= 1
        frontier = self._frontier
        for c, row in zip(frontier, rows):
            self.tree.rows[self._node[c]] = row  # not needed to verify (point masses), kept for inspection
        # each row's top_k tokens with mass, best first (the rows' own dtype ranks them as float64 would)
        parents, tokens, masses = [], [], []
        for parent, ranked in zip(frontier, _ranked(rows if isinstance(rows, np.ndarray) else np.array(rows), self.top_k)):
            for value, token in ranked:
                if value < 0:  # (−value: kept when it has mass)
                    parents.append(parent)
                    tokens.append(token)
                    masses.append(-value)
        if not parents:
            self._passes = 0
            return
        first = len(self._token)
        scores = [self._score[parent] + log for parent, log in
                  zip(parents, np.log(np.array(masses, dtype=np.float64)).tolist())]
        self._parent += parents
        self._token += tokens
        self._score += scores
        # the top_k best new candidates (ties: the earlier), in that order
        self._frontier = [first + j for j in _best_first(scores)[: self.top_k]]
        for c in self._frontier:
            self._node[c] = self.tree.add(self._node[self._parent[c]], self._token[c])

    def result(self) -> TokenTree:
        # the total_tokens best candidates (ties: the earlier), in candidate order: parents first
        chosen = sorted(1 + c for c in _best_first(self._score[1:])[: self.total_tokens])
        index = {0: 0, **{c: n for n, c in enumerate(chosen, 1)}}
        tree = TokenTree.from_parents([self._token[0], *(self._token[c] for c in chosen)],
                                      [-1, *(index[self._parent[c]] for c in chosen)], TOP)
        tree.rows = {index[c]: self.tree.rows[n] for c, n in self._node.items() if c in index and n in self.tree.rows}
        return tree


def _best_first(scores: Sequence[float]) -> list[int]:
    """Indices of `scores`, highest first, ties in index order (a stable sort, also reversed)."""
    return sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
