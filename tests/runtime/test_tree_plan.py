"""runtime.tree_plan: the best tree for a node budget, the choice of its size from latencies, and the
plan's prediction against the chains and ar.
"""
from __future__ import annotations

import json
import math

import pytest

from specrt.errors import SpecrtError
from specrt.runtime.tree import StaticShape
from specrt.runtime.tree_acceptance import RankCounts, rates_at
from specrt.runtime.tree_latency import DynamicTree, Latency, level_widths
from specrt.runtime.tree_plan import (
    best_chain, best_paths, best_tree, chain_choice, chain_rate, expected_tokens, fan_paths, make_plan,
)
from specrt.runtime.tree_plan_file import PLAN_VERSION, read_plan, write_plan

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


def test_the_probe_fan_offers_every_rank_at_every_level():
    shape = StaticShape(fan_paths(3, 2))
    assert shape.size == 6 and shape.depth == 2 and [len(c) for c in shape.children if c] == [3, 3]


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


def test_a_dynamic_plans_chains_are_priced_at_the_rate_solved_from_measured_chain_rounds():
    assert math.isclose(chain_rate(1 + 0.5 + 0.25, 2), 0.5, abs_tol=1e-9)
    assert chain_rate(0.5, 4) == pytest.approx(0.0) and chain_rate(9.0, 4) == pytest.approx(1.0)
    latency = Latency([1e-3] * 70, [1e-4] * 70, chain={4: 3e-4})
    plan = make_plan([0.3, 0.1], latency, 8, kind="dynamic", chain_acceptance=[0.6])
    assert plan.predicted["chain_draft_len_4"]["tokens_per_round"] == round(1 + 0.6 + 0.36 + 0.216 + 0.1296, 4)
    assert plan.acceptance_by_depth == [[0.3, 0.1]]  # the tree's own rates are the probe's
    with pytest.raises(SpecrtError, match="chain_rate needs drafts"):
        chain_rate(2.0, 0)
