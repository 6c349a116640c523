"""runtime.tree_plan: the acceptance estimate per depth and rank, the best tree for a node budget, the choice of
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
    PLAN_VERSION, DynamicTree, Latency, RankCounts, TreePlan, best_chain, best_paths, best_tree, chain_choice, chain_rate,
    dynamic_widths, expected_tokens, fan_paths, level_widths, make_plan, monotone, rates_at, read_plan, write_plan,
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


def test_per_depth_scores_match_a_hand_computation():
    table = [[0.8, 0.1], [0.5, 0.2]]  # a_r(1), then a_r(d) for every d ≥ 2 (the deepest row serves deeper)
    assert rates_at(table, 1) == [0.8, 0.1] and rates_at(table, 2) == rates_at(table, 7) == [0.5, 0.2]
    # scores: [0] .8, [0,0] .8·.5 = .4, [0,0,0] .4·.5 = .2, [0,1] .8·.2 = .16, [1] .1, [0,0,0,0] .1 (tie:
    # the shorter first), then [0,0,1] .4·.2 = .08, [0,1,0] .16·.5 = .08, [1,0] .1·.5 = .05
    ranked = best_paths(table, 9)
    assert [p for _, p in ranked] == [(0,), (0, 0), (0, 0, 0), (0, 1), (1,), (0, 0, 0, 0), (0, 0, 1), (0, 1, 0),
                                      (1, 0)]
    assert [round(s, 6) for s, _ in ranked] == [0.8, 0.4, 0.2, 0.16, 0.1, 0.1, 0.08, 0.08, 0.05]
    # the pooled model (depth 1's vector everywhere) would score [0,0] at .64 and put it before [1] and [0,1]
    assert [p for _, p in best_paths(table[0], 4)] == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]
    latency = Latency([1e-3] * 10, [1e-4] * 10)
    assert math.isclose(chain_choice(table, latency, 3).tokens_per_round, 1 + 0.8 + 0.4 + 0.2)  # Σ_d Π_{i≤d} a_0(i)
    assert math.isclose(chain_choice(table[0], latency, 3).tokens_per_round, 1 + 0.8 + 0.64 + 0.512)


@pytest.mark.parametrize("acceptance", [
    [0.5, 0.3, 0.3, 0.1],  # a tie between ranks 1 and 2
    [[0.5, 0.3, 0.3, 0.1], [0.9, 0.05], [0.2, 0.2, 0.2]],  # acceptance rising, then falling, with depth
])
def test_every_prefix_of_the_best_paths_is_a_valid_static_shape(acceptance):
    ranked = best_paths(acceptance, 40)
    assert [s for s, _ in ranked] == sorted((s for s, _ in ranked), reverse=True)
    paths = [list(p) for _, p in ranked]
    for count in range(1, len(paths) + 1):
        StaticShape(paths[:count])  # raises on a missing parent or lower-ranked sibling


def test_acceptance_falling_with_depth_picks_a_shallower_wider_tree_than_the_pooled_model():
    latency = Latency([1e-3 * (1 + 0.02 * w) for w in range(70)], [1e-4] * 70)
    first = [0.5, 0.2, 0.12, 0.08, 0.05]
    pooled = best_tree(first, latency, 64)
    falling = best_tree([first, [0.1, 0.03, 0.01]], latency, 64)
    assert pooled.depth >= 2 and any(len(p) == 2 for p in pooled.paths)
    # past depth 1 a node scores at most .5 · .1 = .05, no more than the last sibling at depth 1: every rank
    # under the root comes first, and one more level is not worth its draft pass
    assert falling.paths == [(0,), (1,), (2,), (3,), (4,)]
    assert math.isclose(falling.tokens_per_round, 1 + sum(first))
    # the pooled model's tree, priced under the falling acceptance, predicts less than the pooled model said
    repriced = expected_tokens(s for s, p in best_paths([first, [0.1, 0.03, 0.01]], 64) if p in pooled.paths)
    assert repriced < pooled.tokens_per_round - 0.3


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
    assert counts.tried_by_depth == [[4, 4, 4], [2, 2]]  # depth 1: the root's children; depth 2: node 1's
    assert counts.accepted_by_depth == [[2, 1, 0], [0, 1]]
    assert counts.tried == [6, 6, 4]  # the root 4 times (ranks 0-2), node 1 twice (ranks 0-1)
    assert counts.accepted == [2, 2, 0]  # rank 0: the root twice; rank 1: the root once, node 1 once
    assert counts.acceptance() == [2 / 6, 2 / 6, 0.0]
    counts.accepted_by_depth[0][1] = 2  # a later rank more often accepted than an earlier: lowered to it
    assert counts.acceptance() == [2 / 6, 2 / 6, 0.0]
    assert monotone([3.0, 1.0, 2.0, 4.0]) == [1.0, 1.0, 2.0, 4.0]


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


def test_make_plan_predicts_against_the_chain_and_ar(tmp_path):
    latency = Latency([1e-3] * 70, [1e-4] * 70, chain={4: 3e-4}, host_chain=1e-5)
    plan = make_plan(A, latency, 24, counts=RankCounts([[10, 10, 10]], [[6, 2, 1]]), measured_on={"device": "test"})
    assert plan.predicted["faster"] == "tree" and plan.predicted["speedup_vs_chain"] > 1
    assert plan.predicted["tree"]["nodes"] == len(plan.tree) == 24
    path = write_plan(tmp_path / "plan.json", plan)
    data = json.loads(path.read_text())
    assert data["tree"] == plan.tree and data["acceptance"] == A and data["latency"]["chain_s"] == {"4": 3e-4}
    assert data["version"] == PLAN_VERSION == 3 and data["tree_kind"] == "static" and data["acceptance_by_depth"] == [A]
    assert data["acceptance_counts"]["tried_by_depth"] == [[10, 10, 10]]
    again = read_plan(path)
    assert again.tree == plan.tree and again.latency == latency and again.measured_on == {"device": "test"}
    assert again.acceptance_by_depth == [A]
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left


def test_make_plan_solves_with_the_per_depth_acceptance(tmp_path):
    latency = Latency([1e-3] * 70, [1e-4] * 70, chain={4: 3e-4})
    table = [[0.8, 0.1], [0.5, 0.2]]
    plan = make_plan(table, latency, 6, default_draft_len=4)
    scores = {tuple(p): s for s, p in best_paths(table, 64)}
    assert plan.predicted["tree"]["tokens_per_round"] == round(1 + sum(scores[tuple(p)] for p in plan.tree), 4)
    assert plan.predicted["chain_draft_len_4"]["tokens_per_round"] == round(1 + 0.8 + 0.4 + 0.2 + 0.1, 4)
    assert plan.acceptance == [] and plan.acceptance_by_depth == table  # no counts: no pooled vector to give
    assert read_plan(write_plan(tmp_path / "p.json", plan)).acceptance_by_depth == table


def test_a_version_1_plan_is_read_with_its_pooled_acceptance_at_every_depth(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "specrt-tree-plan", "version": 1, "tree": [[0], [1], [0, 0]],
                                "acceptance": [0.7, 0.1]}))
    plan = read_plan(path)
    assert plan.tree == [[0], [1], [0, 0]] and plan.acceptance == [0.7, 0.1]
    assert plan.acceptance_by_depth == [[0.7, 0.1]]  # one row: every depth
    assert static_shape(str(path)).size == 3


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
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [0.7, 0.1]}',
     "one list of probabilities per depth"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7], 0.5]}',
     "one list of probabilities per depth"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7], [1.5]]}',
     "a_0 at depth 2 must be a probability"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7, "x"]]}',
     "a_1 at depth 1 must be a probability"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7, 0.1], [0.2, 0.3]]}',
     "must not increase with the sibling rank: a_1 at depth 2"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "oak", "tree": [[0]]}', "tree_kind"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "dynamic", "tree": [[0]]}', "a dynamic plan needs"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "dynamic", "tree": [[0]], '
     '"dynamic": {"total_tokens": 0, "depth": 1, "tree_top_k": 1}}', "total_tokens must be a positive integer"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "dynamic", "tree": [[0]], '
     '"dynamic": {"total_tokens": 1, "depth": 1, "tree_top_k": 1}}', "is for a dynamic tree.*tree_top_k=1"),
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


# ---- dynamic trees (EAGLE-2) ----------------------------------------------------------------------


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


def test_make_plan_for_a_dynamic_tree_prices_and_records_its_parameters(tmp_path):
    # steep draft passes: a dynamic tree pays top_k-wide passes at every depth past the first
    latency = Latency([1e-3] * 70, [1e-4 * w for w in range(1, 71)], chain={4: 3e-4})
    static = make_plan(A, latency, 24)
    plan = make_plan(A, latency, 24, kind="dynamic")
    dynamic = DynamicTree.covering(plan.tree)
    assert plan.dynamic == dynamic and plan.tree_kind == "dynamic"
    tree = plan.predicted["tree"]
    assert tree["kind"] == "dynamic" and (tree["total_tokens"], tree["depth"], tree["tree_top_k"]) == (
        dynamic.total_tokens, dynamic.depth, dynamic.tree_top_k) and tree["nodes"] == len(plan.tree)
    scores = {tuple(p): s for s, p in best_paths(A, 64)}
    tokens = 1 + sum(scores[tuple(p)] for p in plan.tree)
    assert tree["tokens_per_round"] == round(tokens, 4)
    assert math.isclose(tree["seconds_per_round"], latency.dynamic_round_s(dynamic, tokens))
    # the same acceptance and latencies, priced as a static shape, never predict less (passes as wide as needed)
    assert static.predicted["tree"]["speedup_vs_ar"] >= tree["speedup_vs_ar"]
    with pytest.raises(SpecrtError, match="tree kind must be one of static, dynamic"):
        best_tree(A, latency, 8, kind="oak")
    path = write_plan(tmp_path / "dynamic.json", plan)
    data = json.loads(path.read_text())
    assert data["version"] == 3 and data["tree_kind"] == "dynamic" and data["dynamic"] == dynamic.params()
    assert read_plan(path, kind=None).dynamic == read_plan(path, kind="dynamic").dynamic == dynamic


def test_a_dynamic_plan_is_refused_as_a_static_tree_in_one_line(tmp_path):
    latency = Latency([1e-3] * 70, [1e-4] * 70)
    path = str(write_plan(tmp_path / "dynamic.json", make_plan(A, latency, 12, kind="dynamic")))
    flags = read_plan(path, kind=None).dynamic.flags()
    for make in (lambda: static_shape(path), lambda: make_method("sd", tree="static", static_tree=path),
                 lambda: read_plan(path)):
        with pytest.raises(SpecrtError, match="is for a dynamic tree, not a static_tree shape") as err:
            make()
        assert "\n" not in str(err.value) and flags in str(err.value)
    static = plan_file(tmp_path, [[0], [1]], "static.json")
    with pytest.raises(SpecrtError, match="is for a static tree: use --param tree=static"):
        read_plan(static, kind="dynamic")
    # a version 2 file (no tree_kind) is a static plan
    old = tmp_path / "v2.json"
    old.write_text(json.dumps({"format": "specrt-tree-plan", "version": 2, "tree": [[0], [1]], "acceptance": [0.7, 0.1]}))
    assert read_plan(old).dynamic is None and static_shape(str(old)).size == 2


def test_a_dynamic_plans_chains_are_priced_at_the_rate_solved_from_measured_chain_rounds():
    assert math.isclose(chain_rate(1 + 0.5 + 0.25, 2), 0.5, abs_tol=1e-9)
    assert chain_rate(0.5, 4) == pytest.approx(0.0) and chain_rate(9.0, 4) == pytest.approx(1.0)
    latency = Latency([1e-3] * 70, [1e-4] * 70, chain={4: 3e-4})
    plan = make_plan([0.3, 0.1], latency, 8, kind="dynamic", chain_acceptance=[0.6])
    assert plan.predicted["chain_draft_len_4"]["tokens_per_round"] == round(1 + 0.6 + 0.36 + 0.216 + 0.1296, 4)
    assert plan.acceptance_by_depth == [[0.3, 0.1]]  # the tree's own rates are the probe's
    with pytest.raises(SpecrtError, match="chain_rate needs drafts"):
        chain_rate(2.0, 0)


def test_a_plan_file_is_parsed_once_per_version_and_a_rewritten_plan_is_seen(tmp_path, monkeypatch):
    import specrt.runtime.tree_plan as tree_plan

    plan = plan_file(tmp_path, [[0]])
    reads = []
    read = tree_plan.read_plan
    monkeypatch.setattr(tree_plan, "read_plan", lambda *a, **k: reads.append(a) or read(*a, **k))
    assert static_shape(plan).size == 1 and static_shape(plan).size == 1
    assert len(reads) == 1  # the second ask is the cached shape
    plan_file(tmp_path, [[0], [1], [0, 0]])  # the same path rewritten
    assert static_shape(plan).size == 3 and len(reads) == 2
