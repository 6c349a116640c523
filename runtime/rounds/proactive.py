"""SJD-PAC's round with proactive drafting: spine or full trees of K candidates a depth, on the device.

After a rejection SJD-PAC drafts the next D depths as K candidates each, drawn without replacement
from their rows, the first of them carrying the chain (runtime/methods/jacobi.py): on a spine
(tree="spine") depth d's candidates are children of depth d − 1's first, K·D tree slots; in a full
K-ary tree (tree="full") they are children of every node of depth d − 1, the same K tokens under
each, K + K² + … + K^D slots. The chain fills the window's other slots below the first path.
Otherwise the window is a chain of L. So an image's window has one of two layouts, both fixed: the
round holds both as constant tables (window_layouts: each slot's children, depth, candidate number
and ancestry, the first path, the rows' route) and picks one per image with a flag, so no shape
depends on an outcome.

One round: the target scores the tree window (keys/values in scratch columns: siblings share a
token index); depths 1..D are verified from the pending token down by the trees' walk
(runtime/rounds/walk.py walk_tree), the accepted node's children sibling by sibling (SJD-PAC App.
A.3: candidate k tested against the residual p^(k) with q^(k), q without the earlier candidates,
each depth a loop of K fixed steps over the batch), the chain
below the first path with verify_chain_block; the accepted path's keys/values are copied to their
tokens' columns (DeviceModel.commit_path); the next window comes from this pass's rows along the
accepted path and its first children (SJD's draws, adaptive continuation's re-tests or Gumbel-max
draws: the coupling), and after a
rejection its first D depths get K − 1 more candidates each.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from specrt.runtime.conditions import Conditions
from specrt.runtime.grammar import ImageGrammar
from specrt.runtime.rounds.chains import start_state
from specrt.runtime.rounds.jacobi import FreshDrafts, next_drafts
from specrt.runtime.rounds.state import CANDIDATE, NEXT, TEST, RoundState
from specrt.runtime.rounds.walk import Proposal, draw_next_token, marked, walk_tree, without_earlier
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.chains import verify_chain_block
from specrt.runtime.verification.rules import VANILLA


def tree_nodes(branching: int, depth: int, full: bool) -> int:
    """The drafted slots proactive drafting's tree takes: K·D siblings on a spine, K + K² + … + K^D
    nodes in a full K-ary tree."""
    return sum(branching ** d for d in range(1, depth + 1)) if full else branching * depth


def window_layouts(width: int, branching: int, depth: int, full: bool = False) -> dict[str, list]:
    """The chain layout [0] and the tree layout [1] (spine, or `full`) of a window of `width` drafts,
    slots numbered as the host loop's build_window numbers them (pending = 0, then depth by depth):
    per layout each slot's children by candidate number ("children", −1: none; a chain slot's one
    child is candidate 0), parent (−1: the pending token's), depth, candidate number and ancestry
    (slot j sees slot i), the slot of the
    first path at each depth 0..width ("spine"; past the last depth its last slot), the route the
    next window's rows take from each slot ("route" [slot, depth]: its ancestors, then first
    children, then the spine where a leaf ends them: the host loop's row_route), and the number of
    depths ("levels")."""
    def layout(tree: bool) -> tuple[list, ...]:
        tree_depth = depth if tree else 0
        levels = width - (tree_nodes(branching, depth, full) if tree else 0) + tree_depth
        parents, depths, ks, children = [-1], [0], [0], [[-1] * branching]
        expanding = [0]  # the slots the next depth hangs under, the first path's first
        for d in range(1, levels + 1):
            made = []
            for parent in expanding:
                for k in range(branching if d <= tree_depth else 1):
                    children[parent][k] = len(parents)
                    made.append(len(parents))
                    parents.append(parent)
                    depths.append(d)
                    ks.append(k)
                    children.append([-1] * branching)
            expanding = made if full and d < tree_depth else made[:1]
        spine = [0]
        for d in range(1, width + 1):
            spine.append(children[spine[-1]][0] if d <= levels else spine[-1])
        ancestry = [[False] * (width + 1) for _ in range(width + 1)]
        route = []
        for slot in range(width + 1):
            path, at = [], slot
            while at >= 0:
                ancestry[slot][at] = True
                path.insert(0, at)
                at = parents[at]
            while len(path) <= width:
                child = children[path[-1]][0]
                path.append(child if child >= 0 else spine[len(path)])
            route.append(path)
        return children, depths, ks, ancestry, spine, route, levels, parents

    chain, tree = layout(False), layout(True)
    names = ("children", "depths", "ks", "ancestry", "spine", "route", "levels", "parents")
    return {name: [chain[i], tree[i]] for i, name in enumerate(names)}


class ProactiveRound:
    """SJD-PAC (any coupling, maximal being adaptive continuation; proactive drafting on, tree="spine" or
    `full`) as a round."""

    def __init__(self, target: Any, width: int, vocab: int, branching: int, depth: int, coupling: str,
                 grammar: Optional[ImageGrammar] = None, full: bool = False):
        if not depth < width or tree_nodes(branching, depth, full) > width:
            raise ValueError(f"a {'full' if full else 'spine'} tree of K = {branching}, D = {depth} and a chain "
                             f"below it do not fit a window of {width}")
        self.target, self.width, self.vocab = target, width, vocab
        # fresh slots follow the image grammar; under gumbel coupling every draft is a Gumbel-max draw
        self.fresh = FreshDrafts(target, vocab, grammar, gumbel=coupling == "gumbel")
        self.branching, self.depth, self.coupling = branching, depth, coupling
        self.window = width + 1
        self.passes = {"target": 1, "draft": 0}
        device = target.device
        tables = window_layouts(width, branching, depth, full)
        self.children = torch.tensor(tables["children"], dtype=torch.int64, device=device)  # [2, L + 1, K]
        self.spine = torch.tensor(tables["spine"], dtype=torch.int64, device=device)  # [2, L + 1]
        self.route = torch.tensor(tables["route"], dtype=torch.int64, device=device)  # [2, L + 1, L + 1]
        self.slot_depth = torch.tensor(tables["depths"], dtype=torch.int64, device=device)  # [2, L + 1]
        self.slot_k = torch.tensor(tables["ks"], dtype=torch.int64, device=device)
        self.ancestry = torch.tensor(tables["ancestry"], dtype=torch.bool, device=device)  # [2, L + 1, L + 1]
        self.levels = torch.tensor(tables["levels"], dtype=torch.int64, device=device)  # [2]
        under_first = [[parent < 0 or parent == spine[depths[parent]] for parent in parents]
                       for parents, spine, depths in zip(tables["parents"], tables["spine"], tables["depths"])]
        self.under_first = torch.tensor(under_first, dtype=torch.bool, device=device)  # [2, L + 1]

    def start(self, rows: Conditions, seeds: Sequence[int], total: int) -> RoundState:
        state = start_state(self, rows, seeds, total)
        images, device = state.length.shape[0], state.length.device
        if getattr(self, "candidates", None) is None:
            self.candidates = torch.zeros((images, self.width, self.branching), dtype=torch.int64, device=device)
            self.counts = torch.ones((images, self.width), dtype=torch.int64, device=device)
            self.tree = torch.zeros(images, dtype=torch.bool, device=device)
            self.drafted = torch.zeros((images, self.depth), dtype=torch.bool, device=device)
            self.proposal = torch.empty((images, self.width, self.vocab), dtype=self.target.row_dtype, device=device)
        self._first_window(state, slice(None))
        return state

    def refill(self, state: RoundState, images: list[int], rows: Conditions) -> None:
        """The admitted images' first windows, chains (rounds/chains.py admit_images)."""
        self._first_window(state, images)

    def _first_window(self, state: RoundState, images: Any) -> None:
        """The first window of `images` (a slice, or a list of images), in place: a chain of fresh drafts."""
        index = state.length[:, None] + torch.arange(self.width, device=state.length.device)
        self.candidates[images] = 0
        self.candidates[images, :, 0] = self.fresh.tokens(state, index)[images]
        self.counts[images] = 1
        self.tree[images] = False
        self.drafted[images] = False
        self.proposal[images] = self.fresh.rows(index)[images]

    def __call__(self, state: RoundState) -> None:
        n, width, depth = state.length, self.width, self.depth
        image = torch.arange(n.shape[0], device=n.device)[:, None]
        mode = self.tree.to(torch.int64)
        children, spine = self.children[mode], self.spine[mode]  # [I, L + 1, K], [I, L + 1]
        slot_depth, slot_k = self.slot_depth[mode], self.slot_k[mode]
        above = (slot_depth - 1).clamp(min=0)  # each slot's depth − 1: where its candidates are counted
        ids = self.candidates[image, above, slot_k]
        ids[:, 0] = state.pending()
        p_rows = self.target.tree_window(ids, slot_depth, self.ancestry[mode], n - 1)  # [I, L + 1, V]
        levels = self.levels[mode]
        limit = torch.minimum((state.total - n - 1).clamp(min=0), levels)
        next_u = state.uniforms(n, NEXT)
        # the slots holding a candidate this round: candidate k of depth d where depth d has more than
        # k, and below a node off the first path only where the tree fans out there (not `cut`)
        cut = self._unfanned()
        drawn = (slot_k < self.counts.gather(1, above)) & (self.under_first[mode] | ~cut.gather(1, slot_depth))
        walk = walk_tree(state, VANILLA, ids, children, drawn, p_rows, limit, [self.branching] * depth,
                         self._depth_row_without_earlier(), slot_k, spine)
        accepted, rejected, path = walk.accepted, walk.rejected, walk.path
        # the walk finds a leaf on reaching it, so one accepted at depth D is found here: a node off the
        # first path (the chain below hangs under the first path's node alone)
        stopped = walk.stopped | (children[image[:, 0], walk.final, 0] < 0)
        chain_limits = torch.where(stopped, 0, (limit - depth).clamp(min=0))
        steps = torch.arange(depth + 1, width + 1, device=n.device)
        a_chain, next_chain = verify_chain_block(
            p_rows[image, spine[:, depth:]], self.proposal[:, depth:width], ids[image, spine[:, depth + 1:]],
            chain_limits, state.uniforms(n[:, None] - 1 + steps, TEST), next_u, VANILLA)
        next_token = torch.where(stopped, draw_next_token(walk, next_u), next_chain)
        accepted = torch.where(stopped, accepted, depth + a_chain)
        rejected = torch.where(stopped, rejected, a_chain < chain_limits)
        self.target.commit_path(path, n - 1)
        tokens = ids[image, path[:, 1:]]
        route = self.route[mode][image[:, 0], path.gather(1, accepted[:, None])[:, 0]]  # from the path's end
        route = torch.where(cut, spine, route)  # off the first path only where the tree fanned out
        candidates, counts, proposal, drafted = self._next_window(state, p_rows, route, levels, accepted, rejected)
        state.commit(accepted, tokens, next_token)
        self.drafted.copy_(drafted)
        self.candidates.copy_(candidates)
        self.counts.copy_(counts)
        self.proposal.copy_(proposal)
        self.tree.copy_(rejected & (counts[:, : self.depth] > 1).any(dim=1))

    def _unfanned(self) -> Any:
        """[I, L + 1] by depth: this window's tree depths without candidates of their own (no row was
        left for them after the rejection), where the host loop's full tree stops fanning out (its
        tree has fewer than D depths then): a node off the first path above such a depth is a leaf."""
        flat = torch.zeros_like(self.tree)[:, None]
        return torch.cat([flat, ~self.drafted, flat.expand(-1, self.width - self.depth)], dim=1)

    def _depth_row_without_earlier(self) -> Proposal:
        """The walk's proposal: whichever node a depth's K candidates hang under, they are the depth's
        own, drawn once from its row without replacement, so candidate k's q is that row without the
        earlier candidates (q^(k))."""
        rows = self.proposal[:, : self.depth].to(torch.float64).unbind(1)  # D of [I, V]

        def depth_row_without_earlier(depth: int, node: Any, token: Any, removed: Any) -> Any:
            return without_earlier(rows[depth - 1], removed)

        return depth_row_without_earlier

    def _next_window(self, state: RoundState, p_rows: Any, route: Any, levels: Any, accepted: Any,
                     rejected: Any) -> tuple[Any, Any, Any, Any]:
        """The next round's candidates [I, L, K], their counts [I, L], rows [I, L, V] and which of its
        depths 1..D drafted candidates [I, D] (proactive drafting's, after a rejection): new depth
        j + 1 from the row of the route's slot (route [I, L + 1], by depth) at old depth τ + 1 + j
        (its SJD draw, or the old draft re-tested there), fresh random tokens past the last row;
        after a rejection, depths 1..D with K − 1 more candidates drawn without replacement from
        their rows."""
        n, width = state.length, self.width
        image = torch.arange(n.shape[0], device=n.device)[:, None]
        old_depth = accepted[:, None] + 1 + torch.arange(width, device=n.device)  # the row's depth for new depth j + 1
        index = n[:, None] + old_depth  # the new token index
        has_row = old_depth <= levels[:, None]
        stale = None
        if self.coupling == "maximal":
            old = (old_depth + 1).clamp(max=width) - 1  # the old draft at the new token's depth
            stale = self.candidates[image, old, 0], self.proposal[image, old], old_depth + 1 <= levels[:, None]
        first, proposal = next_drafts(state, p_rows, route[image, old_depth.clamp(max=width)], has_row, index, stale,
                                      self.fresh)
        candidates = torch.zeros_like(self.candidates)
        candidates[:, :, 0] = first
        counts = torch.ones_like(self.counts)
        drafting = has_row & rejected[:, None]
        if self.depth and self.branching > 1:
            self._proactive(state, candidates, counts, proposal, index, drafting)
        return candidates, counts, proposal, drafting[:, : self.depth]

    def _proactive(self, state: RoundState, candidates: Any, counts: Any, proposal: Any, index: Any,
                   drafting: Any) -> None:
        """Candidates 2..K of new depths 1..D (where `drafting`), each drawn from its row without the
        earlier ones (draw_without_replacement's rule: a row whose mass runs out stops), in place."""
        depth = self.depth
        rows = proposal[:, :depth].to(torch.float64)  # [I, D, V]
        firsts = candidates[:, :depth, 0]
        removed = marked(torch.zeros_like(rows, dtype=torch.bool), firsts, torch.ones_like(firsts, dtype=torch.bool))
        going = drafting[:, :depth] & (rows.sum(dim=-1) > 1e-12)
        for k in range(1, self.branching):
            rest = torch.where(removed, 0.0, rows)
            going = going & (rest.sum(dim=-1) > 1e-12)
            token = inverse_cdf(rest, state.uniforms(index[:, :depth], CANDIDATE, part=k))
            candidates[:, :depth, k] = torch.where(going, token, 0)
            counts[:, :depth] += going.to(counts.dtype)
            removed = removed | marked(removed, token, going)

