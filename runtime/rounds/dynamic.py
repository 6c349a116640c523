"""The dynamic-tree round (EAGLE-2's growth) for sd, cool-sd and lantern (a draft model or an EAGLE head).

runtime/tree.py DynamicGrowth on the host: each of `depth` draft passes expands the top_k frontier
nodes (by cumulative draft log-probability) into their rows' top_k tokens with mass (greedy
decoding: the rows before the argmax, drafts.py `tree_rows`); the top_k best new candidates are the
next frontier; the total_tokens best candidates of all within the image's reach make the tree (a
child never scores above its parent, ties go to the earlier, so every kept node's parent is kept),
each child a point mass verified as EAGLE-2 does. Here every pass has the same shapes: the root's
pass gives top_k candidates, each later one top_k² (frontier slots whose parent had no mass carry
−inf scores, as do candidates past the image's end: never in the tree). The draft writes its
frontier nodes to scratch offset pass · top_k + slot (its root is in its token columns, from the
catch-up). The tree, its ancestry and each node's children by rank are made on the device from
the kept candidates' parents; the walk is the static tree's (walk.py walk_tree), each child's q its point mass.
"""
from __future__ import annotations

from typing import Any

import torch

from specrt.runtime.rounds.chains import DraftedRound
from specrt.runtime.rounds.state import NEXT, RoundState
from specrt.runtime.rounds.walk import TreeWalk, draw_next_token, marked, point_mass, walk_tree
from specrt.runtime.verification.rules import AcceptanceRule


class DynamicTreeRound(DraftedRound):
    """One dynamic-tree draft-then-verify round (see the module docstring)."""

    def __init__(self, target: Any, draft: Any, rule: AcceptanceRule, depth: int, top_k: int, total_tokens: int):
        self.target, self.draft, self.rule = target, draft, rule
        self.depth, self.top_k, self.total_tokens = depth, top_k, total_tokens
        self.candidates = 1 + top_k + (depth - 1) * top_k * top_k
        self.kept = min(total_tokens, self.candidates - 1)
        self.window = self.kept + 1
        self.passes = {"target": 1, "draft": depth}

    @staticmethod
    def draft_scratch(depth: int, top_k: int) -> int:
        """Scratch columns the draft's frontier nodes take (pass · top_k + slot)."""
        return depth * top_k

    def __call__(self, state: RoundState) -> None:
        n = state.length
        image = torch.arange(n.shape[0], device=n.device)[:, None]
        limit = (state.total - n - 1).clamp(min=0)
        parent, token, score, offset, depth = self._grow(state, n)
        nodes, node_parent, node_depth = self._keep(parent, score, depth, limit)
        tokens = token.gather(1, nodes)
        ancestry = self._ancestry(node_parent)
        p_rows = self.target.tree_window(tokens, node_depth, ancestry, n - 1)
        walk = self._walk(state, n, tokens, node_parent, node_depth, p_rows, limit)
        accepted, path = walk.accepted, walk.path
        next_token = draw_next_token(walk, state.uniforms(n, NEXT))
        self.target.commit_path(path, n - 1)
        draft_slots = offset.gather(1, nodes.gather(1, path[:, 1:])).clamp(min=0)  # unfed nodes: rewritten later
        self.draft.verified(n, path, draft_slots)
        state.commit(accepted, tokens[image, path[:, 1:]], next_token)

    def _grow(self, state: RoundState, n: Any) -> tuple[Any, Any, Any, Any, Any]:
        """Every candidate's parent, token, score, draft scratch offset (−1: never expanded) and depth,
        [I, candidates] each: the root (its token the pending one), then each pass's children."""
        k, images = self.top_k, n.shape[0]
        rows = self.draft.tree_rows(self.draft.catch_up(state))[:, None]  # the root's row [I, 1, V]
        frontier = torch.zeros((images, 1), dtype=torch.int64, device=n.device)  # candidate ids
        frontier_ancestry = torch.zeros((images, 1, self.draft_scratch(self.depth, k)), dtype=torch.bool,
                                        device=n.device)
        parents, tokens, scores, depths = [torch.full((images, 1), -1, device=n.device)], [state.pending()[:, None]], \
            [torch.zeros((images, 1), dtype=torch.float64, device=n.device)], [torch.zeros_like(n)[:, None]]
        offsets = [torch.full((images, 1), -1, dtype=torch.int64, device=n.device)]
        first = 1
        for p in range(self.depth):
            mass, best = rows.to(torch.float64).topk(k, dim=-1)  # [I, F, k], best first
            parent_score = torch.cat(scores, dim=1).gather(1, frontier)  # [I, F]
            child_score = torch.where(mass > 0, parent_score[:, :, None] + mass.clamp(min=1e-300).log(),
                                      float("-inf")).reshape(images, -1)
            parents.append(frontier[:, :, None].expand(-1, -1, k).reshape(images, -1))
            tokens.append(best.reshape(images, -1))
            scores.append(child_score)
            depths.append(torch.full_like(child_score, p + 1, dtype=torch.int64))
            offsets.append(torch.full_like(child_score, -1, dtype=torch.int64))
            if p + 1 == self.depth:
                break
            # the next frontier: the top_k best new candidates, fed to the draft at scratch (p + 1)·k + slot
            chosen = child_score.topk(k, dim=-1).indices  # [I, k]
            slot = (p + 1) * k + torch.arange(k, device=n.device)
            offsets[-1].scatter_(1, chosen, slot[None].expand(images, -1))
            came_from = chosen // k  # the frontier slot of each one's parent
            ancestry = frontier_ancestry.gather(1, came_from[:, :, None].expand(-1, -1, frontier_ancestry.shape[-1]))
            ancestry = ancestry | marked(ancestry, slot[None].expand(images, -1), torch.ones_like(chosen, dtype=torch.bool))
            frontier = first + chosen
            first += child_score.shape[1]
            frontier_ancestry = ancestry
            fed = tokens[-1].gather(1, chosen)
            # each one's parent: the root (scratch slot 0, for a head) or the frontier fed at p · k + slot
            rows = self.draft.tree_rows(self.draft.expand(fed, torch.full_like(fed, p), ancestry, n, slot,
                                                          p * k + came_from))
        return (torch.cat(parents, dim=1), torch.cat(tokens, dim=1), torch.cat(scores, dim=1),
                torch.cat(offsets, dim=1), torch.cat(depths, dim=1))

    def _keep(self, parent: Any, score: Any, depth: Any, limit: Any) -> tuple[Any, Any, Any]:
        """The tree: the root and the `kept` best candidates in candidate order (parents first), as
        candidate ids [I, W], each node's parent node (−1: the root's, or a node not in the tree, never
        reached) and depth. Only candidates with mass within the image's reach (depth <= limit [I])
        make the tree, as the host grows min(depth, drafts left) passes and keeps those with mass:
        the slots the rest take are never reached."""
        images = parent.shape[0]
        score = torch.where(depth <= limit[:, None], score, float("-inf"))
        best = score[:, 1:].topk(self.kept, dim=-1).indices + 1
        nodes = torch.cat([torch.zeros_like(best[:, :1]), best.sort(dim=-1).values], dim=1)  # [I, W]
        node_of = torch.full_like(parent, -1).scatter_(1, nodes, torch.arange(nodes.shape[1], device=parent.device)
                                                       [None].expand(images, -1))
        node_parent = node_of.gather(1, parent.gather(1, nodes).clamp(min=0))
        node_parent = torch.where(score.gather(1, nodes) > float("-inf"), node_parent, -1)
        node_parent[:, 0] = -1
        return nodes, node_parent, depth.gather(1, nodes)

    def _ancestry(self, node_parent: Any) -> Any:
        """[I, W, W]: node j sees node i when i is j or an ancestor of j."""
        images, width = node_parent.shape
        at = torch.arange(width, device=node_parent.device)[None].expand(images, -1)
        ancestry = torch.eye(width, dtype=torch.bool, device=node_parent.device)[None].repeat(images, 1, 1)
        for _ in range(self.depth):
            at = node_parent.gather(1, at.clamp(min=0)).where(at >= 0, at)
            ancestry = ancestry | marked(ancestry, at.clamp(min=0), at >= 0)
        return ancestry

    def _walk(self, state: RoundState, n: Any, tokens: Any, node_parent: Any, node_depth: Any, p_rows: Any,
              limit: Any) -> TreeWalk:
        """walk_tree over the kept tree: each node's children by rank (candidate order: a parent's
        children best first), each child's q its point mass (EAGLE-2's top-k children)."""
        images, width = node_parent.shape
        k = self.top_k
        reachable = node_parent >= 0
        earlier = torch.ones((width, width), dtype=torch.bool, device=n.device).tril(-1)  # [j, i]: i < j
        rank = ((node_parent[:, :, None] == node_parent[:, None, :]) & earlier[None]).sum(dim=-1)
        flat = node_parent.clamp(min=0) * k + rank.clamp(max=k - 1)
        flat = torch.where(reachable, flat, width * k)  # the unreached go to a column dropped below
        nodes = torch.arange(width, device=n.device)[None].expand(images, -1)
        children = torch.full((images, width * k + 1), -1, dtype=torch.int64, device=n.device)
        children = children.scatter(1, flat, torch.where(reachable, nodes, -1))[:, :-1].reshape(images, width, k)
        valid = reachable.clone()
        valid[:, 0] = True
        # the host's tree (runtime/tree.py DynamicGrowth) holds only the candidates with mass, and numbers
        # them in candidate order: where fewer have mass than the round keeps, empty ones sit among them
        # here (which ones, topk's order of ties decides), so each node's test is keyed by its host number
        parts = valid.cumsum(dim=1) - 1
        return walk_tree(state, self.rule, tokens, children, valid, p_rows, limit, [k] * self.depth, point_mass,
                         parts)
