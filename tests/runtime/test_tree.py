"""Token trees and their parameters: static shapes, EAGLE-2 dynamic growth, tree windows, refusals.

The exactness of tree verification is checked by chi-square in test_losslessness (static and
dynamic trees) and test_planted_bugs (a broken sibling residual); these are the fast structural checks.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.errors import SpecrtError
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.methods import make_method
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.runner import window_sizes
from specrt.runtime.methods.tree_loop import grow_trees
from specrt.runtime.tree import STATIC_TREES, DynamicGrowth, StaticGrowth, StaticShape, TokenTree, static_shape
from specrt.runtime.verification.rules import CoolRule, LanternRule, VanillaRule
from specrt.runtime.verification.siblings import SAMPLED, TOP, draw_without_replacement
from specrt.runtime.verification.trees import verify_tree


class RowsDrafter:
    """A drafter whose row after a node depends only on the node's token path (a fixed table)."""

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab, self.seed, self.calls = vocab, seed, []

    def row(self, path: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng([self.seed, len(path), *path])
        return rng.dirichlet(np.ones(self.vocab))

    def expand(self, ctx, trees, nodes):
        (tree,), (asked,) = trees, nodes  # one image
        self.calls.append(list(asked))
        return [[self.row(tuple(tree.tokens[n] for n in tree.path(node))) for node in asked]]


class Ctx:
    """grow_trees reads nothing of its context here: the drafter's rows and the growths' own uniforms."""


def test_static_shapes_are_eagle_and_lantern_trees():
    shape = static_shape("mc_sim_7b_63")
    assert (shape.size, shape.depth, len(shape.children[0])) == (25, 5, 4)
    assert {name: StaticShape(c).size for name, c in STATIC_TREES.items()} == {
        "mc_sim_7b_63": 25, "mc_sim_7b_63_balanced": 25, "naive_extend_57": 57, "medusa_2_7b_63": 63,
        "reverse_balanced_25": 25}
    with pytest.raises(SpecrtError, match="lower-ranked siblings") as err:
        StaticShape([[0], [2]])  # rank 1 missing: its draw would be skipped by q^(k)
    assert "\n" not in str(err.value)


def test_static_tree_grows_its_shape_one_pass_per_depth_and_stops_at_the_image_end():
    drafter = RowsDrafter(vocab=50)
    shape = static_shape("mc_sim_7b_63")
    tree, = grow_trees(Ctx(), drafter, [StaticGrowth(7, shape, max_depth=9,
                                                     uniforms=np.random.default_rng(0).random(shape.size))])
    assert len(tree) == 26 and max(tree.depths) == 5 and len(drafter.calls) == 5
    assert [len(tree.children[n]) for n in drafter.calls[0]] == [4]
    for node, kids in enumerate(tree.children):  # siblings are distinct draws (without replacement)
        assert len({tree.tokens[k] for k in kids}) == len(kids)
    short, = grow_trees(Ctx(), RowsDrafter(vocab=50), [StaticGrowth(7, shape, max_depth=2,
                                                                    uniforms=np.random.default_rng(1).random(shape.size))])
    assert max(short.depths) == 2 and len(short) == 1 + 4 + 8


def test_dynamic_tree_is_eagle2s_expand_and_rerank():
    drafter = RowsDrafter(vocab=20, seed=3)
    top_k, depth, total = 3, 4, 10
    tree, = grow_trees(Ctx(), drafter, [DynamicGrowth(5, depth=depth, top_k=top_k, total_tokens=total, max_depth=99)])
    assert len(tree) == total + 1 and tree.drawn == TOP
    assert [len(c) for c in drafter.calls] == [1, top_k, top_k, top_k]  # the frontier: top_k nodes per depth

    def score(node):  # cumulative draft log-probability along the node's path
        path = tree.path(node)
        return sum(math.log(drafter.row(tuple(tree.tokens[n] for n in path[:i]))[tree.tokens[path[i]]])
                   for i in range(1, len(path)))

    # every candidate EAGLE-2 would have made, scored: the kept ones are the best `total`
    candidates, frontier = [], [(5,)]
    for _ in range(depth):
        new = []
        for path in frontier:
            row = drafter.row(path)
            for token in np.argsort(-row)[:top_k]:
                new.append((path + (int(token),), None))
        scored = [(sum(math.log(drafter.row(p[:i])[p[i]]) for i in range(1, len(p))), p) for p, _ in new]
        candidates += scored
        frontier = [p for _, p in sorted(scored, reverse=True)[:top_k]]
    best = sorted(s for s, _ in candidates)[-total:]
    assert sorted(score(n) for n in range(1, len(tree))) == pytest.approx(best)
    for node in range(1, len(tree)):  # children in order of draft probability
        kids = tree.children[node]
        assert [score(k) for k in kids] == sorted((score(k) for k in kids), reverse=True)


def test_tree_window_is_ancestry_and_depth():
    tree = TokenTree(9, TOP)
    a, b = tree.add(0, 1), tree.add(0, 2)
    c = tree.add(a, 3)
    window = tree.window()
    assert window.depths().tolist() == [0, 1, 1, 2]
    assert window.ancestry()[c].tolist() == [True, True, False, True]
    assert window.ancestry()[b].tolist() == [True, False, True, False]


def test_verify_tree_follows_accepted_children_and_takes_the_bonus_at_a_leaf():
    tree = TokenTree(0, TOP)
    first = tree.add(0, 1)
    leaf = tree.add(first, 2)
    p_rows = np.zeros((3, 3))
    p_rows[0, 1] = p_rows[1, 2] = p_rows[2, 0] = 1.0  # the target agrees with every draft
    outcome = verify_tree(p_rows, tree, VanillaRule(), [0.5] * 3, 0.5, bonus=[9, 9, 4])
    assert (outcome.path, outcome.accepted, outcome.next_token) == ([0, first, leaf], [1, 2], 4)


def test_tree_parameters_size_the_window_and_refuse_in_one_line():
    assert make_method("sd").max_window == 5  # the chain, unchanged
    assert make_method("sd", tree="static").max_window == 26
    assert make_method("lantern", tree="static", static_tree="naive_extend_57").max_window == 58
    assert make_method("cool-sd", tree="dynamic", total_tokens=10).max_window == 11
    assert make_method("cool-sd", tree="static").weights().shape == (5,)  # ω per depth of the tree
    for params, match in [({"tree": "forest"}, "tree must be one of"), ({"total_tokens": 0}, "total_tokens"),
                          ({"tree_top_k": 1.5}, "tree_top_k"), ({"static_tree": "oak"}, "static_tree")]:
        with pytest.raises(SpecrtError, match=match) as err:
            make_method("sd", **params)
        assert "\n" not in str(err.value)
    with pytest.raises(SpecrtError, match="tree=chain"):
        make_method("cool-sd", tree="static", theorem2=True)


def test_a_tree_larger_than_the_bundle_window_is_refused():
    target, draft, vq = toy_models(max_window=16)
    pipe = Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 1.0})
    with pytest.raises(SpecrtError, match="26 tokens per step"):
        pipe.generate([1], method="sd", tree="static")
    tokens = pipe.generate([1, 0], method="sd", tree="dynamic", total_tokens=15, depth=3, tree_top_k=2).tokens
    assert tokens.shape == (2, 2, 2)


def random_tree(rng: np.random.Generator, vocab: int, drawn: str) -> tuple[TokenTree, np.ndarray]:
    """A random 3-level tree (children drawn as `drawn` says) and target rows for its nodes."""
    tree = TokenTree(0, drawn)
    frontier = [0]
    for _ in range(3):
        nxt = []
        for node in frontier:
            row = rng.dirichlet(np.ones(vocab) * 0.5)
            tree.rows[node] = row
            picks = (draw_without_replacement(row, 3, rng.random(3)) if drawn == SAMPLED
                     else [int(t) for t in np.argsort(-row)[:3]])
            nxt += [tree.add(node, t) for t in picks]
        frontier = nxt[:2]
    return tree, rng.dirichlet(np.ones(vocab) * 0.5, size=len(tree))


@pytest.mark.parametrize("drawn", [SAMPLED, TOP])
def test_relaxed_rules_at_their_lossless_settings_verify_trees_as_sd_does(drawn):
    """UniformRSD at δ = 1 and LANTERN at δ = 0 are SD: on trees too, draw for draw."""
    vocab = 6
    neighbours = np.array([[t for t in np.argsort(np.abs(np.arange(vocab) - v)) if t != v] for v in range(vocab)])
    rules = [CoolRule(np.ones(3)), LanternRule(neighbours, tvd_budget=0.0)]
    for trial in range(200):
        tree, p_rows = random_tree(np.random.default_rng(trial), vocab, drawn)
        bonus = np.arange(len(tree)) % vocab
        coins, next_uniform = np.random.default_rng(trial).random(len(tree)), 0.3 + trial / 500
        want = verify_tree(p_rows, tree, VanillaRule(), coins, next_uniform, bonus)
        for rule in rules:
            got = verify_tree(p_rows, tree, rule, coins, next_uniform, bonus)
            assert (got.path, got.accepted, got.next_token) == (want.path, want.accepted, want.next_token)


@pytest.mark.parametrize("method,params", [("cool-sd", {"relaxation_budget": 3.0}), ("lantern", {"ratio": 3.0})])
def test_relaxed_methods_draft_trees_and_accept_at_least_as_much_as_sd(method, params):
    target, draft, vq = toy_models(vocab_size=8, grid_size=3, max_window=26, draft_noise=2.0)
    neighbours = np.array([[t for t in range(8) if t != v] for v in range(8)])
    pipe = Pipeline(target, vq, draft, neighbours=neighbours, sampling_defaults={"cfg_scale": 1.0})
    for tree in ("static", "dynamic"):
        kwargs = {"tree": tree, "total_tokens": 12, "depth": 4, "tree_top_k": 3}
        sd = pipe.generate([1] * 30, method="sd", seed=2, **kwargs).stats.mean_accepted_length
        relaxed = pipe.generate([1] * 30, method=method, seed=2, **kwargs, **params).stats.mean_accepted_length
        assert relaxed >= sd > 1.0, (tree, relaxed, sd)


@pytest.mark.parametrize("method", ["sd", "cool-sd"])
def test_greedy_tree_drafting_reproduces_greedy_decoding(method):
    """At temperature 0 every row is one-hot: a lossless tree verification must return exactly
    the target's greedy sequence (and Cool-SD's relaxation cannot accept a non-argmax token: ω·0 = 0)."""
    target, draft, vq = toy_models(vocab_size=6, grid_size=3, max_window=26, draft_noise=2.0)
    pipe = Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 2.0, "temperature": 0.0})
    want = pipe.generate([0, 1], method="ar", seed=0).tokens
    widths = []
    step = target.step
    target.step = lambda windows, *args: widths.append(int(window_sizes(windows, target.images).max())) or \
        step(windows, *args)
    for tree in ("static", "dynamic"):
        widths.clear()
        got = pipe.generate([0, 1], method=method, seed=5, tree=tree, total_tokens=12, depth=4,
                            static_tree="reverse_balanced_25").tokens
        np.testing.assert_array_equal(got, want, err_msg=f"{method} tree={tree}")
        # siblings still drafted (the draft's top-k children), not a chain of argmaxes
        assert max(widths) > 1 + 5 if tree == "static" else max(widths) > 1 + 4, (tree, max(widths))


class Meter:
    host_numbers = host_syncs = 0


@pytest.mark.parametrize("on", ["torch", "tensorrt"])
@pytest.mark.parametrize("drawn", [SAMPLED, TOP])
def test_a_batch_of_trees_on_device_rows_is_verified_as_each_alone_in_a_few_reads(drawn, on):
    """verify_trees over device rows (DeviceRows, on the CPU here) gives every image the outcome
    verify_tree gives it alone on host rows, with its own uniforms (SD, Cool-SD and LANTERN; images
    without a tree among them), the batch's rows read to the host in one transfer, not a few per
    image and node. The TensorRT runner's views (DeviceProbs, replayed on host memory) give the same."""
    torch = pytest.importorskip("torch")
    from specrt.engines.trt_runner import DeviceProbs
    from specrt.runtime.backends.device_outputs import DeviceRows
    from specrt.runtime.verification.trees import verify_trees

    vocab = 6
    neighbours = np.array([[t for t in np.argsort(np.abs(np.arange(vocab) - v)) if t != v] for v in range(vocab)])
    rules = [VanillaRule(), CoolRule(np.array([2.0, 1.0, 0.5])), LanternRule(neighbours[:, :2], tvd_budget=0.2)]
    for trial in range(40):
        rng = np.random.default_rng(trial)
        made = [random_tree(rng, vocab, drawn) if image != 2 else (None, None) for image in range(5)]
        width = max(len(tree) for tree, _ in made if tree is not None)
        block = np.zeros((len(made), width, vocab), dtype=np.float32)
        for image, (tree, rows) in enumerate(made):
            if tree is not None:
                block[image, :len(tree)] = rows
        bonus = rng.integers(0, vocab, size=(len(made), width))
        trees = [tree for tree, _ in made]
        coins, nexts = rng.random((len(made), width)), rng.random(len(made))
        for rule in rules:
            meter, flat = Meter(), block.reshape(-1)
            rows = DeviceRows(torch.from_numpy(block), meter) if on == "torch" else \
                DeviceProbs(lambda offset, count: flat[offset:offset + count].copy(), block.shape)
            got = verify_trees(rows, trees, rule, coins, nexts, bonus)
            for image, tree in enumerate(trees):
                if tree is None:
                    assert got[image] is None
                    continue
                want = verify_tree(block[image], tree, rule, coins[image], nexts[image], bonus[image])
                assert (got[image].path, got[image].accepted, got[image].next_token) == \
                    (want.path, want.accepted, want.next_token), (trial, rule, image)
            assert meter.host_syncs == (1 if on == "torch" else 0), (trial, rule, meter.host_syncs)  # DeviceProbs counts none
