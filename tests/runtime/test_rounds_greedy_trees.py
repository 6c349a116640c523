"""Greedy trees in the device round are the host loop's trees (runtime/rounds/trees.py, dynamic.py).

Under greedy decoding every restricted row is one-hot, so a tree drawn from the rows would be a chain.
The host loop takes a node's children as the top-k of the draft's rows before the argmax (runtime/tree.py
StaticGrowth, EAGLE-2's DynamicGrowth over StepOutput.ranking); greedy draws nothing at random, so the
round must draft, round by round, the very trees the host loop drafts (the nodes within the image's
reach: the host leaves out those past its end) and accept as many tokens, with a draft model and with
an EAGLE head.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_rounds import pipeline  # noqa: E402
from test_rounds_heads import GREEDY, head_pipeline  # noqa: E402
from specrt.runtime.methods.tree_loop import observing_trees  # noqa: E402
from specrt.runtime.rounds.dynamic import DynamicTreeRound  # noqa: E402
from specrt.runtime.rounds.trees import StaticTreeRound  # noqa: E402

STATIC = {"tree": "static", "static_tree": "reverse_balanced_25"}
DYNAMIC = {"tree": "dynamic", "total_tokens": 10, "depth": 3, "tree_top_k": 3}
DRAFTS = {"model": lambda: pipeline(GREEDY, vocab=16, grid=4, classes=10),
          "head": lambda: head_pipeline(GREEDY, vocab=16, grid=4, classes=10)}
Tree = tuple[int, list[tuple[int, ...]]]  # the root's token and every other node's tokens from below the root


def tree_of(tokens: list[int], parents: list[int], kept: list[bool]) -> Tree:
    """A tree as its root's token and the sorted token paths of its kept nodes (node 0: the root)."""
    paths = []
    for node in range(1, len(tokens)):
        if kept[node]:
            path, at = [], node
            while at != 0:
                path.append(tokens[at])
                at = parents[at]
            paths.append(tuple(reversed(path)))
    return tokens[0], sorted(paths)


def static_trees(self, state, n, tokens, valid, q_rows, p_rows, limit) -> list[Tree]:
    tables = self.tables
    reach = valid & (tables.depths[None] <= limit[:, None])
    return [tree_of(tokens[i].tolist(), tables.parents.tolist(), reach[i].tolist()) for i in range(n.shape[0])]


def dynamic_trees(self, state, n, tokens, node_parent, node_depth, p_rows, limit) -> list[Tree]:
    reach = (node_parent >= 0) & (node_depth <= limit[:, None])
    return [tree_of(tokens[i].tolist(), node_parent[i].tolist(), reach[i].tolist()) for i in range(n.shape[0])]


def round_trees(monkeypatch, round_class, trees_of) -> list[list[Tree]]:
    """Each round's trees of the images still decoding, recorded as round_class verifies them."""
    seen, walk = [], round_class._walk

    def recording(self, state, *args):
        live = (~state.finished).tolist()
        seen.append([tree for tree, going in zip(trees_of(self, state, *args), live) if going])
        return walk(self, state, *args)

    monkeypatch.setattr(round_class, "_walk", recording)
    return seen


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("params", [STATIC, DYNAMIC], ids=["static", "dynamic"])
def test_a_greedy_round_drafts_the_host_loops_trees_and_accepts_as_many(monkeypatch, draft, params):
    pipe = DRAFTS[draft]()
    recorded = round_trees(monkeypatch, *((StaticTreeRound, static_trees) if params is STATIC
                                          else (DynamicTreeRound, dynamic_trees)))
    rounds = pipe.generate([3, 6, 1], method="sd", seed=4, decode=False, **params)
    host: list[list[Tree]] = []

    def observe(trees, outcomes):
        host.append([tree_of(t.tokens, t.parents, [True] * len(t.tokens)) for t in trees if t is not None])

    pipe.loop = "host"
    with observing_trees(observe):
        by_host = pipe.generate([3, 6, 1], method="sd", seed=4, decode=False, **params)
    np.testing.assert_array_equal(rounds.tokens, by_host.tokens)
    assert len(recorded) == len(host) > 0
    for r, (mine, theirs) in enumerate(zip(recorded, host)):
        assert mine == theirs, f"round {r}"
    assert rounds.stats.accepted_lengths == by_host.stats.accepted_lengths
    depth = 5 if params is STATIC else params["depth"]
    assert max(len(paths) for trees in host for _, paths in trees) > depth  # trees, not chains
    assert max(rounds.stats.accepted_lengths) > 1
