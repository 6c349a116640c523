"""Runner protocol: KV buffers allocated once, masks and positions, greedy agreement across
methods and window shapes on a real (tiny, random) LlamaGen GPT, seed determinism, errors."""
from __future__ import annotations

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.window import Window, fill_step_inputs

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_pipeline():
    from specrt.models.llamagen_gpt import GPT, GPTConfig
    from specrt.models.llamagen_vq import VQConfig, VQModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    target = GPT(GPTConfig(dim=64, n_layer=2, n_head=4, n_kv_head=2, vocab_size=64, num_classes=10, grid_size=4,
                           initializer_range=0.2))
    draft = GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=64, num_classes=10, grid_size=4, initializer_range=0.2))
    vq = VQModel(VQConfig(codebook_size=64, ch=32, ch_mult=(1, 2), z_channels=32, norm_groups=8, codebook_show_usage=False))
    return Pipeline.from_torch(target, draft, vq, max_window=16), target


def test_tree_mask_and_positions():
    window = Window.tree([5, 6, 7, 8], [-1, 0, 0, 1])
    ids, pos = np.zeros((2, 4), np.int32), np.zeros((2, 4), np.int32)
    mask = np.ones((2, 4, 10 + 4), bool)
    fill_step_inputs(window, lengths=3, capacity=10, ids=ids, positions=pos, mask=mask)
    np.testing.assert_array_equal(pos[0], [3, 4, 4, 5])
    assert mask[:, :, :3].all() and not mask[:, :, 3:10].any()
    np.testing.assert_array_equal(mask[0, :, 10:], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]])
    assert window.path_to(3) == [0, 1, 3]


@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 3}), ("sjd-pac", {"window": 12, "branching": 3})])
def test_kv_buffer_is_allocated_once_per_generate_call(tiny_pipeline, method, params):
    pipe, _ = tiny_pipeline
    seen = []
    runner = pipe.target
    original = runner.step

    def spy(window, uniforms):
        seen.append((id(runner.kv_buffer), runner.kv_buffer.data_ptr()))
        return original(window, uniforms)

    runner.step = spy
    try:
        pipe.generate([1], method=method, seed=0, **params)
    finally:
        del runner.step
    assert len(seen) > 3 and len(set(seen)) == 1


def test_greedy_tokens_agree_across_methods_and_match_teacher_forcing(tiny_pipeline):
    """With temperature 0 every lossless method must reproduce AR exactly; AR must match the
    model's own teacher-forced argmax (positions, masks, commits all right, tree windows too)."""
    pipe, target = tiny_pipeline
    base = pipe.generate([2, 7], method="ar", seed=0, temperature=0.0, cfg_scale=1.0).tokens
    with torch.no_grad():
        logits = target(torch.tensor([2, 7]), torch.from_numpy(base.reshape(2, -1)))
    np.testing.assert_array_equal(logits.argmax(-1).numpy(), base.reshape(2, -1))
    for method, params in [("sd", {"draft_len": 3}), ("sjd", {"window": 6}),
                           ("sjd-pac", {"window": 15, "branching": 3, "tree_depth": 2})]:
        got = pipe.generate([2, 7], method=method, seed=3, temperature=0.0, cfg_scale=1.0, **params).tokens
        np.testing.assert_array_equal(got, base, err_msg=method)


@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {}), ("cool-sd", {"relaxation_budget": 2}),
                                           ("lantern", {"tvd_budget": 0.3}), ("sjd", {"window": 15}), ("sjd-pac", {"window": 15})])
def test_same_seed_same_tokens_and_stats(tiny_pipeline, method, params):
    pipe, _ = tiny_pipeline
    a = pipe.generate([4], method=method, seed=7, **params)
    b = pipe.generate([4], method=method, seed=7, **params)
    c = pipe.generate([4], method=method, seed=8, **params)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    assert a.images.dtype == np.uint8 and a.images.shape == (1, 8, 8, 3)
    stats = a.stats
    assert stats.tokens == 16 and sum(k * v for k, v in stats.accepted_lengths.items()) == 16
    assert stats.mean_accepted_length == pytest.approx(16 / stats.target_forwards)


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_device_resident_tree_drafting_reads_each_pass_back_once(tiny_pipeline, tmp_path, tree):
    """A tree's draws read every row a draft pass was asked for: on device rows that pass hands
    rows and draws back in one transfer (rows_to_host), so the draft runner of one image (whose
    KV runs move as block copies, no index sent) waits for the device exactly once per call; the
    tokens are those of host rows."""
    from specrt.runtime.tree_plan_file import TreePlan, write_plan

    pipe, _ = tiny_pipeline
    shape = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]  # fits max_window 16
    params = {"tree": "static", "static_tree": str(write_plan(tmp_path / "plan.json", TreePlan(shape, [0.6, 0.2, 0.1])))} \
        if tree == "static" else {"tree": "dynamic", "total_tokens": 10, "depth": 3, "tree_top_k": 3}
    expected = pipe.generate([6], method="sd", seed=5, **params).tokens
    runners = [pipe.target, pipe.draft]
    for runner in runners:
        runner.keep_rows_on_device, runner.host_numbers, runner.host_syncs = True, 0, 0
    try:
        result = pipe.generate([6], method="sd", seed=5, **params)
    finally:
        for runner in runners:
            runner.keep_rows_on_device = False
    np.testing.assert_array_equal(result.tokens, expected)
    assert pipe.draft.host_syncs == result.stats.draft_calls and not pipe.draft.rows_to_host


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_device_resident_trees_of_a_batch_are_verified_in_a_few_reads_a_round(tiny_pipeline, tree, tmp_path):
    """On device rows a batch's trees are read to the host in one transfer a round and verified there
    (verification.trees.verify_trees), so the target runner waits for the device a bounded number of
    times a round whatever the batch size. Same tokens."""
    pipe, _ = tiny_pipeline
    from specrt.runtime.tree_plan_file import TreePlan, write_plan

    shape = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]  # fits max_window 16
    params = {"tree": "static", "static_tree": str(write_plan(tmp_path / "plan.json", TreePlan(shape, [0.6, 0.2, 0.1])))} \
        if tree == "static" else {"tree": "dynamic", "total_tokens": 10, "depth": 3, "tree_top_k": 3}
    images, depth = [1, 2, 3, 4, 5, 6], 4 if tree == "static" else 3
    expected = pipe.generate(images, method="sd", seed=3, **params).tokens
    runners = [pipe.target, pipe.draft]
    for runner in runners:
        runner.keep_rows_on_device, runner.host_numbers, runner.host_syncs = True, 0, 0
    try:
        result = pipe.generate(images, method="sd", seed=3, **params)
    finally:
        for runner in runners:
            runner.keep_rows_on_device = False
    np.testing.assert_array_equal(result.tokens, expected)
    # a call's draws, its commit's index copy, the entries (index copy + read), a read per wave
    assert pipe.target.host_syncs <= result.stats.target_calls * (4 + depth), pipe.target.host_syncs


@pytest.mark.parametrize("method,params,bound", [("sjd", {"window": 8}, 3),
                                                 ("sjd-pac", {"window": 15, "branching": 3}, 10)])
def test_device_resident_jacobi_windows_of_a_batch_are_read_in_a_few_waves_a_step(tiny_pipeline, method, params, bound):
    """SJD's and SJD-PAC's windows on device rows are read to the host in one transfer a step and
    verified there (chain windows together, then each image's tree window and next proposal), so
    the target runner waits a bounded number of times a step whatever the batch size. Same tokens."""
    pipe, _ = tiny_pipeline
    images = [1, 2, 3, 4, 5, 6]
    expected = pipe.generate(images, method=method, seed=3, **params).tokens
    pipe.target.keep_rows_on_device, pipe.target.host_syncs = True, 0
    try:
        result = pipe.generate(images, method=method, seed=3, **params)
    finally:
        pipe.target.keep_rows_on_device = False
    np.testing.assert_array_equal(result.tokens, expected)
    assert pipe.target.host_syncs <= result.stats.target_calls * bound, pipe.target.host_syncs


@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 3}), ("cool-sd", {"relaxation_budget": 2}),
                                           ("lantern", {"tvd_budget": 0.3}), ("sjd", {"window": 8}),
                                           ("sjd-pac", {"window": 15, "branching": 3})])
def test_device_resident_rows_give_the_same_tokens_and_cross_o_w_plus_v(tiny_pipeline, method, params):
    """On a GPU the head's rows stay on the device (DeviceRows) and only what the host loop verifies
    crosses: the tested entries and a rejection's rows of a chain, a Jacobi window whole. Forced on
    CPU here: the tokens must not change, and the numbers read back must stay below the W·V of
    every forward a host-side softmax would move."""
    pipe, _ = tiny_pipeline
    expected = pipe.generate([3, 6], method=method, seed=5, **params).tokens
    runners = [pipe.target, pipe.draft]
    for runner in runners:
        runner.keep_rows_on_device, runner.host_numbers, runner.host_syncs = True, 0, 0
    try:
        result = pipe.generate([3, 6], method=method, seed=5, **params)
    finally:
        for runner in runners:
            runner.keep_rows_on_device = False
    np.testing.assert_array_equal(result.tokens, expected)
    stats, vocab = result.stats, pipe.target.spec.vocab_size
    window = {"ar": 1, "sd": 4, "cool-sd": 5, "lantern": 5}.get(method, params.get("window", 0) + 1)  # + pending
    reads = sum(runner.host_numbers for runner in runners)
    assert stats.host_numbers == reads and stats.summary()["host_bytes"] == 4 * reads  # what bench reports
    syncs = sum(runner.host_syncs for runner in runners)
    assert stats.host_syncs == syncs and stats.summary()["host_syncs"] == syncs
    if method in ("sd", "cool-sd", "lantern"):
        # the host loop over device rows: a draft call's draws and rows, then per target call its
        # draws, the tested entries and a rejection's rows (the device round, runtime/rounds, is
        # what waits once a round: tests/runtime/test_rounds.py)
        assert syncs <= 2 * stats.draft_calls + 3 * stats.target_calls, syncs
    if method in ("sjd", "sjd-pac"):  # a call's draws, then its window read whole
        assert syncs <= 2 * stats.target_calls, syncs
    full_rows = stats.target_forwards * window * vocab + stats.draft_forwards * 2 * vocab
    assert reads < full_rows, f"{reads} numbers read back; whole rows would be {full_rows}"


@pytest.mark.parametrize("sampling", [{"top_k": 8}, {"temperature": 0.0}, {"top_p": 0.7}, {"top_k": 20, "top_p": 0.8}],
                         ids=["top-k", "greedy", "top-p", "top-k-top-p"])
@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 3}), ("cool-sd", {"relaxation_budget": 2}),
                                           ("lantern", {"tvd_budget": 0.3}), ("sjd", {"window": 8}),
                                           ("sjd-pac", {"window": 15, "branching": 3}),
                                           ("sd", {"tree": "dynamic", "total_tokens": 10, "depth": 3, "tree_top_k": 3})])
def test_device_rows_are_restricted_where_they_live(tiny_pipeline, method, params, sampling):
    """Top-k (LlamaGen's default), top-p and greedy decoding restrict device rows on the device and
    draw there (runtime.decoding.Decoding._restricted): the tokens of host rows, and a chain's target rows
    are read back far less than whole (a host restriction reads W·V numbers a step; Jacobi windows
    and trees are read whole once a step, for the host loop's verification)."""
    pipe, _ = tiny_pipeline
    params = {**params, **sampling}
    expected = pipe.generate([3, 6], method=method, seed=5, **params).tokens
    runners = [pipe.target, pipe.draft]
    for runner in runners:
        runner.keep_rows_on_device, runner.host_numbers = True, 0
    try:
        result = pipe.generate([3, 6], method=method, seed=5, **params)
    finally:
        for runner in runners:
            runner.keep_rows_on_device = False
    np.testing.assert_array_equal(result.tokens, expected)
    window = {"ar": 1, "sd": 4, "cool-sd": 5, "lantern": 5}.get(method, params.get("window", 0) + 1)  # + pending
    window = params.get("total_tokens", window - 1) + 1
    whole_windows = result.stats.target_forwards * window * pipe.target.spec.vocab_size  # a host restriction's reads
    # the host loop's chains read the tested entries and a rejection's rows (this random tiny model
    # rejects most rounds)
    if method in ("sd", "cool-sd", "lantern") and "tree" not in params:
        assert pipe.target.host_numbers < 0.6 * whole_windows


def test_ar_decodes_a_batch_like_single_images(tiny_pipeline):
    pipe, _ = tiny_pipeline
    batch = pipe.generate([1, 5, 9], method="ar", seed=0, temperature=0.0).tokens
    for i, cls in enumerate([1, 5, 9]):
        np.testing.assert_array_equal(pipe.generate([cls], method="ar", seed=0, temperature=0.0).tokens[0], batch[i])


def test_user_errors_are_one_line_specrt_errors():
    target, draft, vq = toy_models(max_window=4)
    pipe = Pipeline(target, vq, draft, neighbours=None, sampling_defaults={"cfg_scale": 1.0})
    with pytest.raises(SpecrtError, match="out of range"):
        pipe.generate([5])
    with pytest.raises(SpecrtError, match="unknown method"):
        pipe.generate([0], method="eagle")
    with pytest.raises(SpecrtError, match="no parameter"):
        pipe.generate([0], method="sd", window=3)
    with pytest.raises(SpecrtError, match="feeds the target 9 tokens"):
        pipe.generate([0], method="sjd", window=8)
    with pytest.raises(SpecrtError, match="relaxation_budget"):
        pipe.generate([0], method="cool-sd", relaxation_budget=0.9)
    with pytest.raises(SpecrtError, match="neighbour table"):
        pipe.generate([0], method="lantern", draft_len=2)
    with pytest.raises(SpecrtError, match="needs a draft"):
        Pipeline(target, vq).generate([0], method="sd")


def test_missing_backend_is_a_user_error(monkeypatch, demo_bundle):
    import sys

    from specrt.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import now raises ImportError
    from specrt.runtime.backends.ort_backend import _ort

    with pytest.raises(MissingDependency, match="onnxruntime"):
        _ort()
    # a bundle's backend is named as `specrt generate --backend` names it; the error lists those names
    with pytest.raises(SpecrtError, match="choose one of ort, .*trt"):
        Pipeline.from_bundle(demo_bundle, backend="tensorrt")
