"""The device rounds' tree verification: one walk from the root for every round that verifies a tree.

The static tree (trees.py), EAGLE-2's dynamic tree (dynamic.py) and SJD-PAC's spine or full trees
(proactive.py) verify their windows the same way (SJD-PAC App. A.3 for SD, the host loop's
runtime.verification.siblings.verify_candidates): depth by depth, the accepted node's children are
tried in rank order with the method's rule against the residual target and q^(k), the row the
child was drawn from without the earlier children; an accepted child becomes the node; all
rejected leaves the residual to draw the next token from; a node without children, or the image's
end, leaves its row to draw the bonus token from. `walk_tree` is that walk, batched with shapes
that never depend on an outcome; `draw_next_token` is the draw that ends it. SJD-PAC's round verifies a
chain below its tree before drawing, so the two are apart.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch

from specrt.runtime.rounds.state import TEST, RoundState
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.rules import AcceptanceRule

# proposal(depth, node, token, removed): the q [I, V] a child at `depth` of `node` [I] with `token` [I]
# was drawn from, given the earlier children's tokens tried (`removed` [I, V])
Proposal = Callable[[int, Any, Any, Any], Any]


class TreeWalk(NamedTuple):
    """Where the walk ended, per image [I] (path: [I, depths + 1])."""

    stopped: Any  # the walk ended inside the tree: all children rejected, a leaf, or the image's end
    accepted: Any  # τ: the children accepted, depth by depth
    rejected: Any  # all children of the last node rejected: the next token comes from `residual`
    final: Any  # the node whose row gives the bonus token where not rejected (the last accepted node)
    bonus: Any  # [I, V]: that node's target row
    residual: Any  # [I, V] float64: the residual target after the last node's rejections
    path: Any  # the accepted nodes by depth (node 0 the root); past τ, the starting path's


def marked(like: Any, tokens: Any, where: Any) -> Any:
    """A boolean mask shaped like `like` [..., V], true at tokens [...] where `where` [...] is."""
    return torch.zeros_like(like).scatter_(-1, tokens[..., None], where[..., None])


def without_earlier(row: Any, removed: Any) -> Any:
    """q^(k): the float64 row [I, V] without the earlier children's tokens (`removed`), renormalised
    (a row with no mass left gives zeros, so f = 1 where it is read)."""
    rest = torch.where(removed, 0.0, row)
    return rest / rest.sum(dim=-1, keepdim=True).clamp(min=1e-300)


def point_mass(depth: int, node: Any, token: Any, removed: Any) -> Any:
    """walk_tree's proposal for children that are their rows' top-k, not draws (EAGLE-2's, greedy
    decoding's): the point mass on each child's token [I] (runtime.verification.siblings TOP)."""
    return torch.zeros_like(removed, dtype=torch.float64).scatter_(1, token[:, None], 1.0)


def walk_tree(state: RoundState, rule: AcceptanceRule, tokens: Any, children: Any, valid: Any, p_rows: Any,
              limit: Any, widest: Sequence[int], proposal: Proposal, parts: Any = None,
              path: Optional[Any] = None) -> TreeWalk:
    """Verify every image's token tree from the root, depths 1..D (D = len(widest)).

    tokens [I, W] and valid [I, W] per node (node 0: the root), children [I, W, K] each node's children
    by rank (−1: none; a node whose first child is not valid is a leaf), p_rows [I, W, V] the target's
    rows by node, limit [I] the depths that fit the image, widest[d − 1] the most children a node at
    depth d − 1 has, proposal the q of each child (Proposal), parts [I, W] each node's number in the
    counter coordinates of its test, as the host loop's tree numbers it (None: the node's index), path
    the starting path [I, ≥ D + 1] (None: zeros [I, D + 1]; a copy is written). A leaf is found when
    the walk reaches it, so an accepted node at depth D is not checked: `final` is then that node."""
    n = state.length
    images = n.shape[0]
    image = torch.arange(images, device=n.device)
    node = torch.zeros_like(n)
    stopped = torch.zeros(images, dtype=torch.bool, device=n.device)
    rejected = torch.zeros_like(stopped)
    accepted, final = torch.zeros_like(n), torch.zeros_like(n)
    residual = p_rows[:, 0].to(torch.float64)
    if path is None:
        path = torch.zeros((images, len(widest) + 1), dtype=torch.int64, device=n.device)
    else:
        path = path.clone()
    # each node's children's presence, tokens and parts [I, W, K], gathered once: a depth then reads its
    # node's K at once, and a sibling's test only slices them
    flat = children.clamp(min=0).reshape(images, -1)
    present = (children >= 0) & valid.gather(1, flat).view(children.shape)
    child_tokens = tokens.gather(1, flat).view(children.shape)
    child_parts = (flat if parts is None else parts.gather(1, flat)).view(children.shape)
    for depth in range(1, len(widest) + 1):
        kids = children[image, node]  # [I, K]
        kids_present, kids_tokens = present[image, node], child_tokens[image, node]
        kids_parts = child_parts[image, node]
        has_children = kids_present[:, 0]
        active = ~stopped & (depth <= limit)
        going = active & has_children
        target = p_rows[image, node].to(torch.float64)
        removed = torch.zeros_like(target, dtype=torch.bool)
        chosen = torch.full_like(n, -1)
        position = torch.full_like(n, depth)
        for rank in range(widest[depth - 1]):
            trying = going & kids_present[:, rank] & (chosen < 0)
            token = kids_tokens[:, rank]
            q = proposal(depth, node, token, removed)
            f = rule.accept_probabilities(target[image[:, None], rule.columns(token)], q[image, token], position)
            passed = state.uniforms(n - 1 + depth, TEST, part=kids_parts[:, rank]) <= f
            chosen = torch.where(trying & passed, rank, chosen)
            failed = trying & ~passed
            target = torch.where(failed[:, None], rule.resample(target, q, token, position), target)
            removed = removed | marked(removed, token, trying)
        took = active & (chosen >= 0)
        reached = kids[image, chosen.clamp(min=0)]
        all_failed = going & ~took
        at_end = (active & ~has_children) | (~stopped & ~active)  # a leaf, or the image's end: its bonus
        final = torch.where(at_end, node, final)
        residual = torch.where(all_failed[:, None], target, residual)
        rejected = rejected | all_failed
        stopped = stopped | all_failed | at_end
        accepted = accepted + took.to(accepted.dtype)
        path[:, depth] = torch.where(took, reached, path[:, depth])
        node = torch.where(took, reached, node)
    final = torch.where(stopped, final, node)  # accepted down to the deepest level: its row's bonus
    return TreeWalk(stopped, accepted, rejected, final, p_rows[image, final], residual, path)


def draw_next_token(walk: TreeWalk, uniforms: Any) -> Any:
    """The token [I] after the walk, drawn with uniforms [I]: from the residual where all children
    of the last node were rejected, else from the final node's row (the bonus)."""
    return torch.where(walk.rejected, inverse_cdf(walk.residual, uniforms), inverse_cdf(walk.bonus, uniforms))
