"""The static-tree round: sd, cool-sd and lantern drafting a fixed tree shape (a draft model or an EAGLE head).

The shape (runtime/tree.py StaticShape: EAGLE's mc_sim_7b_63, or a `specrt plan-tree` plan) is the
same every round, so its tables are constants: each node's parent, depth, children by rank, and
which nodes have children. One round, all on the device:
1. the draft catches up, as the chain round's does (runtime/rounds/drafts.py), giving the root's row;
2. depth by depth, every node's children are drawn without replacement from its row (a row whose
   mass runs out draws fewer: the missing children and their subtrees are marked invalid), and
   the draft runs one pass over the next depth's nodes that have children (a tree window in its
   scratch columns), giving their rows;
3. the target scores the whole tree in one pass (scratch columns, tree attention);
4. the walk from the root, depth by depth: a node's children are tried in rank order with the
   method's rule against the residual target and q^(k), the node's row without the earlier
   children (runtime.verification.siblings.verify_candidates' rule, SJD-PAC App. A.3 for SD); an accepted
   child becomes the node; all rejected draws the next token from the residual; a node without
   children (or at the image's end) gives the bonus token from its row;
5. the target's keys/values of the accepted path are copied from scratch to their tokens' columns,
   and a draft model's (a head keeps the target's features along the path instead).
Shapes never depend on an outcome: every depth loops over the widest node's children.

Greedy decoding (temperature 0): every row is one-hot, so draws without replacement would give
each node one child. As the host loop's StaticGrowth does (EAGLE at temperature 0), a node's
children are then the top-k of its draft row before the argmax (runtime/rounds/drafts.py
`tree_rows`), best first, those with mass; each is verified as a point mass, which accepts it
exactly when it is the target's argmax.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from specrt.runtime.rounds.chains import DraftedRound
from specrt.runtime.rounds.state import CANDIDATE, NEXT, RoundState
from specrt.runtime.rounds.walk import TreeWalk, draw_next_token, marked, point_mass, walk_tree, without_earlier
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.rules import AcceptanceRule


class TreeTables:
    """A static shape's constant tables on `device` (node 0 is the root, the pending token)."""

    def __init__(self, children: Sequence[Sequence[int]], device: Any):
        count = len(children)
        parents, depths = [-1] * count, [0] * count
        for node, kids in enumerate(children):
            for child in kids:
                parents[child], depths[child] = node, depths[node] + 1
        self.count, self.depth = count, max(depths)
        self.widest = max(len(kids) for kids in children)
        self.inner = [n for n in range(count) if children[n]]  # nodes with children, by index
        self.inner_at = [[n for n in self.inner if depths[n] == d] for d in range(self.depth)]
        self.children_at = [max((len(children[n]) for n in level), default=0) for level in self.inner_at]
        table = [list(kids) + [-1] * (self.widest - len(kids)) for kids in children]
        ancestry = [[False] * count for _ in range(count)]
        for node in range(count):
            at = node
            while at >= 0:
                ancestry[node][at] = True
                at = parents[at]
        row_of = {node: k for k, node in enumerate(self.inner)}
        self.children = torch.tensor(table, dtype=torch.int64, device=device)  # [N + 1, widest], −1: none
        self.parents = torch.tensor([max(p, 0) for p in parents], dtype=torch.int64, device=device)
        self.depths = torch.tensor(depths, dtype=torch.int64, device=device)
        self.ancestry = torch.tensor(ancestry, dtype=torch.bool, device=device)  # [N + 1, N + 1]
        # the draft's: its root sits in its token columns (the catch-up), not in scratch offset 0
        self.draft_ancestry = self.ancestry.clone()
        self.draft_ancestry[:, 0] = False
        self.row_of = torch.tensor([row_of.get(n, 0) for n in range(count)], dtype=torch.int64, device=device)
        self.level_children = [torch.tensor([table[n] for n in level], dtype=torch.int64, device=device)
                               for level in self.inner_at]  # per depth: [nodes there with children, widest]
        self.level_nodes = [torch.tensor(level, dtype=torch.int64, device=device) for level in self.inner_at]


class StaticTreeRound(DraftedRound):
    """One static-tree draft-then-verify round (see the module docstring)."""

    def __init__(self, target: Any, draft: Any, rule: AcceptanceRule, children: Sequence[Sequence[int]]):
        self.target, self.draft, self.rule = target, draft, rule
        self.tables = TreeTables(children, target.device)
        self.window = self.tables.count
        self.greedy = draft.greedy
        self.passes = {"target": 1, "draft": self.tables.depth}

    def __call__(self, state: RoundState) -> None:
        n, tables = state.length, self.tables
        tokens, valid, q_rows = self._draft(state, n)
        p_rows = self.target.tree_window(tokens, tables.depths[None], tables.ancestry[None], n - 1)
        limit = (state.total - n - 1).clamp(min=0)
        walk = self._walk(state, n, tokens, valid, q_rows, p_rows, limit)
        accepted, path = walk.accepted, walk.path
        next_token = draw_next_token(walk, state.uniforms(n, NEXT))
        self.target.commit_path(path, n - 1)
        self.draft.verified(n, path, path[:, 1:])
        image = torch.arange(n.shape[0], device=n.device)[:, None]
        state.commit(accepted, tokens[image, path[:, 1:]], next_token)

    def _draft(self, state: RoundState, n: Any) -> tuple[Any, Any, Any]:
        """Every node's token [I, N + 1] (the root: the pending token), whether it was drawn [I, N + 1],
        and the rows of the nodes with children [I, inner, V] (what their children were drawn from)."""
        tables, images = self.tables, n.shape[0]
        rows = self.draft.tree_rows(self.draft.catch_up(state))[:, None]  # the root's row [I, 1, V]
        tokens = torch.zeros((images, tables.count), dtype=torch.int64, device=n.device)
        tokens[:, 0] = state.pending()
        valid = torch.zeros((images, tables.count), dtype=torch.bool, device=n.device)
        valid[:, 0] = True
        q_rows = []
        for depth in range(tables.depth):
            q_rows.append(rows)
            kids = tables.level_children[depth]  # [M, widest]
            if self.greedy:
                self._top_children(rows, kids, tokens, valid)
            else:
                self._draw_children(state, n, rows, kids, tokens, valid, depth + 1)
            if depth + 1 < tables.depth and len(tables.inner_at[depth + 1]):
                nodes = tables.level_nodes[depth + 1]
                rows = self.draft.tree_rows(self.draft.expand(tokens[:, nodes], tables.depths[nodes][None] - 1,
                                                              tables.draft_ancestry[nodes][None], n, nodes,
                                                              tables.parents[nodes]))
            elif depth + 1 < tables.depth:
                break
        return tokens, valid, torch.cat(q_rows, dim=1)

    def _draw_children(self, state: RoundState, n: Any, rows: Any, kids: Any, tokens: Any, valid: Any,
                       depth: int) -> None:
        """The children kids [M, widest] of a depth's nodes drawn without replacement from their rows
        rows [I, M, V], rank by rank (a row whose mass runs out stops), into tokens and valid."""
        image = torch.arange(rows.shape[0], device=n.device)[:, None]
        parents = self.tables.parents[kids[:, 0]]  # the depth's nodes
        going = valid[:, parents]  # [I, M]: a node that was itself drawn
        rows = rows.to(torch.float64)
        removed = torch.zeros_like(rows, dtype=torch.bool)
        index = (n - 1 + depth)[:, None].expand(-1, kids.shape[0])
        for rank in range(kids.shape[1]):
            child = kids[:, rank]
            rest = torch.where(removed, 0.0, rows)
            going = going & (child >= 0)[None] & (rest.sum(dim=-1) > 1e-12)
            token = inverse_cdf(rest, state.uniforms(index, CANDIDATE, part=child.clamp(min=0)[None]))
            at = child.clamp(min=0)[None].expand_as(going)
            tokens[image, at] = torch.where(going, token, tokens[image, at])
            valid[image, at] = going | valid[image, at]
            removed = removed | marked(removed, token, going)

    def _top_children(self, rows: Any, kids: Any, tokens: Any, valid: Any) -> None:
        """Greedy decoding: the children kids [M, widest] of a depth's nodes are the top tokens of
        their rows rows [I, M, V] (before the argmax), best first, as many as have mass."""
        image = torch.arange(rows.shape[0], device=rows.device)[:, None]
        going = valid[:, self.tables.parents[kids[:, 0]]]  # [I, M]: a node that was itself drafted
        mass, best = rows.to(torch.float64).topk(min(kids.shape[1], rows.shape[-1]), dim=-1)  # [I, M, k]
        for rank in range(mass.shape[-1]):
            child = kids[:, rank]
            going = going & (child >= 0)[None] & (mass[:, :, rank] > 0)
            at = child.clamp(min=0)[None].expand_as(going)
            tokens[image, at] = torch.where(going, best[:, :, rank], tokens[image, at])
            valid[image, at] = going | valid[image, at]

    def _walk(self, state: RoundState, n: Any, tokens: Any, valid: Any, q_rows: Any, p_rows: Any,
              limit: Any) -> TreeWalk:
        """Verify from the root (walk_tree), each child's q its node's row without the earlier children
        (greedy decoding: its point mass, the children being the rows' top-k)."""
        tables = self.tables
        image = torch.arange(n.shape[0], device=n.device)

        def node_row_without_earlier(depth: int, node: Any, token: Any, removed: Any) -> Any:
            return without_earlier(q_rows[image, tables.row_of[node]].to(torch.float64), removed)

        children = tables.children[None].expand(n.shape[0], -1, -1)
        return walk_tree(state, self.rule, tokens, children, valid, p_rows, limit, tables.children_at,
                         point_mass if self.greedy else node_row_without_earlier)
