"""Text-to-image LlamaGen checkpoints through export and the runtime (docs/contracts.md).

The check of the issue that asked for it: a t2i checkpoint in LlamaGen's own layout exports,
and its bundle's greedy tokens equal the PyTorch model's and LlamaGen's own t2i generation
for the same caption embeddings, captions of different lengths (so padded ones) in one batch.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specrt.errors import SpecrtError
from specrt.export.verify import verify_bundle
from specrt.runtime.conditions import Conditions
from specrt.runtime.pipeline import Pipeline
from tiny_t2i import CAPTION_DIM, COND_LEN, llamagen_t2i_greedy, t2i_bundle, t5_style_captions

LENGTHS = [2, COND_LEN, 4]  # three captions, two of them padded, in one batch


@pytest.fixture(scope="module")
def bundle():
    return t2i_bundle()


@pytest.fixture(scope="module")
def pipelines(bundle):
    manifest, models = bundle
    return Pipeline.from_bundle(manifest.root), Pipeline.from_torch(models.target, models.draft, models.vq, max_window=20)


def test_manifest_describes_the_t2i_models(bundle):
    manifest, _ = bundle
    for role in ("target", "draft"):
        entry = manifest.models[role]
        assert (entry["model_type"], entry["cond_len"], entry["caption_dim"]) == ("t2i", COND_LEN, CAPTION_DIM)
        assert "num_classes" not in entry
        prefill = manifest.graph(f"{role}_prefill")
        assert prefill.input_names[:3] == ("captions", "caption_mask", "uncond")
        assert prefill.input("captions").shape == ("batch", COND_LEN, CAPTION_DIM)
        assert prefill.input("caption_mask").dtype == "bool"
        assert manifest.graph(f"{role}_step").profile["cache_len"]["max"] == entry["capacity"] == COND_LEN + 16 + 20


@pytest.mark.slow
def test_graphs_match_pytorch_with_padded_captions_and_cfg_rows(bundle):
    manifest, models = bundle
    report = verify_bundle(manifest, models)
    assert report.passed, report.format()
    assert any("lengths 1 and" in c.case for c in report.comparisons)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_greedy_tokens_equal_llamagen_own_t2i_generation(bundle, role):
    manifest, models = bundle
    embeddings, mask = t5_style_captions(LENGTHS)
    expected = llamagen_t2i_greedy(role, embeddings, mask, cfg_scale=3.0)
    gpt = models.target if role == "target" else models.draft
    kwargs = dict(captions=(embeddings, mask), method="ar", temperature=0.0, cfg_scale=3.0)
    from_torch = Pipeline.from_torch(gpt, None, models.vq, max_window=20).generate(**kwargs).tokens
    np.testing.assert_array_equal(from_torch.reshape(len(LENGTHS), -1), expected)
    if role == "target":
        from_bundle = Pipeline.from_bundle(manifest.root).generate(**kwargs).tokens
        np.testing.assert_array_equal(from_bundle.reshape(len(LENGTHS), -1), expected)
    # the padding matters: the same captions unpadded give other tokens
    unpadded = Pipeline.from_torch(gpt, None, models.vq, max_window=20).generate(
        captions=(embeddings, None), method="ar", temperature=0.0, cfg_scale=3.0).tokens
    assert not np.array_equal(unpadded.reshape(len(LENGTHS), -1), expected)


def test_prefill_logits_match_llamagen_with_uncond_rows(bundle):
    """GPT.prefill on [cond; uncond] rows against the reference's prefill, to 1e-4."""
    from llamagen_reference import ReferenceLlamaGen
    from tiny_t2i import GRID, SIZES, llamagen_state

    _, models = bundle
    embeddings, mask = t5_style_captions(LENGTHS, seed=4)
    rows = Conditions.of_captions(embeddings, mask).with_uncond(0)
    state = llamagen_state("target", 0)
    ref = ReferenceLlamaGen(state, SIZES["target"]["n_head"], SIZES["target"]["n_kv_head"], GRID, COND_LEN)
    ref.setup_caches(len(rows), COND_LEN, torch.from_numpy(rows.caption_mask))
    ref_cond = torch.where(torch.from_numpy(rows.uncond)[:, None, None], state["cls_embedding.uncond_embedding"],
                           torch.from_numpy(rows.captions))
    with torch.no_grad():
        logits, _, _ = models.target.prefill(*(torch.from_numpy(a) for a in (rows.captions, rows.caption_mask, rows.uncond)))
        expected = ref.forward(cond=ref_cond, input_pos=torch.arange(COND_LEN))[:, -1:]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 3}), ("cool-sd", {"relaxation_budget": 2.0}),
                                           ("lantern", {"neighbours_k": 4}), ("sjd", {"window": 5}),
                                           ("sjd-pac", {"window": 8, "branching": 2, "tree_depth": 2})])
def test_every_method_runs_on_t2i_and_backends_agree(pipelines, method, params):
    ort_pipe, torch_pipe = pipelines
    embeddings, mask = t5_style_captions([3, 5], seed=1)
    results = [pipe.generate(captions=(embeddings, mask), method=method, seed=2, cfg_scale=2.0, **params)
               for pipe in (ort_pipe, torch_pipe)]
    np.testing.assert_array_equal(results[0].tokens, results[1].tokens)
    assert results[0].images.shape == (2, 8, 8, 3)


def test_t2i_pipeline_refuses_class_ids_and_wrong_caption_dims(pipelines):
    ort_pipe, torch_pipe = pipelines
    with pytest.raises(SpecrtError, match="text-to-image"):
        ort_pipe.generate([1])
    with pytest.raises(SpecrtError, match="no text encoder"):
        torch_pipe.generate(prompts=["a thick seven"])
    with pytest.raises(SpecrtError, match=f"takes {CAPTION_DIM}-dimensional"):
        ort_pipe.generate(captions=np.zeros((1, 3, CAPTION_DIM + 1), np.float32))
    with pytest.raises(SpecrtError, match="at most"):
        ort_pipe.generate(captions=np.zeros((1, COND_LEN + 1, CAPTION_DIM), np.float32))
