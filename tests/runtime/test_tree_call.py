"""A static tree drafted in one call (runtime/tree_call.py, runtime/chain.py DraftTree).

sd, cool-sd and lantern with tree=static draft every depth of a round's tree in one draft call
where the runner can (a bundle's draft_tree graph for its shape, or the PyTorch module for any).
Node m is drawn with the counter uniform the level-by-level drafter draws it with, so both paths
draft the same trees, and everything after drafting is unchanged: the one-call path must
give the level path's tokens (which the exactness suites test) alone and in ragged batches, on
both backends. Its own draws without replacement are checked against their exact law here.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _toy_exact import chi_square  # noqa: E402
from demo_pipes import assert_one_call_trees_are_the_levels  # noqa: E402
from specrt.manifest import read_manifest  # noqa: E402
from specrt.runtime.tree import StaticShape, static_shape  # noqa: E402
from specrt.runtime.tree_call import TreeLayout, tree_from_draws  # noqa: E402

SMALL = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # root: 3 children; node 1: 2; nodes 2, 4: 1


def test_the_demo_bundle_drafts_the_default_static_tree_in_one_call(demo_bundle, ort_pipe):
    graph = read_manifest(demo_bundle).graph("draft_tree")
    assert graph.kind == "tree" and [list(p) for p in graph.tree] == static_shape("mc_sim_7b_63").paths
    assert graph.input("uniforms").shape[1] == 25 and graph.output("probs").shape[1] == 11  # root + 10 fed
    assert ort_pipe.draft.can_draft_tree(TreeLayout(static_shape("mc_sim_7b_63")))
    assert not ort_pipe.draft.can_draft_tree(TreeLayout(static_shape("reverse_balanced_25")))
    assert not ort_pipe.target.can_draft_tree(TreeLayout(static_shape("mc_sim_7b_63")))


def test_layout_numbers_nodes_as_the_shape():
    layout = TreeLayout(StaticShape(SMALL))
    assert layout.parents == [-1, 0, 0, 0, 1, 1, 2, 4] and layout.depths == [0, 1, 1, 1, 2, 2, 2, 3]
    assert layout.inner == [0, 1, 2, 4] and layout.fed == [1, 2, 4] and layout.levels == [[1, 2], [4]]


def test_tree_from_draws_drops_children_their_row_had_no_mass_for():
    """As draws_without_replacement stops when a row's mass runs out (the level path's rule)."""
    layout = TreeLayout(StaticShape(SMALL))
    rows = np.array([[0.5, 0.5, 0, 0, 0], [0.2] * 5, [1.0, 0, 0, 0, 0], [0.2] * 5], dtype=np.float32)
    draws = [0, 1, 2, 3, 4, 0, 1]  # nodes 1..7; the root's third child (node 3) finds no mass left
    tree, staged = tree_from_draws(layout, 9, draws, rows, max_depth=3)
    assert tree.tokens == [9, 0, 1, 3, 4, 0, 1] and tree.parents == [-1, 0, 0, 1, 1, 2, 3]
    assert sorted(tree.rows) == [0, 1, 2, 3] and tree.rows[2][0] == 1.0  # node 2's row
    assert staged == [(1, 0), (2, 1), (3, 2)]  # the fed nodes 1, 2, 4 (present slots W + 0, 1, 2)
    full, staged = tree_from_draws(layout, 9, draws, np.full((4, 5), 0.2, dtype=np.float32), max_depth=3)
    assert full.tokens == [9, *draws] and full.parents == layout.parents and full.depths == layout.depths
    assert full.children == layout.children and sorted(full.rows) == layout.inner
    assert staged == [(1, 0), (2, 1), (4, 2)]  # every row had mass for every child: the whole shape
    rows[1] = 0.0  # node 1's row is empty: its children (nodes 4, 5) and node 4's child go
    tree, staged = tree_from_draws(layout, 9, draws, rows, max_depth=3)
    assert tree.tokens == [9, 0, 1, 0] and tree.parents == [-1, 0, 0, 2] and staged == [(1, 0), (2, 1)]
    shallow, staged = tree_from_draws(layout, 9, draws, rows, max_depth=1)
    assert shallow.tokens == [9, 0, 1] and staged == [] and sorted(shallow.rows) == [0]


@pytest.mark.parametrize("backend", ["ort", "torch"])
@pytest.mark.parametrize("method", ["sd", "cool-sd", "lantern"])
@pytest.mark.parametrize("tree", ["static", "dynamic"])  # dynamic: tests/runtime/test_growth_call.py
def test_one_call_trees_give_the_level_by_level_tokens(request, backend, method, tree):
    classes = [0, 1, 2, 3, 4]  # a ragged batch: trees cut at different image ends
    assert_one_call_trees_are_the_levels(request.getfixturevalue(f"{backend}_pipe"), classes, 21, method=method,
                                         tree=tree)


def test_the_torch_module_drafts_any_static_shape(torch_pipe):
    for name in ("reverse_balanced_25", "naive_extend_57"):
        assert_one_call_trees_are_the_levels(torch_pipe, [5, 6], 2, method="sd", tree="static", static_tree=name)


def test_restricted_sampling_drafts_level_by_level(ort_pipe):
    """top-k acts on the host between levels: the tree graph cannot apply it."""
    result = ort_pipe.generate([2], method="sd", seed=0, tree="static", top_k=50, decode=False)
    assert ort_pipe.draft.forwards >= result.stats.target_forwards * 2  # a pass per depth


def test_in_graph_siblings_are_draws_without_replacement():
    """The root's first three children of many images with one row q: child 1 ~ q, child 2 ~
    q without child 1 (renormalised), child 3 ~ q without both. Their joint law is checked by
    chi-square at 4,000 images (sampling with replacement, or an unscaled uniform, fails it)."""
    from specrt.export.demo import load_demo
    from specrt.runtime.chain import DraftTree

    draft = load_demo().draft
    cfg = draft.config
    layout = TreeLayout(StaticShape(SMALL))
    module, images, calls = DraftTree(draft, layout), 500, 8
    generator = torch.Generator().manual_seed(5)
    drawn, q = [], None
    for _ in range(calls):
        ids = torch.full((images, 1), 7, dtype=torch.int32)
        positions = torch.full((images, 1), cfg.cond_len, dtype=torch.int32)
        mask = torch.ones(images, 1, cfg.cond_len + 1, dtype=torch.bool)
        past = torch.zeros(cfg.n_layer, 2, images, cfg.n_kv_head, cfg.cond_len, cfg.head_dim)
        mix = torch.eye(images) * 1.5  # temperature 2/3: a peaked row, so a wrong law shows
        uniforms = torch.rand(images, layout.nodes - 1, generator=generator)
        with torch.inference_mode():
            _, probs, draws = module(ids, positions, mask, past, torch.zeros(images, dtype=torch.int32), mix, uniforms)
        q = probs[0, 0].double().numpy()
        assert torch.allclose(probs[:, 0], probs[:1, 0], atol=1e-6)  # every image's root row is the same
        drawn.append(draws[:, :3].numpy())
    tokens = np.concatenate(drawn)
    assert all(len(set(row)) == 3 for row in tokens.tolist())  # distinct
    q = q / q.sum()
    top = np.argsort(-q)[:40]  # the exact joint of the three on the tokens that carry the mass; the rest pooled
    exact = {}
    for a in top:
        for b in top:
            for c in top:
                if len({a, b, c}) == 3:
                    exact[(a, b, c)] = q[a] * q[b] / (1 - q[a]) * q[c] / (1 - q[a] - q[b])
    exact[(-1, -1, -1)] = 1.0 - sum(exact.values())
    inside = np.isin(tokens, top).all(axis=1)
    tokens = np.where(inside[:, None], tokens, -1)
    statistic, critical = chi_square(tokens, exact)
    assert statistic < critical, (statistic, critical)
    assert exact[(-1, -1, -1)] < 0.5  # the test looks at the mass, not at the pool


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_the_tree_modules_copy_nothing_from_the_host_when_they_run(torch_pipe, monkeypatch, tree):
    """A CUDA graph captures a module's second call: inside it no tensor may be made from host
    data (index lists and masks are buffers made with the module); the tokens are unchanged."""
    expected = torch_pipe.generate([3], method="sd", seed=4, tree=tree, decode=False).tokens

    def refuse(*args, **kwargs):
        raise AssertionError("torch.tensor called while drafting a tree")

    monkeypatch.setattr(torch, "tensor", refuse)
    np.testing.assert_array_equal(torch_pipe.generate([3], method="sd", seed=4, tree=tree, decode=False).tokens,
                                  expected)
