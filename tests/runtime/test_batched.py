"""Batched decoding on the toy backend: ragged acceptance, per-image random streams, images leaving.

The toy checks every slot's position against the cache columns and window slots its mask
shows, so a wrong per-image length, a pad slot that leaks into a real one, or a commit at the
wrong row fails loudly; exact token equality with one-image runs checks the rest.
"""
from __future__ import annotations

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.errors import SpecrtError
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.window import Window

METHODS = [("ar", {}), ("sd", {"draft_len": 3}), ("cool-sd", {"draft_len": 2}),
           ("lantern", {"draft_len": 3, "tvd_budget": 0.3}),
           ("lantern", {"draft_len": 2, "ratio": 2.0, "resampling": "gstar"}),
           ("sjd", {"window": 4}),
           ("sjd-pac", {"window": 6, "branching": 2, "tree_depth": 2}),
           ("sjd-pac", {"window": 6, "branching": 2, "tree_depth": 2, "tree": "full"}),
           ("sd", {"tree": "dynamic", "total_tokens": 8, "depth": 3, "tree_top_k": 2}),
           ("cool-sd", {"tree": "static", "static_tree": "reverse_balanced_25"}),
           ("lantern", {"tree": "dynamic", "total_tokens": 6, "depth": 3, "tree_top_k": 2})]
CLASSES = [0, 1, 2, 3, 1, 2]


def toy_pipeline(cfg_scale: float, **options) -> Pipeline:
    target, draft, vq = toy_models(vocab_size=5, grid_size=3, num_classes=4, seed=3, max_window=26)
    neighbours = np.array([[j for j in sorted(range(5), key=lambda j: (abs(i - j), j)) if j != i] for i in range(5)])
    return Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": cfg_scale}, neighbours=neighbours, **options)


@pytest.mark.parametrize("method,params", METHODS, ids=[f"{m}-{p.get('tree', '')}" for m, p in METHODS])
def test_every_image_of_a_batch_is_the_image_it_is_alone(method, params):
    for cfg_scale, temperature in ((1.0, 1.0), (2.0, 0.0)):
        pipe = toy_pipeline(cfg_scale)
        batch = pipe.generate(CLASSES, method=method, seed=5, temperature=temperature, decode=False, **params)
        for i, class_id in enumerate(CLASSES):
            alone = pipe.generate([class_id], method=method, seed=5 + i, temperature=temperature, decode=False, **params)
            np.testing.assert_array_equal(batch.tokens[i], alone.tokens[0], err_msg=f"image {i}, cfg {cfg_scale}")


def test_seeds_per_image_passes_and_forward_counts():
    """A seed per image picks each image's stream; passes of max_images give the same tokens; forwards
    count per image, so tokens per forward stays the accepted length at any batch size."""
    pipe = toy_pipeline(1.0)
    one_pass = pipe.generate(CLASSES, method="sd", seed=[7, 3, 9, 1, 4, 4], decode=False)
    passes = toy_pipeline(1.0, max_images=4).generate(CLASSES, method="sd", seed=[7, 3, 9, 1, 4, 4], decode=False)
    np.testing.assert_array_equal(one_pass.tokens, passes.tokens)
    np.testing.assert_array_equal(one_pass.tokens[2], pipe.generate([2], method="sd", seed=9, decode=False).tokens[0])
    stats = one_pass.stats
    assert stats.target_forwards == sum(stats.accepted_lengths.values()) and stats.target_calls < stats.target_forwards
    with pytest.raises(SpecrtError, match="2 seeds for 6 images"):
        pipe.generate(CLASSES, method="sd", seed=[1, 2])


def test_finished_images_leave_the_batch_and_pads_are_never_committed():
    pipe = toy_pipeline(2.0)
    batches = []
    step = pipe.target.step

    def spy(windows, uniforms):
        batches.append(pipe.target.batch)
        return step(windows, uniforms)

    pipe.target.step = spy
    try:
        pipe.generate(CLASSES, method="sjd", seed=0, window=3)
    finally:
        del pipe.target.step
    assert batches[0] == 12 and batches[-1] < 12 and batches == sorted(batches, reverse=True)
    # a ragged step by hand: image 1 has no window, image 0 a chain of 2; only the committed rows land
    runner = pipe.target
    runner.allocate(np.eye(2, dtype=np.float32))
    runner.prefill(np.array([0, 1]), np.zeros((2, 1)))
    runner.step([Window.chain([4, 2]), None], np.zeros((2, 2)))
    runner.commit([[0, 1], None])
    np.testing.assert_array_equal(runner.lengths, [3, 1])
    np.testing.assert_array_equal(runner.kv_buffer[:, :3], [[0, 4, 2], [1, -1, -1]])


@pytest.mark.parametrize("method", ["sd", "cool-sd", "lantern"])
def test_chains_from_another_drafter_give_the_same_tokens(monkeypatch, method):
    """A Drafter the batched chain loop does not drive (an EAGLE head, here a ModelDrafter subclass)
    runs the batch through the Drafter protocol: for the same independent draft that is exactly
    the batched loop's result."""
    from specrt.runtime.model_drafter import ModelDrafter
    from specrt.runtime.methods import speculative

    pipe = toy_pipeline(2.0)
    batched = pipe.generate(CLASSES, method=method, seed=3, draft_len=3, decode=False).tokens
    calls = []

    class OtherDrafter(ModelDrafter):
        def propose_chain(self, ctx, lengths):
            calls.append(list(lengths))
            return super().propose_chain(ctx, lengths)

    monkeypatch.setattr(speculative, "make_drafter", lambda ctx, fused=True: OtherDrafter(ctx.draft))
    one_by_one = pipe.generate(CLASSES, method=method, seed=3, draft_len=3, decode=False).tokens
    assert calls and max(len(c) for c in calls) == len(CLASSES)  # the batch drafts together
    assert np.array_equal(one_by_one, batched)


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_a_batch_of_trees_runs_each_depth_once_for_every_image(tree):
    """Trees decode batches like chains: one draft pass per depth and one target pass per round for
    the whole batch (fewer graph runs than the images alone), each image's tokens unchanged."""
    pipe = toy_pipeline(2.0)
    params = {"tree": tree, "total_tokens": 8, "depth": 3, "tree_top_k": 2, "static_tree": "reverse_balanced_25"}
    batch = pipe.generate(CLASSES, method="sd", seed=5, decode=False, **params)
    alone = [pipe.generate([c], method="sd", seed=5 + i, decode=False, **params) for i, c in enumerate(CLASSES)]
    for i, one in enumerate(alone):
        np.testing.assert_array_equal(batch.tokens[i], one.tokens[0])
    assert batch.stats.target_forwards == sum(one.stats.target_forwards for one in alone)  # per image
    assert batch.stats.target_calls <= max(one.stats.target_calls for one in alone) + 1
    assert batch.stats.target_calls < sum(one.stats.target_calls for one in alone) / 3
