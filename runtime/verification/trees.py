"""Verifying a token tree (tree drafting for sd, cool-sd, lantern): walk from the root, verifying
each node's children as siblings (runtime.verification.siblings) until a rejection or a leaf.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.verification.rules import AcceptanceRule
from specrt.runtime.verification.siblings import candidate_proposals, verify_candidates
from specrt.runtime.verification.transport import host_rows


@dataclass
class TreeOutcome:
    """The accepted path (window slots from the root), its drafted tokens, and the token after them."""

    path: list[int]
    accepted: list[int]
    next_token: int


def verify_tree(p_rows: np.ndarray, tree: Any, rule: AcceptanceRule, coins: Sequence[float], next_uniform: float,
                bonus: Any) -> TreeOutcome:
    """Walk a token tree (runtime.tree.TokenTree) from the root: at each node verify its children in
    order (verify_candidates with the draft distributions they were drawn from); an accepted child
    becomes the next node; a total rejection ends the walk with the resampled token; at a node
    without children the token after it is `bonus[node]`, the head's draw from that node's row.

    p_rows [W, V]: the target's rows by window slot (= node), on the host; coins[n] the uniform node
    n is tested with, next_uniform the draw after a total rejection (the round's TEST uniforms by
    node and its NEXT uniform: runtime.decoding).
    """
    node, path, accepted = 0, [0], []
    while tree.children[node]:
        kids = tree.children[node]
        proposals = candidate_proposals(tree.rows.get(node), [tree.tokens[c] for c in kids], tree.drawn,
                                        p_rows.shape[-1])
        index, token = verify_candidates(p_rows[node], proposals, rule, tree.depths[node] + 1,
                                         [coins[c] for c in kids], next_uniform)
        if index is None:
            return TreeOutcome(path, accepted, token)
        node = kids[index]
        path.append(node)
        accepted.append(token)
    return TreeOutcome(path, accepted, int(bonus[node]))


def verify_trees(p_block: Any, trees: Sequence[Optional[Any]], rule: AcceptanceRule, coins: Sequence[Any],
                 next_uniforms: Sequence[float], bonus: Any) -> list[Optional[TreeOutcome]]:
    """verify_tree for each image p of a round (trees[p]; None: no tree, no outcome) with p_block[p]
    its rows, coins[p] and next_uniforms[p] its uniforms and bonus[p] its draws.

    Device rows are read to the host first, the round's whole block in one read: on a GPU the
    device round (runtime/rounds) verifies where the rows live, and this loop is the reference."""
    if all(tree is None for tree in trees):
        return [None] * len(trees)
    rows = host_rows(p_block)
    return [None if tree is None else verify_tree(rows[p], tree, rule, coins[p], float(next_uniforms[p]), bonus[p])
            for p, tree in enumerate(trees)]
