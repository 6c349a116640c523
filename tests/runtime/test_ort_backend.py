"""The onnxruntime backend against the torch backend on one exported tiny bundle.

Exporting takes tens of seconds on a shared CPU, so the bundle is built once per module and
the file is marked slow (it still runs in CI).
"""
from __future__ import annotations

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.sampling import SamplingParams, guidance_mix, inverse_cdf
from specrt.runtime.window import Window

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    from specrt.export.bundle import ExportOptions, ModelSet, write_bundle
    from specrt.models.llamagen_gpt import GPT, GPTConfig
    from specrt.models.llamagen_vq import VQConfig, VQModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    target = GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=32, num_classes=4, grid_size=3, initializer_range=0.3))
    draft = GPT(GPTConfig(dim=16, n_layer=1, n_head=2, vocab_size=32, num_classes=4, grid_size=3, initializer_range=0.3))
    vq = VQModel(VQConfig(codebook_size=32, ch=16, ch_mult=(1, 2), z_channels=16, norm_groups=8, codebook_show_usage=False))
    bundle = tmp_path_factory.mktemp("ort") / "bundle"
    write_bundle(ModelSet(target, draft, vq), bundle, ExportOptions(max_window=8, max_batch=4, neighbours_k=4))
    return Pipeline.from_torch(target, draft, vq, max_window=8), Pipeline.from_bundle(bundle)


def test_step_rows_and_draws_match_torch_on_a_tree_window(pipelines):
    """The head's rows after a tree window and a commit, CFG-mixed, from both backends; the
    previous step's rows must survive the next step (double-buffered outputs)."""
    torch_pipe, ort_pipe = pipelines
    window = Window.tree([3, 7, 9, 1, 4], [-1, 0, 0, 1, 1])
    mix = guidance_mix(1, SamplingParams(cfg_scale=2.5, temperature=0.8))
    uniforms = np.random.default_rng(0).random((1, 5))
    outs = []
    for runner in (torch_pipe.target, ort_pipe.target):
        runner.allocate(mix)
        runner.prefill(np.array([1, 4]), uniforms[:, :1])
        first = runner.step(window, uniforms)
        kept = np.array(first.probs)
        runner.commit([0, 2])
        second = runner.step(Window.chain([5, 6]), uniforms[:, :2])
        np.testing.assert_array_equal(np.asarray(first.probs), kept)  # still valid one step on
        outs.append((kept, first.draws.copy(), np.array(second.probs)))
    (t_rows, t_draws, t_next), (o_rows, o_draws, o_next) = outs
    np.testing.assert_allclose(o_rows, t_rows, atol=1e-5)
    np.testing.assert_allclose(o_next, t_next, atol=1e-5)
    np.testing.assert_allclose(o_rows.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(o_draws, t_draws)
    np.testing.assert_array_equal(o_draws, inverse_cdf(o_rows.astype(np.float64), uniforms))


@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 3}), ("lantern", {"draft_len": 3, "tvd_budget": 0.5}),
                                           ("sjd-pac", {"window": 7, "branching": 2, "tree_depth": 2})])
def test_greedy_images_match_torch(pipelines, method, params):
    torch_pipe, ort_pipe = pipelines
    a = torch_pipe.generate([0, 3], method=method, seed=0, temperature=0.0, cfg_scale=2.0, **params)
    b = ort_pipe.generate([0, 3], method=method, seed=0, temperature=0.0, cfg_scale=2.0, **params)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert np.abs(a.images.astype(int) - b.images.astype(int)).max() <= 1


def test_kv_buffer_and_binding_survive_the_whole_call(pipelines):
    _, ort_pipe = pipelines
    runner = ort_pipe.target
    ort_pipe.generate([1], method="sjd", seed=0, window=6)
    kv, bindings = runner.kv_buffer, dict(runner._bindings)
    ort_pipe.generate([2], method="sjd", seed=1, window=6)
    assert runner.kv_buffer is kv and all(runner._bindings[key] is b for key, b in bindings.items())


def test_bundle_limits_are_user_errors(pipelines):
    _, ort_pipe = pipelines
    with pytest.raises(SpecrtError, match="at most 8"):
        ort_pipe.generate([0], method="sjd-pac")  # default window 64
    # exported with max_batch=4 (images): five images run in passes of 4 and 1, each image as alone
    five = ort_pipe.generate([0, 1, 2, 3, 0], method="ar", cfg_scale=2.0, seed=3, decode=False).tokens
    np.testing.assert_array_equal(five[4], ort_pipe.generate([0], method="ar", cfg_scale=2.0, seed=7, decode=False).tokens[0])
    with pytest.raises(SpecrtError, match="out of range"):
        ort_pipe.generate([4])


BATCHED = [("ar", {}), ("sd", {"draft_len": 3}), ("cool-sd", {"draft_len": 3}), ("lantern", {"draft_len": 2}),
           ("sjd", {"window": 4}), ("sjd-pac", {"window": 7, "branching": 2, "tree_depth": 2}),
           # a tree: alone, its levels are staged, adopted and committed as block copies and moves
           ("sd", {"tree": "dynamic", "total_tokens": 6, "depth": 3, "tree_top_k": 2})]


@pytest.mark.parametrize("method,params", BATCHED, ids=[m + ("-tree" if "tree" in p else "") for m, p in BATCHED])
def test_a_batch_gives_every_image_the_tokens_it_gets_alone(pipelines, method, params):
    """onnxruntime and PyTorch, greedy and sampled (CFG, top-k): decoding three images in one
    pass (ragged windows, finished images leaving the batch) gives image i exactly what
    generate([class_i], seed=seed + i) gives alone."""
    classes = [1, 3, 0]
    for pipe in pipelines:
        for seed, sampling in ((5, {"temperature": 0.0}), (9, {"cfg_scale": 2.0, "top_k": 8})):
            batch = pipe.generate(classes, method=method, seed=seed, decode=False, **sampling, **params).tokens
            for i, class_id in enumerate(classes):
                alone = pipe.generate([class_id], method=method, seed=seed + i, decode=False, **sampling, **params)
                np.testing.assert_array_equal(batch[i], alone.tokens[0], err_msg=f"{method} image {i} seed {seed}")


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_block_copies_and_moves_are_the_gathers_they_stand_for(pipelines, backend):
    """A batch of one image commits, stages and adopts runs as block copies and moves
    (_write_block, _move_block, overlapping runs included); each equals the general row gather
    (_write_kv, _move_kv) over the image's rows and its CFG twin, on both backends' buffers."""
    runner = pipelines[0 if backend == "torch" else 1].target
    runner.allocate(guidance_mix(1, SamplingParams(cfg_scale=2.0)))
    rng = np.random.default_rng(0)
    if backend == "torch":
        runner._kv.copy_(torch.from_numpy(rng.random(tuple(runner._kv.shape), dtype=np.float32)))
        runner._present = torch.from_numpy(rng.random((*runner._kv.shape[:4], 5, runner._kv.shape[5]), dtype=np.float32))
        kv_now = lambda: runner._kv.numpy().copy()  # noqa: E731
        restore = lambda before: runner._kv.copy_(torch.from_numpy(before))  # noqa: E731
    else:
        runner._kv[...] = rng.random(runner._kv.shape)
        runner._present, _, _ = runner._bound_views((5, 0), runner.batch, 5, 5)
        runner._present[...] = rng.random(runner._present.shape)
        kv_now = lambda: runner._kv.copy()  # noqa: E731
        restore = lambda before: runner._kv.__setitem__(Ellipsis, before)  # noqa: E731
    rows = np.arange(runner.batch)

    def gathered(call, column, source, count):
        before = kv_now()
        offsets = np.repeat(np.arange(count), len(rows))
        call(np.tile(rows, count), column + offsets, source + offsets)
        expected = kv_now()
        restore(before)
        return expected

    for column, source, count in ((3, 0, 4), (6, 2, 3)):  # a window's slots into the cache
        expected = gathered(runner._write_kv, column, source, count)
        runner._write_block(column, source, count)
        np.testing.assert_array_equal(kv_now(), expected)
    for column, source, count in ((4, 6, 3), (4, 9, 2), (5, 6, 1)):  # staged rows moved down, overlapping or not
        expected = gathered(runner._move_kv, column, source, count)
        runner._move_block(column, source, count)
        np.testing.assert_array_equal(kv_now(), expected)

@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_a_shrinking_batch_keeps_each_kept_images_rows_in_use(pipelines, backend):
    """retain moves the kept images' KV rows (with their CFG twins) to the front of the same
    buffer in place, block by block, over the columns in use (committed + staged): every kept row
    there equals what it held before, in the new batch order; dropped images and unused columns
    are gone. Fails if a block overwrites rows still to be read, or if the columns in use are cut
    short."""
    runner = pipelines[0 if backend == "torch" else 1].target
    runner.allocate(guidance_mix(4, SamplingParams(cfg_scale=2.0)))
    as_numpy = (lambda kv: kv.numpy().copy()) if backend == "torch" else (lambda kv: kv.copy())
    values = np.random.default_rng(1).random(tuple(runner._kv.shape), dtype=np.float32)
    if backend == "torch":
        runner._kv.copy_(torch.from_numpy(values))
    else:
        runner._kv[...] = values
    runner.lengths[:] = [7, 3, 5, 8]
    runner.staged[:] = [0, 6, 0, 0]
    keep = [1, 2]  # the widest in use: image 1's 3 committed and 6 staged rows
    runner.retain(keep)
    after = as_numpy(runner._kv)
    old_rows = [1, 2, 5, 6]  # images 1 and 2, then their CFG twins (rows i + 4)
    assert after.shape[2] == len(old_rows)
    np.testing.assert_array_equal(after[:, :, :, :, :9], values[:, :, old_rows, :, :9])
    assert runner.lengths.tolist() == [3, 5] and runner.staged.tolist() == [6, 0]
    with pytest.raises(ValueError, match="increasing"):  # the in-place moves (TensorRT's too) rely on the order
        runner.retain([1, 0])


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("rows", [[0, 2, 3, 5], [0, 1, 0, 2, 3, 2, 4, 5]], ids=["shrink", "grow"])
def test_regrouping_kv_in_place_moves_every_layers_rows(backend, rows):
    """regroup_kv on a buffer of three layers: each (layer, key|value) block's rows land in their new
    places in order, as a gather into fresh memory would put them (numpy arrays and torch tensors
    alike), whether the batch shrinks (kept rows to the front) or grows (three images' two twins
    to four images', a new image's rows copying image 0's). Fails when the blocks are written in
    the wrong order for the direction."""
    from specrt.runtime.kv_rows import regroup_kv

    values = np.random.default_rng(2).random((3, 2, 6, 2, 5, 4), dtype=np.float32)
    rows = np.array(rows)
    flat = np.zeros(values.size * 2, dtype=np.float32)  # room for the grown batch
    flat[: values.size] = values.reshape(-1)
    if backend == "torch":
        flat = torch.from_numpy(flat)
    old = flat[: values.size].reshape(values.shape)
    new = regroup_kv(flat, old, torch.from_numpy(rows) if backend == "torch" else rows, 5)
    assert tuple(new.shape) == (3, 2, len(rows), 2, 5, 4)
    np.testing.assert_array_equal(np.asarray(new), values[:, :, rows])


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_one_image_stages_any_slots_after_its_rows(pipelines, backend):
    """stage for a batch of one image (ModelRunner._stage_one): a run of slots is one block copy,
    other slots a gather; either way they land after the image's committed and staged rows, in
    order, on both backends' buffers, and the staged count grows by their number."""
    runner = pipelines[0 if backend == "torch" else 1].target
    runner.allocate(guidance_mix(1, SamplingParams(cfg_scale=2.0)))
    rng = np.random.default_rng(3)
    if backend == "torch":
        runner._present = torch.from_numpy(rng.random((*runner._kv.shape[:4], 5, runner._kv.shape[5]), dtype=np.float32))
        kv_now = lambda: runner._kv.numpy().copy()  # noqa: E731
        present = runner._present.numpy()
    else:
        runner._present, _, _ = runner._bound_views((5, 0), runner.batch, 5, 5)
        runner._present[...] = rng.random(runner._present.shape)
        kv_now = lambda: runner._kv.copy()  # noqa: E731
        present = runner._present
    runner.lengths[0] = 2
    runner.stage([range(1, 3)])  # a level: slots 1, 2 to columns 2, 3
    runner.stage([[4, 0, 3]])  # any slots: to columns 4, 5, 6
    kv = kv_now()
    np.testing.assert_array_equal(kv[..., 2:7, :], present[..., [1, 2, 4, 0, 3], :])
    assert runner.staged.tolist() == [5] and runner.lengths.tolist() == [2]
