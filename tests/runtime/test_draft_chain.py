"""The draft chain (runtime/chain.py): a round's draft steps in one call, the same drafts as step by step.

SD, Cool-SD and LANTERN draft L tokens per round. Where the draft runner can (a bundle's
draft_chain graph, or the PyTorch chain module) they come from one call; everything else about
the methods is unchanged, so the chain must give the very tokens of the step-by-step loop (which
the exactness suites test) for every image, alone and in ragged batches, on both backends.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.manifest import read_manifest  # noqa: E402
from specrt.runtime.window import Window  # noqa: E402


def test_the_demo_bundle_carries_a_four_draft_chain(demo_bundle, ort_pipe):
    graph = read_manifest(demo_bundle).graph("draft_chain")
    assert graph.kind == "chain" and graph.role == "draft"
    assert graph.input("uniforms").shape[1] == 4 and graph.output("probs").shape[1] == 4
    assert ort_pipe.draft.can_chain(4) and not ort_pipe.draft.can_chain(3)
    assert not ort_pipe.target.can_chain(4)  # the target has no chain graph


@pytest.mark.parametrize("backend", ["ort", "torch"])
@pytest.mark.parametrize("method", ["sd", "cool-sd", "lantern"])
def test_chain_tokens_equal_the_step_by_step_loop(request, backend, method):
    pipe = request.getfixturevalue(f"{backend}_pipe")
    classes = [0, 1, 2, 3, 4, 5, 6]  # a ragged batch: images catch up on 1 or 2 tokens, end at different rounds
    chained = pipe.generate(classes, method=method, seed=11, decode=False)
    chain_calls = pipe.draft.forwards  # counted per generate call
    stepped = pipe.generate(classes, method=method, seed=11, decode=False, fused_drafting=False)
    assert chain_calls < 0.5 * pipe.draft.forwards  # one draft call per round instead of one per draft
    np.testing.assert_array_equal(chained.tokens, stepped.tokens)
    alone = pipe.generate([classes[3]], method=method, seed=14, decode=False)
    np.testing.assert_array_equal(alone.tokens[0], chained.tokens[3])


def test_a_chain_is_its_steps(ort_pipe):
    """runner.chain after a window = step on the window, then one-token steps on each draft: the
    same rows, the same draws, and the same cache rows committed."""
    draft = ort_pipe.draft
    mix = np.array([[4.0, -3.0], [0.0, 0.0]], dtype=np.float32)[:1]  # one image under CFG
    uniforms = np.array([[0.3, 0.9, 0.05, 0.6]])

    def start():
        draft.allocate(mix)
        draft.prefill(np.array([3, 10]), np.full((1, 1), 0.5))

    start()
    window = Window.chain([7, 8])
    out = draft.chain([window], 4, uniforms)
    rows, draws = np.array(out.probs), out.draws.copy()
    draft.commit(range(2 + 3))
    chained_kv = np.array(draft.kv_buffer)

    start()
    step_rows, step_draws = [], []
    step = draft.step([window], np.array([[0.0, uniforms[0, 0]]]))
    draft.commit(range(2))
    step_rows.append(np.array(step.probs[0, 1]))
    step_draws.append(int(step.draws[0, 1]))
    for j in range(1, 4):
        step = draft.step([Window.chain([step_draws[-1]])], uniforms[:, j:j + 1])
        if j < 3:
            draft.commit(range(1))
        step_rows.append(np.array(step.probs[0, 0]))
        step_draws.append(int(step.draws[0, 0]))
    np.testing.assert_allclose(rows[0], np.stack(step_rows), atol=1e-5)
    assert draws[0].tolist() == step_draws
    np.testing.assert_allclose(chained_kv, np.array(draft.kv_buffer), atol=1e-5)


def test_restricted_sampling_drafts_step_by_step(ort_pipe):
    """top-k acts on the host between steps: the chain cannot apply it, so the loop drafts."""
    result = ort_pipe.generate([2], method="sd", seed=0, decode=False, top_k=50)
    assert ort_pipe.draft.forwards == result.stats.draft_forwards  # one call per draft pass (one image)


def test_self_draft_bundle_drops_the_independent_drafts_chain(demo_bundle, tmp_path):
    from specrt.engines.quantize import QuantizeOptions, quantize_bundle

    manifest = quantize_bundle(demo_bundle, tmp_path / "self", QuantizeOptions(mode="int4"), self_draft=True)
    assert "draft_chain" not in manifest.graphs and "draft_chain.onnx" not in manifest.files
    assert not (tmp_path / "self" / "draft_chain.onnx").exists()
