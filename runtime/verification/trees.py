"""Verifying a token tree (tree drafting for sd, cool-sd, lantern): walk from the root, verifying
each node's children as siblings (runtime.verification.siblings) until a rejection or a leaf.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Optional, Sequence

import numpy as np

from specrt.runtime.verification.rules import AcceptanceRule
from specrt.runtime.verification.siblings import _candidates, candidate_proposals, verify_candidates
from specrt.runtime.verification.waves import read_in_waves, rows_ahead


@dataclass
class TreeOutcome:
    """The accepted path (window slots from the root), its drafted tokens, and the token after them."""

    path: list[int]
    accepted: list[int]
    next_token: int


def verify_tree(p_rows: Any, tree: Any, rule: AcceptanceRule, rng: np.random.Generator, bonus: Any) -> TreeOutcome:
    """Walk a token tree (runtime.tree.TokenTree) from the root: at each node verify its children in
    order (verify_candidates with the draft distributions they were drawn from); an accepted child
    becomes the next node; a total rejection ends the walk with the resampled token; at a node
    without children the token after it is `bonus[node]`, the head's draw from that node's row.

    p_rows [W, V]: the target's rows by window slot (= node); only the tested tokens' entries and
    the rows of a rejection's residual are read. verify_trees does a round's images together.
    """
    return read_in_waves({0: _tree_walk(p_rows, tree, rule, rng, bonus)})[0]


def verify_trees(p_block: Any, trees: Sequence[Optional[Any]], rule: AcceptanceRule,
                 rngs: Sequence[np.random.Generator], bonus: Any) -> list[Optional[TreeOutcome]]:
    """verify_tree for each image p of a round (trees[p]; None: no tree, no outcome) with p_block[p]
    its rows and bonus[p] its draws, each image with its own stream, the same outcomes.

    What the batch reads of device rows (a backend that gathers several blocks at once: the torch
    backend's DeviceRows) goes in a few transfers for all images instead of a few per image and
    node: the images walk their trees in lockstep (read_in_waves), first asking for the entries
    every node's children are tested at (rule.columns of their tokens: one gather for the batch),
    then for the whole rows their rejections need (a wave per depth at most). Host rows are read
    where they are."""
    ahead = not isinstance(p_block, np.ndarray) and hasattr(type(p_block), "gather_all")
    outcomes = read_in_waves({p: _tree_walk(p_block[p], tree, rule, rngs[p], bonus[p], ahead)
                              for p, tree in enumerate(trees) if tree is not None})
    return [outcomes.get(p) for p in range(len(trees))]


def _tree_walk(p_rows: Any, tree: Any, rule: AcceptanceRule, rng: np.random.Generator, bonus: Any,
               ahead: bool = False) -> Generator[list, list, TreeOutcome]:
    """verify_tree's walk (read_in_waves) over p_rows [W, V] (host or device rows). `ahead`: first ask
    for the entries each node's children are tested at, which then stand for the rows in the tests."""
    entries = (yield from rows_ahead(p_rows, {
        node: np.unique(rule.columns(np.array([tree.tokens[c] for c in kids]))).tolist()
        for node, kids in enumerate(tree.children) if kids})) if ahead else {}
    node, path, accepted = 0, [0], []
    while tree.children[node]:
        kids = tree.children[node]
        proposals = candidate_proposals(tree.rows.get(node), [tree.tokens[c] for c in kids], tree.drawn,
                                        p_rows.shape[-1])
        row, position = entries.get(node, p_rows[node]), tree.depths[node] + 1
        if isinstance(row, np.ndarray):  # a host row: nothing to ask for
            index, token = verify_candidates(row, proposals, rule, position, rng)
        else:
            index, token = yield from _candidates(row, proposals, rule, position, rng)
        if index is None:
            return TreeOutcome(path, accepted, token)
        node = kids[index]
        path.append(node)
        accepted.append(token)
    return TreeOutcome(path, accepted, int(bonus[node]))
