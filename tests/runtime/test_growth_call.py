"""A dynamic tree grown in one call (runtime/tree_call.py GrowthLayout, runtime/chain.py DraftGrowth).

sd, cool-sd and lantern with tree=dynamic grow EAGLE-2's tree one draft pass per depth, the host
ranking each frontier's rows between passes (runtime.tree.DynamicGrowth). Where the runner can
(a bundle's draft_growth graph for its depth and top-k, or the PyTorch module for any), the
passes run inside one call and the host keeps the total_tokens best candidates. Nothing is
sampled while growing, so the tree is a function of the draft's rows: the one-call path must
build DynamicGrowth's tree from the same rows (checked here on a toy draft with rows that run
out of mass and images that end mid-tree), stage the nodes its passes ran, advance each stream
as those passes would, and so give the level path's tokens on the demo, alone and in batches
(tests/runtime/test_tree_call.py, beside the static tree's).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.manifest import read_manifest  # noqa: E402
from specrt.runtime.chain import DraftGrowth  # noqa: E402
from specrt.runtime.tree import DEFAULT_GROWTH, DynamicGrowth  # noqa: E402
from specrt.runtime.tree_call import GrowthLayout, grown_tree  # noqa: E402

VOCAB, ROOT_POSITION = 12, 3


class TableDraft(torch.nn.Module):
    """A draft whose row after a token at a position is a fixed random softmax row, with about
    a third of the tokens at no mass (logits −1e4: exactly 0 in float32), so frontier rows run
    out of candidates; it keeps no state (its present rows are zeros of the right shape)."""

    def __init__(self, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        logits = torch.randn(VOCAB, 16, VOCAB, generator=generator) * 2
        self.table = torch.where(torch.rand(VOCAB, 16, VOCAB, generator=generator) < 0.35, -1e4, logits)

    def step(self, ids, positions, mask, past_kv):
        batch, width = ids.shape
        return self.table[ids, positions], None, torch.zeros(1, 2, batch, 1, width, 1)

    def row(self, token: int, position: int) -> np.ndarray:
        return torch.softmax(self.table[token, position], dim=-1).numpy()


def _grow_level_by_level(draft: TableDraft, root: int, depth: int, top_k: int, total: int, max_depth: int):
    """DynamicGrowth fed the toy draft's rows pass by pass, as the level path's drafter feeds it;
    also the nodes each pass ran."""
    growth, ran = DynamicGrowth(root, depth, top_k, total, max_depth), []
    while pending := growth.pending():
        ran.append(len(pending))
        tree = growth.tree
        growth.receive(np.stack([draft.row(tree.tokens[n], ROOT_POSITION + tree.depths[n]) for n in pending]))
    return growth, ran


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("depth,top_k,total", [(4, 3, 10), (3, 4, 40), (1, 3, 3)])
def test_grown_tree_is_the_level_paths_tree(seed, depth, top_k, total):
    draft = TableDraft(seed)
    module, layout = DraftGrowth(draft, depth, top_k), GrowthLayout(depth, top_k)
    roots = [(seed + i) % VOCAB for i in range(3)]
    ids = torch.tensor([[r] for r in roots], dtype=torch.int32)
    with torch.inference_mode():
        _, tokens, scores, fronts = module(ids, torch.full((3, 1), ROOT_POSITION, dtype=torch.int32),
                                           torch.ones(3, 1, 1, dtype=torch.bool), torch.zeros(1, 2, 3, 1, 0, 1),
                                           torch.zeros(3, dtype=torch.int32), torch.eye(3))
    assert tokens.shape == scores.shape == (3, layout.candidates) and fronts.shape == (3, layout.fed)
    for image, root in enumerate(roots):
        for max_depth in sorted({1, max(depth - 1, 1), depth + 2}):
            level, ran = _grow_level_by_level(draft, root, depth, top_k, total, max_depth)
            expected = level.result()
            tree, expanded, staged = grown_tree(layout, root, tokens[image].numpy(), scores[image].numpy(),
                                                fronts[image].numpy(), min(depth, max_depth), total)
            assert (tree.tokens, tree.parents, tree.drawn) == (expected.tokens, expected.parents, expected.drawn)
            # the frontier nodes the passes ran (after the first: the root's), in the order they ran
            assert len(staged) == sum(ran[1:])
            run = [n for n in range(1, len(level.tree)) if level.tree.depths[n] < min(depth, max_depth)]
            assert expanded.tokens[1:] == [level.tree.tokens[n] for n in run]
            assert expanded.parents[1:] == [run.index(level.tree.parents[n]) + 1 if level.tree.parents[n] else 0
                                            for n in run]


def test_rows_without_mass_leave_the_tree():
    """A root row with mass on two tokens gives two candidates at pass 1, whatever top_k: the
    others score −inf, rank last, and neither join the tree nor run."""
    draft = TableDraft(0)
    draft.table[5, ROOT_POSITION] = -1e4
    draft.table[5, ROOT_POSITION, [2, 7]] = torch.tensor([1.0, 0.0])
    layout = GrowthLayout(2, 4)
    with torch.inference_mode():
        _, tokens, scores, fronts = DraftGrowth(draft, 2, 4)(
            torch.tensor([[5]], dtype=torch.int32), torch.tensor([[ROOT_POSITION]], dtype=torch.int32),
            torch.ones(1, 1, 1, dtype=torch.bool), torch.zeros(1, 2, 1, 1, 0, 1), torch.zeros(1, dtype=torch.int32),
            torch.eye(1))
    assert tokens[0, :2].tolist() == [2, 7] and np.isneginf(scores[0, 2:4].numpy()).all()
    assert fronts[0, :2].tolist() == [0, 1]  # the two real candidates lead the frontier
    tree, expanded, staged = grown_tree(layout, 5, tokens[0].numpy(), scores[0].numpy(), fronts[0].numpy(), 2, 100)
    assert expanded.tokens == [5, 2, 7] and staged == [0, 1]
    assert tree.tokens[:3] == [5, 2, 7] and np.isfinite(scores[0].numpy()).sum() == len(tree) - 1


def test_the_demo_bundle_grows_the_default_dynamic_tree_in_one_call(demo_bundle, ort_pipe):
    graph = read_manifest(demo_bundle).graph("draft_growth")
    depth, top_k = DEFAULT_GROWTH
    assert graph.kind == "growth" and graph.growth == {"depth": depth, "top_k": top_k}
    assert "uniforms" not in graph.input_names and graph.output("scores").dtype == "float64"
    assert graph.output("fronts").shape[1] == (depth - 1) * top_k
    assert ort_pipe.draft.can_grow_tree(GrowthLayout(depth, top_k))
    assert not ort_pipe.draft.can_grow_tree(GrowthLayout(depth - 1, top_k))
    assert not ort_pipe.target.can_grow_tree(GrowthLayout(depth, top_k))


def test_the_torch_module_grows_any_depth_and_top_k(torch_pipe):
    settings = dict(method="sd", seed=2, tree="dynamic", depth=3, tree_top_k=3, total_tokens=10, decode=False)
    one_call = torch_pipe.generate([5, 6], **settings)
    calls = torch_pipe.draft.forwards
    levels = torch_pipe.generate([5, 6], fused_drafting=False, **settings)
    assert calls < 0.6 * torch_pipe.draft.forwards  # three passes a round at most
    np.testing.assert_array_equal(one_call.tokens, levels.tokens)


def test_restricted_sampling_or_another_shape_grows_level_by_level(ort_pipe):
    """top-k reshapes rows on the host between passes, and the bundle's graph has one depth."""
    for settings in (dict(top_k=50), dict(depth=4)):
        result = ort_pipe.generate([2], method="sd", seed=0, tree="dynamic", decode=False, **settings)
        assert ort_pipe.draft.forwards >= result.stats.target_forwards * 2  # a pass per depth


@pytest.mark.parametrize("value,message", [
    ("6", "--draft-growth takes DEPTH,TOP_K"), ("6,0", "--draft-growth takes DEPTH,TOP_K"),
    ("10,8", "--draft-growth 10,8 feeds 72 frontier nodes after the window; --max-window 65 holds 64 at most"),
])
def test_export_refuses_a_growth_it_cannot_export_in_one_line(tmp_path, capsys, value, message):
    from specrt.cli import main

    out = tmp_path / "bundle"
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--out", str(out), "--draft-growth", value])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_default_growth_is_left_out_where_the_window_cannot_hold_it():
    from specrt.export.bundle import ExportOptions

    assert ExportOptions().growth == DEFAULT_GROWTH
    assert ExportOptions(max_window=40).growth is None  # 40 fed nodes and a window do not fit
    assert ExportOptions(max_window=40, draft_growth="3,4").growth == (3, 4)
    assert ExportOptions(draft_growth="").growth is None  # --draft-growth none

