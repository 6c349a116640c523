"""Continuous decoding batches: ar and cspd decode a batch of images in one pass.

A tiny random-weight MAR pair (8 tokens, drafts of 3) makes the images of a batch accept
different numbers of drafts and finish in different rounds. The runner is checked slot by slot
against one-image runs (ragged windows, pads, per-image commits, finished images leaving); the
methods and the pipeline give each image the same tokens alone or in any batch, on onnxruntime
and on the torch backend, while a batch costs fewer target passes (graph runs) than its images
one by one. Equality is to float rounding: a batched graph may sum in another order.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from _continuous_exact import tiny_bundle  # noqa: E402
from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.families.continuous.bundle import open_runner  # noqa: E402
from specrt.runtime.families.continuous.pipeline import ContinuousPipeline  # noqa: E402

CLASSES = [1, 3, 5, 7]
CSPD = {"draft_len": 3, "prefill_ratio": 0.1}
BACKENDS = ["onnxruntime", "torch"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("batch") / "bundle", 0.1, token_dim=2, seq_len=8, diffusion_steps=3,
                       beta_start=0.1, beta_end=0.5)


@pytest.fixture(scope="module", params=BACKENDS)
def pipe(request, bundle):
    return ContinuousPipeline.from_bundle(bundle, request.param)


def test_the_runner_steps_ragged_windows_and_commits_per_image(bundle):
    """Three images at different lengths, windows of 3, 1 and none (pads): each image's z and
    its committed cache are those of the image alone; a retained image keeps its rows."""
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((3, 9, 2)).astype(np.float32)
    batch, alone = open_runner(bundle, "target"), open_runner(bundle, "target")
    batch.start([2, 4, 6], cfg_scale=2.0)
    batch.step(inputs[:, :2])  # every image: class token + token 0
    batch.commit([2, 1, 2])
    z = batch.by_image(batch.step([inputs[0, 2:5], inputs[1, 1:2], None]))
    batch.commit([3, 1, 0])
    assert batch.lengths.tolist() == [5, 2, 2] and z.shape[:3] == (2, 3, 3)
    for image, (length, size) in enumerate([(2, 3), (1, 1)]):
        alone.start([[2, 4, 6][image]], cfg_scale=2.0)
        alone.step(inputs[image, :length])
        alone.commit(length)
        want = alone.step(inputs[image, length : length + size])
        np.testing.assert_allclose(z[:, image, :size], want, atol=ATOL)
    batch.retain([1])  # image 1 alone now: its next window sees exactly its own cache
    alone.start([4], cfg_scale=2.0)
    alone.step(inputs[1, :2])
    alone.commit(2)
    np.testing.assert_allclose(batch.step(inputs[1, 2:4]), alone.step(inputs[1, 2:4]), atol=ATOL)
    with pytest.raises(ValueError, match="cannot commit"):
        batch.commit(3)


@pytest.mark.parametrize("method, params", [("ar", {}), ("cspd", CSPD)])
def test_a_batch_of_four_costs_fewer_target_passes_and_gives_the_same_tokens(pipe, method, params):
    """Under CFG with MAR's linear schedule: one generate call of 4 classes against 4 calls of
    one class with the seeds the batch gives its images (seed + i)."""
    sampling = {"cfg_scale": 2.0, "cfg_schedule": "linear", "temperature": 0.9}
    pipe.target.reset_counters()
    batch = pipe.generate(CLASSES, method=method, seed=11, decode=False, **params, **sampling)
    batch_runs = pipe.target.forwards
    singles, passes, runs, accepted, drafted = [], 0, 0, 0, 0
    for i, class_id in enumerate(CLASSES):
        pipe.target.reset_counters()
        one = pipe.generate([class_id], method=method, seed=11 + i, decode=False, **params, **sampling)
        singles.append(one.tokens[0])
        passes, runs = passes + one.stats.target_passes, runs + pipe.target.forwards
        accepted, drafted = accepted + one.stats.accepted, drafted + one.stats.drafted
    np.testing.assert_allclose(batch.tokens, np.stack(singles), atol=ATOL)
    assert (batch.stats.accepted, batch.stats.drafted) == (accepted, drafted)
    assert batch.stats.target_forwards == passes  # the same per-image work ...
    assert batch.stats.target_passes == batch_runs < passes == runs  # ... in fewer graph runs
    print(f"{method} on {type(pipe.target).__name__}: batch of 4: {batch.stats.target_passes} target passes; "
          f"4 single runs: {passes}")
    if method == "cspd":  # ragged: images accepted differently and finished in different rounds
        assert 0 < batch.stats.accepted < batch.stats.drafted
        assert batch.stats.target_forwards < len(CLASSES) * batch.stats.target_passes


def test_max_images_splits_a_call_into_passes_with_the_same_images(bundle):
    one_pass = ContinuousPipeline.from_bundle(bundle).generate(CLASSES, method="cspd", seed=3, decode=False, **CSPD)
    small = ContinuousPipeline.from_bundle(bundle, max_images=3)
    two_passes = small.generate(CLASSES, method="cspd", seed=3, decode=False, **CSPD)
    np.testing.assert_allclose(two_passes.tokens, one_pass.tokens, atol=ATOL)
    assert len(two_passes.seconds) == len(CLASSES)
    with pytest.raises(SpecrtError, match="max_images"):
        ContinuousPipeline.from_bundle(bundle, max_images=0)


def test_each_image_has_its_own_seed(bundle):
    """seed=[a, b] gives each image its seed: the second is generate([c], seed=b)'s only image."""
    pipe = ContinuousPipeline.from_bundle(bundle)
    pair = pipe.generate([3, 3], method="cspd", seed=[5, 9], decode=False, **CSPD)
    alone = pipe.generate(3, method="cspd", seed=9, decode=False, **CSPD)
    np.testing.assert_allclose(pair.tokens[1], alone.tokens[0], atol=ATOL)
    assert np.abs(pair.tokens[0] - pair.tokens[1]).max() > 1e-3
    with pytest.raises(SpecrtError, match="2 seeds for 3 images"):
        pipe.generate([1, 2, 3], seed=[1, 2], decode=False)


def test_a_format_1_step_graph_is_refused_in_one_line(bundle, tmp_path):
    """Bundles written before batching (step graph without attention_mask) name the fix."""
    import shutil
    import warnings

    import torch

    from specrt.models.mar.model import MAR, MARConfig

    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    model = open_runner(bundle, "target", "torch").model

    class FormatOne(torch.nn.Module):
        def __init__(self, mar: MAR):
            super().__init__()
            self.transformer = mar.transformer

        def forward(self, tokens, class_ids, positions, past_k, past_v):
            return self.transformer.step(tokens, class_ids, positions, past_k, past_v)

    cfg: MARConfig = model.cfg
    past = torch.zeros(cfg.n_layer, 2, cfg.n_head, 1, cfg.head_dim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(FormatOne(model), (torch.zeros(2, 2, cfg.token_dim), torch.tensor([0, 1]),
                                             torch.arange(1, 3), past, past.clone()),
                          str(old / "target_step.onnx"), dynamo=False,
                          input_names=["tokens", "class_ids", "positions", "past_k", "past_v"])
    with pytest.raises(SpecrtError, match="format 1.*re-export") as info:
        open_runner(old, "target")
    assert "\n" not in str(info.value)
