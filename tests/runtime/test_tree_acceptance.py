"""runtime.tree_acceptance: sibling acceptance counted by depth and rank, and each depth's estimate."""
from __future__ import annotations

import pytest

from specrt.errors import SpecrtError
from specrt.runtime.tree import TokenTree
from specrt.runtime.tree_acceptance import RankCounts


def test_rank_counts_from_hand_made_outcomes():
    tree = TokenTree.from_parents([9, 1, 2, 3, 4, 5], [-1, 0, 0, 0, 1, 1], drawn="sampled")  # root: 3 kids; node 1: 2
    counts = RankCounts()
    counts.add(tree.children, [0, 2])     # root's rank 1 accepted (node 2 is a leaf: no test there)
    counts.add(tree.children, [0, 1, 5])  # rank 0, then node 1's rank 1
    counts.add(tree.children, [0])        # every child of the root rejected
    counts.add(tree.children, [0, 1])     # rank 0, then both of node 1's children rejected
    assert counts.tried_by_depth == [[4, 4, 4], [2, 2]]  # depth 1: the root's children; depth 2: node 1's
    assert counts.accepted_by_depth == [[2, 1, 0], [0, 1]]
    assert counts.tried == [6, 6, 4]  # the root 4 times (ranks 0-2), node 1 twice (ranks 0-1)
    assert counts.accepted == [2, 2, 0]  # rank 0: the root twice; rank 1: the root once, node 1 once
    assert counts.acceptance() == [2 / 6, 2 / 6, 0.0]
    counts.accepted_by_depth[0][1] = 2  # a later rank more often accepted than an earlier: lowered to it
    assert counts.acceptance() == [2 / 6, 2 / 6, 0.0]


def test_each_depth_is_shrunk_toward_the_pooled_rate_by_its_visits():
    counts = RankCounts(tried_by_depth=[[100, 100, 100], [10, 10], []], accepted_by_depth=[[80, 10, 5], [2, 4], []])
    p0, p1, p2 = 82 / 110, 14 / 110, 5 / 100  # pooled raw rates (rank 2: tried at depth 1 only)
    assert counts.acceptance() == [p0, p1, p2]
    rows = counts.acceptance_by_depth(prior_visits=20)
    assert len(rows) == 2  # depth 3 was never visited: no row (depth 2's serves it, rates_at)
    assert rows[0] == pytest.approx([(80 + 20 * p0) / 120, (10 + 20 * p1) / 120, (5 + 20 * p2) / 120])
    # depth 2: 10 visits weigh half of the prior's 20; rank 2 was never offered there: the pooled rate
    assert rows[1] == pytest.approx([(2 + 20 * p0) / 30, (4 + 20 * p1) / 30, p2])
    # no prior: each depth alone (depth 2's rank 1, 4 of 10, above its rank 0, 2 of 10: lowered to it);
    # a huge prior: every depth the pooled rate
    assert counts.acceptance_by_depth(prior_visits=0)[1] == pytest.approx([0.2, 0.2, p2])
    assert counts.acceptance_by_depth(prior_visits=1e9)[1] == pytest.approx([p0, p1, p2], rel=1e-6)
    with pytest.raises(SpecrtError, match="prior_visits"):
        counts.acceptance_by_depth(prior_visits=-1)
