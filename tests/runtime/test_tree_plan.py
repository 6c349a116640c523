"""runtime.tree_plan: the rank-acceptance estimate, the best tree for a node budget, the choice of
its size from latencies, and plan files as `static_tree` values (read, refused in one line).

Exactness of static trees is tested elsewhere (test_losslessness, test_planted_bugs); here a plan
file only has to give the same shape, hence the same tokens, as the same paths given by name.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.errors import SpecrtError
from specrt.runtime.methods import make_method
from specrt.runtime.tree import STATIC_TREES, StaticShape, TokenTree, static_shape
from specrt.runtime.tree_plan import (
    Latency, RankCounts, TreePlan, best_chain, best_paths, best_tree, chain_choice, expected_tokens, fan_paths,
    level_widths, make_plan, monotone, read_plan, write_plan,
)

A = [0.6, 0.2, 0.1]


def test_best_paths_match_a_hand_computation():
    # scores: [0] .6, [0,0] .36, [0,0,0] .216, [1] .2, [0,1] .12, [1,0] .12, [0,0,0,0] .1296 ...
    ranked = best_paths(A, 6)
    assert [p for _, p in ranked] == [(0,), (0, 0), (0, 0, 0), (1,), (0, 0, 0, 0), (0, 1)]
    assert [round(s, 6) for s, _ in ranked] == [0.6, 0.36, 0.216, 0.2, 0.1296, 0.12]
    assert math.isclose(expected_tokens(s for s, _ in ranked), 1 + 0.6 + 0.36 + 0.216 + 0.2 + 0.1296 + 0.12)
    # a depth limit of 2: the best paths of at most two ranks
    assert [p for _, p in best_paths(A, 4, max_depth=2)] == [(0,), (0, 0), (1,), (0, 1)]
    assert level_widths([(0,), (0, 0), (1,), (0, 1), (1, 0)]) == [1, 2]


def test_every_prefix_of_the_best_paths_is_a_valid_static_shape():
    ranked = [list(p) for _, p in best_paths([0.5, 0.3, 0.3, 0.1], 40)]  # a tie between ranks 1 and 2
    for count in range(1, len(ranked) + 1):
        StaticShape(ranked[:count])  # raises on a missing parent or lower-ranked sibling


def test_flat_latency_gives_a_large_bushy_tree_and_steep_latency_a_small_chain_like_one():
    flat = Latency([1e-3] * 70, [1e-4] * 70)
    steep = Latency([1e-3 * (1 + 0.5 * w) for w in range(70)], [1e-4] * 70)
    big = best_tree(A, flat, 64)
    small = best_tree(A, steep, 64)
    assert len(big.paths) == 64 and max(len(level) for level in [level_widths(big.paths)]) > 1
    assert sum(p[-1] > 0 for p in big.paths) > 10  # siblings beyond rank 0: bushy
    assert len(small.paths) <= 3 and all(r == 0 for p in small.paths for r in p)
    assert big.tokens_per_round > small.tokens_per_round
    StaticShape([list(p) for p in big.paths])  # valid shapes: raises on a missing parent or lower rank
    StaticShape([list(p) for p in small.paths])


def test_the_chain_is_priced_as_one_draft_chain_call_where_measured():
    latency = Latency([1e-3] * 10, [1e-4] * 10, chain={4: 2e-4})
    four = chain_choice(A, latency, 4)
    assert math.isclose(four.seconds_per_round, 1e-3 + 2e-4)
    assert math.isclose(four.tokens_per_round, 1 + 0.6 + 0.36 + 0.216 + 0.1296)
    three = chain_choice(A, latency, 3)  # no chain graph of 3: a pass per draft (the first feeds 2 tokens)
    assert math.isclose(three.seconds_per_round, 1e-3 + 1e-4 + 2 * 1e-4)
    # tokens per ms: 1 draft 1.45, 2: 1.63, 3: 1.67, 4 (one chain call): 1.92, 5: 1.59, ...: the chain graph's 4 wins
    assert best_chain(A, latency, 8).paths == four.paths


def test_rank_counts_from_hand_made_outcomes():
    tree = TokenTree.from_parents([9, 1, 2, 3, 4, 5], [-1, 0, 0, 0, 1, 1], drawn="sampled")  # root: 3 kids; node 1: 2
    counts = RankCounts()
    counts.add(tree.children, [0, 2])     # root's rank 1 accepted (node 2 is a leaf: no test there)
    counts.add(tree.children, [0, 1, 5])  # rank 0, then node 1's rank 1
    counts.add(tree.children, [0])        # every child of the root rejected
    counts.add(tree.children, [0, 1])     # rank 0, then both of node 1's children rejected
    assert counts.tried == [6, 6, 4]  # the root 4 times (ranks 0-2), node 1 twice (ranks 0-1)
    assert counts.accepted == [2, 2, 0]  # rank 0: the root twice; rank 1: the root once, node 1 once
    assert counts.acceptance() == [2 / 6, 2 / 6, 0.0]
    counts.accepted[1] = 3  # a later rank more often accepted than an earlier: lowered to it
    assert counts.acceptance() == [2 / 6, 2 / 6, 0.0]
    assert monotone([3.0, 1.0, 2.0, 4.0]) == [1.0, 1.0, 2.0, 4.0]


def test_make_plan_predicts_against_the_chain_and_ar(tmp_path):
    latency = Latency([1e-3] * 70, [1e-4] * 70, chain={4: 3e-4}, host_chain=1e-5)
    plan = make_plan(A, latency, 24, counts=RankCounts([10, 10, 10], [6, 2, 1]), measured_on={"device": "test"})
    assert plan.predicted["faster"] == "tree" and plan.predicted["speedup_vs_chain"] > 1
    assert plan.predicted["tree"]["nodes"] == len(plan.tree) == 24
    path = write_plan(tmp_path / "plan.json", plan)
    data = json.loads(path.read_text())
    assert data["tree"] == plan.tree and data["acceptance"] == A and data["latency"]["chain_s"] == {"4": 3e-4}
    again = read_plan(path)
    assert again.tree == plan.tree and again.latency == latency and again.measured_on == {"device": "test"}
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left


def plan_file(tmp_path, paths, name="plan.json"):
    return str(write_plan(tmp_path / name, TreePlan(paths, list(A))))


def test_static_tree_takes_a_plan_file_and_generates_what_the_same_shape_by_name_does(tmp_path, monkeypatch):
    from specrt.runtime.backends.toy import toy_models
    from specrt.runtime.pipeline import Pipeline

    paths = STATIC_TREES["reverse_balanced_25"]
    plan = plan_file(tmp_path, paths)
    assert static_shape(plan).children == static_shape("reverse_balanced_25").children
    assert make_method("sd", tree="static", static_tree=plan).max_window == 26
    target, draft, vq = toy_models(vocab_size=6, grid_size=3, max_window=26)
    pipe = Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 2.0})
    by_name = pipe.generate([0, 1], method="sd", seed=3, tree="static", static_tree="reverse_balanced_25").tokens
    by_file = pipe.generate([0, 1], method="sd", seed=3, tree="static", static_tree=plan).tokens
    np.testing.assert_array_equal(by_name, by_file)


@pytest.mark.parametrize("content,message", [
    (None, "cannot read tree plan"),
    ("{not json", "is not JSON"),
    ('{"tree": [[0]]}', "is not a tree plan"),
    ('{"format": "specrt-tree-plan", "version": 9, "tree": [[0]]}', "version 9"),
    ('{"format": "specrt-tree-plan", "version": 1, "tree": [[0], ["x"]]}', "rank paths"),
    ('{"format": "specrt-tree-plan", "version": 1, "tree": [[0], [2]]}', "lower-ranked siblings"),
    ('{"format": "specrt-tree-plan", "version": 1, "tree": [[0]], "latency": {"target_s": []}}', "latency"),
])
def test_bad_plan_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    for make in (lambda: static_shape(str(path)), lambda: make_method("sd", tree="static", static_tree=str(path))):
        with pytest.raises(SpecrtError, match=message) as err:
            make()
        assert "\n" not in str(err.value) and "bad.json" in str(err.value)
    with pytest.raises(SpecrtError, match="must be one of .* or a tree plan file"):
        make_method("sd", static_tree="oak")


def test_the_probe_fan_offers_every_rank_at_every_level():
    shape = StaticShape(fan_paths(3, 2))
    assert shape.size == 6 and shape.depth == 2 and [len(c) for c in shape.children if c] == [3, 3]
