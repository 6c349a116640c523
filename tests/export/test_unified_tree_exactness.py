"""A unified-vocabulary model's static tree drafted in one PyTorch call keeps the target's distribution
under the image grammar (forced row ends).

Why a test of its own: on PyTorch the one-call tree (runtime/chain.py DraftTree) drafts any static
shape, a unified model's included, and at a forced row end its draft row is a point mass, so the
call draws children the row has no mass for, which the host drops (tree_call.tree_from_draws);
the level-by-level drafter draws fewer uniforms there, so the two paths give different (both
exact) trees and no token equality can stand for exactness. The level path's exactness under the
grammar is test_grammar_exactness's (toy models, against the exact distribution); here the one-call
path is compared with it on real PyTorch modules: a tiny Emu3 target and a draft of another seed
(3 codes, a 2x2 grid: 81 images), a chi-square test of homogeneity between the two samples. Rows
handed to verification for the wrong nodes must fail the same test.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats

from unified_fixtures import one_torch_thread, tiny_emu3  # noqa: F401 (one_torch_thread: autouse)

SAMPLES, ALPHA = 6_000, 1e-4
PROMPT = [12, 13]  # two words of the fixture's vocabulary


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    from specrt.export.unified.sources import unified_models
    from specrt.runtime.families.unified.pipeline import UnifiedPipeline

    root = tmp_path_factory.mktemp("emu3-trees")
    target, draft = tiny_emu3(root / "target", codes=3, seed=0), tiny_emu3(root / "draft", codes=3, seed=1)
    models = unified_models(target, draft=draft, grid=(2, 2), cond_len=4)
    return UnifiedPipeline.from_torch(models.target, models.draft, None, max_window=32,
                                      sampling_defaults={"cfg_scale": 1.0}, max_images=500)


def streams(pipe, fused: bool, seed: int) -> tuple[list[tuple[int, ...]], int]:
    """SAMPLES images' streams (row ends included) and the draft calls they took."""
    result = pipe.generate(prompt_ids=[PROMPT] * SAMPLES, method="sd", tree="static", seed=seed, decode=False,
                           fused_drafting=fused)
    assert pipe.grammar.is_valid(result.stream).all()
    return [tuple(stream) for stream in result.stream.tolist()], result.stats.draft_calls


def homogeneity(a: list, b: list) -> tuple[float, float]:
    """(chi-square statistic, critical value at ALPHA) of the hypothesis that two samples come from
    one distribution; images expected fewer than 5 times in either sample are pooled."""
    images = sorted(set(a) | set(b))
    counts_a, counts_b = Counter(a), Counter(b)
    table = np.array([[counts_a[x] for x in images], [counts_b[x] for x in images]])
    expected = table.sum(axis=0) * table.sum(axis=1)[:, None] / table.sum()
    rare = (expected < 5).any(axis=0)
    if rare.any():
        table = np.column_stack([table[:, ~rare], table[:, rare].sum(axis=1)])
    statistic, _, dof, _ = stats.chi2_contingency(table)
    return statistic, stats.chi2.ppf(1 - ALPHA, dof)


@pytest.fixture(scope="module")
def level_path(pipe):
    """The reference sample: the tree drafted level by level."""
    return streams(pipe, fused=False, seed=1)


def test_the_one_call_tree_samples_what_the_level_path_samples(pipe, level_path):
    fused, calls = streams(pipe, fused=True, seed=2)
    assert calls < 0.6 * level_path[1]  # one draft call a round, where the level path makes one a depth
    statistic, critical = homogeneity(fused, level_path[0])
    assert statistic < critical, f"chi2 {statistic:.1f} >= {critical:.1f}"


def test_the_check_catches_rows_handed_over_for_the_wrong_nodes(pipe, level_path, monkeypatch):
    """Planted bug: each inner node's draft row is its predecessor's in the layout's order."""
    from specrt.runtime import model_drafter

    real = model_drafter.tree_from_draws
    monkeypatch.setattr(model_drafter, "tree_from_draws", lambda layout, root, draws, rows, max_depth: real(
        layout, root, draws, np.roll(np.asarray(rows), 1, axis=0), max_depth))
    statistic, critical = homogeneity(streams(pipe, fused=True, seed=2)[0], level_path[0])
    assert statistic > critical, f"wrong rows passed: chi2 {statistic:.1f} < {critical:.1f}"
