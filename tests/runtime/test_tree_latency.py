"""runtime.tree_latency: measured latencies and the price of a round (a dynamic tree's passes, its parameters)."""
from __future__ import annotations

import math

import pytest

from specrt.errors import SpecrtError
from specrt.runtime.tree_latency import DynamicTree, Latency, dynamic_widths, monotone


def test_a_latency_measured_slower_than_a_larger_window_is_lowered_to_it():
    assert monotone([3.0, 1.0, 2.0, 4.0]) == [1.0, 1.0, 2.0, 4.0]


def test_a_dynamic_round_is_priced_as_dynamic_growths_passes():
    # depth 3, top-k 2: passes over the root, then 2 frontier nodes, then 2 (DynamicGrowth); target over 5 + 1
    assert dynamic_widths(3, 2) == [1, 2, 2] and dynamic_widths(1, 8) == [1]
    target = [1e-3 * w for w in range(1, 11)]  # t(W) = W ms
    draft = [1e-4 * w for w in range(1, 11)]   # a pass over w tokens: w/10 ms
    model = Latency(target, draft, host_round=1e-4, host_node=1e-5, host_level=1e-6)
    tree = DynamicTree(5, 3, 2)
    # a model draft's first pass also feeds its uncached token: widths 2, 2, 2 -> 0.6 ms; target t(6) = 6 ms
    expected = 6e-3 + 3 * 2e-4 + (1e-4 + 5 * 1e-5 + 3 * 1e-6)
    assert math.isclose(model.dynamic_round_s(tree, 2.0), expected)
    # an EAGLE head: passes of 1, 2, 2 (0.5 ms) and its call on ~3 committed pairs (0.3 ms)
    head = Latency(target, draft, drafter="eagle")
    assert math.isclose(head.dynamic_round_s(tree, 3.2), 6e-3 + 5e-4 + 3e-4)
    # the default dynamic tree (63, 6, 8) pays 6 passes, 5 of them over 8 nodes, and a 64-token target step
    assert math.isclose(Latency([1e-3] * 64, [1e-4] * 10).dynamic_round_s(DynamicTree(63, 6, 8), 2.0),
                        1e-3 + 6 * 1e-4)


def test_the_dynamic_parameters_cover_the_solved_paths():
    assert DynamicTree.covering([[0], [1], [2], [0, 0], [0, 1]]) == DynamicTree(5, 2, 3)
    assert DynamicTree.covering([[0]]) == DynamicTree(1, 1, 1)
    assert DynamicTree.covering([[0], [0, 0], [0, 0, 0]]).params() == {"total_tokens": 3, "depth": 3, "tree_top_k": 1}
    # ranks 0-1 only, but three depth-2 nodes have children: a pass must expand 3 frontier nodes
    wide = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1], [0, 0, 0], [0, 1, 0], [1, 0, 0]]
    assert DynamicTree.covering(wide) == DynamicTree(9, 3, 3)
    assert DynamicTree(63, 6, 8).flags() == "--param tree=dynamic --param total_tokens=63 --param depth=6 --param tree_top_k=8"
    with pytest.raises(SpecrtError, match="tree_top_k must be a positive integer"):
        DynamicTree(3, 1, 0)
