"""TrtRunner's device-side bookkeeping with CUDA replayed on host memory (no GPU needed).

The strided-copy arithmetic of the KV commit (pitches, runs of consecutive slots), the
sampling head's double-buffered outputs and DeviceProbs' reads are the parts of the TensorRT
backend that can be wrong silently; here cudaMemcpy*Async are ctypes.memmove over numpy
arrays, the engines are fakes that write known values, and the results must equal the
contract (docs/contracts.md: KV commit formula; outputs valid until the second next step).
"""
import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from specrt.engines.trt_runner import DeviceProbs, KVLayout, TrtRunner, tree_fits
from specrt.runtime.conditions import Conditions
from specrt.runtime.runner import ModelSpec
from specrt.runtime.tree import StaticShape
from specrt.runtime.tree_call import TreeLayout


class HostCudart:
    """The few cuda-python calls TrtRunner makes, performed on host pointers."""

    cudaMemcpyKind = SimpleNamespace(cudaMemcpyDeviceToDevice="d2d", cudaMemcpyDeviceToHost="d2h")

    def __init__(self):
        self.calls = 0

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cudaStreamSynchronize(self, stream):
        return (0,)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert kind == "d2d" and width <= dpitch and width <= spitch
        for row in range(height):
            ctypes.memmove(dst + row * dpitch, src + row * spitch, width)
        self.calls += 1
        return (0,)


def _runner(kv, layout, batch, capacity, cudart):
    runner = object.__new__(TrtRunner)  # no engines: only the copy path is exercised
    runner.kv_layout, runner.batch, runner.capacity, runner.cudart = layout, batch, capacity, cudart
    runner._kv = SimpleNamespace(ptr=kv.ctypes.data)
    runner.step_engine = SimpleNamespace(dtypes={"past_kv": kv.dtype})
    runner.prefill_engine = SimpleNamespace(stream=None)
    return runner


def _kv_and_present(batch, capacity, window):
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((2, 2, batch, 3, capacity, 4)).astype(np.float32)
    present = rng.standard_normal((2, 2, batch, 3, window, 4)).astype(np.float32)
    return kv, present


def _commit(kv, present, batch, capacity, rows, columns, slots):
    cudart = HostCudart()
    runner = _runner(kv, KVLayout(n_layer=2, n_kv_head=3, head_dim=4), batch, capacity, cudart)
    runner.step_engine.addresses = {"present_kv": present.ctypes.data}
    runner._last_window = present.shape[4]
    runner._write_kv(np.asarray(rows), np.asarray(columns), np.asarray(slots))
    return cudart.calls


@pytest.mark.parametrize("slots, start, expected_copies", [
    ([0, 1, 2], 4, 1), ([0, 2, 3, 5], 7, 3), ([4], 0, 1), ([1, 0], 3, 2)])
def test_commits_alike_in_every_row_are_one_strided_copy_per_run(slots, start, expected_copies):
    batch, capacity, window = 2, 12, 6
    kv, present = _kv_and_present(batch, capacity, window)
    expected = kv.copy()
    expected[:, :, :, :, start:start + len(slots)] = present[:, :, :, :, slots]
    columns = np.arange(start, start + len(slots))
    calls = _commit(kv, present, batch, capacity, np.repeat(np.arange(batch), len(slots)),
                    np.tile(columns, batch), np.tile(slots, batch))
    np.testing.assert_array_equal(kv, expected)
    assert calls == expected_copies


def test_ragged_commits_copy_each_row_its_own_slots_to_its_own_columns():
    """Batched decoding: each image commits its own accepted slots at its own length."""
    batch, capacity, window = 3, 12, 5
    kv, present = _kv_and_present(batch, capacity, window)
    commits = {0: ([0, 1, 2], 4), 1: ([0, 3], 9), 2: ([], 0)}  # row: (slots, first column)
    expected = kv.copy()
    rows, columns, slots = [], [], []
    for row, (row_slots, start) in commits.items():
        expected[:, :, row][..., start:start + len(row_slots), :] = present[:, :, row][..., row_slots, :]
        rows += [row] * len(row_slots)
        columns += list(range(start, start + len(row_slots)))
        slots += row_slots
    calls = _commit(kv, present, batch, capacity, rows, columns, slots)
    np.testing.assert_array_equal(kv, expected)
    assert calls == (1 + 2) * 2 * 2  # runs per row × (layers × k/v): one copy over the heads each


def test_retain_moves_the_kept_rows_to_the_front_in_place(monkeypatch):
    """Finished images leave the batch: the kept rows' caches move to the front, in order, over
    the columns in use (committed + staged rows of the kept images), in place: no scratch buffer
    is allocated, and a row already in place is not copied. Fails when a copy overwrites a row
    still to be read (any order but ascending) or the columns in use are cut short."""
    batch, capacity = 4, 6
    kv, _ = _kv_and_present(batch, capacity, 1)
    before = kv.copy()

    def no_scratch(nbytes):
        raise AssertionError("retain allocated a scratch buffer")

    monkeypatch.setattr("specrt.engines.trt_runner.DeviceBuffer", no_scratch)
    cudart = HostCudart()
    runner = _runner(kv, KVLayout(n_layer=2, n_kv_head=3, head_dim=4), batch, capacity, cudart)
    keep = np.array([0, 1, 3])  # increasing, as ModelRunner.retain hands them on
    runner.lengths, runner.staged = np.array([2, 1, 3]), np.array([0, 2, 0])  # the kept images', as retain sets them
    runner._retain(keep)
    used = 3  # the longest committed + staged: image 3's 3 rows, image 1's 1 + 2
    moved = kv.reshape(-1)[: before[:, :, keep].size].reshape(2, 2, len(keep), 3, capacity, 4)
    np.testing.assert_array_equal(moved[..., :used, :], before[:, :, keep, :, :used, :])
    assert cudart.calls == 2 * 2 * len(keep) - 2  # (layer, k/v) × kept rows, but rows 0 and 1 of block 0 stay


# ---- the sampling head's outputs ------------------------------------------------------


class HostBuffer:
    """A DeviceBuffer stand-in: `ptr` is the address of a numpy array kept alive here."""

    def __init__(self, nbytes: int):
        self.array = np.zeros(nbytes, dtype=np.uint8)
        self.ptr = self.array.ctypes.data


class FakeHeadEngine:
    """Writes probs = run number + position / 1000 and draws = run number into whatever
    `probs` / `draws` are bound to, like an engine's head would; records the inputs."""

    dtypes = {"probs": np.dtype(np.float32), "draws": np.dtype(np.int32), "past_kv": np.dtype(np.float32)}
    stream = None

    def __init__(self, vocab: int, counter: list):
        self.vocab, self.counter, self.addresses, self.inputs = vocab, counter, {}, []

    def bind(self, name, ptr):
        self.addresses[name] = ptr

    def run(self, inputs, device_shapes=None):
        self.counter[0] += 1
        self.inputs.append({k: np.array(v) for k, v in inputs.items()})
        images, window = inputs["uniforms"].shape
        probs = (self.counter[0] + np.arange(images * window * self.vocab) / 1000).astype(np.float32)
        draws = np.full(images * window, self.counter[0], dtype=np.int32)
        ctypes.memmove(self.addresses["probs"], probs.ctypes.data, probs.nbytes)
        ctypes.memmove(self.addresses["draws"], draws.ctypes.data, draws.nbytes)
        self.shape = (images, window)

    def fetch(self, name, out):
        count = int(np.prod(self.shape))
        view = out.reshape(-1)[:count].reshape(self.shape)
        ctypes.memmove(view.ctypes.data, self.addresses[name], view.nbytes)
        return view


def _head_runner(images=2, batch=4, vocab=5, max_window=3):
    runner = object.__new__(TrtRunner)  # no TensorRT: fake engines, host "device" memory
    runner.spec, runner.max_window, runner.batch, runner.capacity = ModelSpec(vocab, 2, 3), max_window, batch, 8
    runner.mix = np.arange(images * batch, dtype=np.float32).reshape(images, batch)
    counter = [0]
    runner.prefill_engine, runner.step_engine = FakeHeadEngine(vocab, counter), FakeHeadEngine(vocab, counter)
    runner.cudart, runner.host_numbers, runner._parity = HostCudart(), 0, 0
    runner.kv_layout = KVLayout(1, 1, 1)
    rows = images * max_window
    runner._probs = [HostBuffer(rows * vocab * 4) for _ in range(2)]
    runner._draws = [HostBuffer(rows * 4) for _ in range(2)]
    runner._draws_host = [np.zeros(rows, np.int32) for _ in range(2)]
    return runner


def _step(runner, window):
    ids = np.zeros((runner.batch, window), np.int32)
    mask = np.zeros((runner.batch, window, runner.capacity + window), bool)
    return runner._step(ids, ids, mask, np.full((runner.images, window), 0.25, np.float32))


def test_step_outputs_alternate_buffers_and_outlive_the_next_step():
    runner = _head_runner()
    first = _step(runner, 3)
    second = _step(runner, 2)
    assert first.probs.shape == (2, 3, 5) and second.probs.shape == (2, 2, 5)
    assert (first.draws == 1).all() and (second.draws == 2).all()  # the first step's draws survive the second
    assert first.probs[0, 0, 0] == 1.0 and second.probs[1, 1, 4] == pytest.approx(2 + (1 * 2 * 5 + 1 * 5 + 4) / 1000)
    np.testing.assert_allclose(np.asarray(first.probs), 1 + np.arange(30).reshape(2, 3, 5) / 1000, rtol=1e-6)
    third = _step(runner, 1)  # the second next step reuses the first step's buffers
    assert (first.draws[0, :1] == 3).all() and third.draws.shape == (2, 1)
    assert second.probs[0, 0, 0] == 2.0  # the previous step's output is still intact
    # the head got the runner's mix and the step's uniforms
    fed = runner.step_engine.inputs[0]
    np.testing.assert_array_equal(fed["mix"], runner.mix)
    assert fed["uniforms"].shape == (2, 3)


def test_prefill_output_shares_the_alternation():
    runner = _head_runner()
    runner._copy_block = lambda *args: None  # KV rows are tested above
    runner.prefill_engine.addresses["present_kv"] = 0
    prefill = runner._prefill(Conditions.of_classes(np.arange(4)), np.full((2, 1), 0.5, np.float32))
    step = _step(runner, 2)
    assert prefill.probs.shape == (2, 1, 5) and (prefill.draws == 1).all() and (step.draws == 2).all()
    assert prefill.probs[1, 0, 2] == pytest.approx(1 + 7 / 1000)
    np.testing.assert_array_equal(runner.prefill_engine.inputs[0]["class_ids"], np.arange(4))


def test_device_probs_read_only_what_is_indexed():
    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    reads = []

    def read(offset, count):
        reads.append(count)
        return data.reshape(-1)[offset:offset + count].copy()

    probs = DeviceProbs(read, data.shape)
    row = probs[1, -1]
    assert isinstance(row, DeviceProbs) and row.shape == (4,) and reads == []  # narrowing reads nothing
    assert row[2] == data[1, 2, 2] and reads == [1]
    assert probs[0][1][3] == data[0, 1, 3] and probs[-1, 0, -1] == data[1, 0, 3]
    np.testing.assert_array_equal(row[np.array([3, 0])], data[1, 2, [3, 0]])
    np.testing.assert_array_equal(np.asarray(probs[0]), data[0])
    np.testing.assert_array_equal(probs[:, 1], data[:, 1])  # anything else: the view, on the host
    kept = probs[0, 1].copy()
    data[0, 1] = -1  # the device buffer is reused ...
    np.testing.assert_array_equal(kept, [4, 5, 6, 7])  # ... the copy is the host's
    assert len(probs) == 2 and probs.ndim == 3 and probs[1].size == 12
    with pytest.raises(IndexError):
        probs[2]


# ---- a draft chain engine (runtime/chain.py) ------------------------------------------


def test_a_chain_runs_its_engine_and_its_present_rows_are_what_commits_copy():
    """The chain engine gets the window, `last` and L uniforms per image and answers [I, L, V];
    the commit that follows copies from the chain's present rows (window + L − 1 slots), and a
    later step's commit from the step's again."""
    runner = _head_runner(images=2, batch=4, vocab=5, max_window=4)
    runner.chain_engine, runner.chain_steps = FakeHeadEngine(5, [10]), 3
    assert runner.can_chain(3) and not runner.can_chain(2)
    ids = np.zeros((4, 2), np.int32)
    mask = np.zeros((4, 2, runner.capacity + 2), bool)
    out = runner._chain(ids, ids, mask, np.array([1, 0], np.int32), np.full((2, 3), 0.5, np.float32))
    assert out.probs.shape == (2, 3, 5) and (out.draws == 11).all()
    fed = runner.chain_engine.inputs[0]
    np.testing.assert_array_equal(fed["last"], [1, 0])
    assert fed["uniforms"].shape == (2, 3) and runner.step_engine.inputs == []
    assert runner._present_engine is runner.chain_engine and runner._last_window == 2 + 3 - 1
    _step(runner, 2)
    assert runner._present_engine is runner.step_engine and runner._last_window == 2

    batch, capacity, window = 4, 9, 4
    kv, present = _kv_and_present(batch, capacity, window)
    expected = kv.copy()
    expected[..., 5:9, :] = present[..., 0:4, :]  # window slots 0, 1 and drafts 1, 2 after length 5
    copier = _runner(kv, KVLayout(n_layer=2, n_kv_head=3, head_dim=4), batch, capacity, HostCudart())
    copier.step_engine.addresses = {"present_kv": 0}  # never read after a chain
    copier._present_engine = SimpleNamespace(addresses={"present_kv": present.ctypes.data})
    copier._last_window = window
    rows = np.repeat(np.arange(batch), 4)
    copier._write_kv(rows, np.tile(np.arange(5, 9), batch), np.tile(np.arange(4), batch))
    np.testing.assert_array_equal(kv, expected)


# ---- a static-tree engine (runtime/chain.py DraftTree) ----------------------------------


def test_a_static_tree_runs_its_engine_and_its_present_rows_are_what_commits_copy():
    """The tree engine gets the window, `last` and one uniform per drafted node of each image and
    answers the inner nodes' rows [I, inner, V] and every node's draw; the next commit (and stage)
    copies from its present rows (window + fed nodes), a later step's from the step's again. Only
    the engine's own tree is drafted in one call."""
    layout = TreeLayout(StaticShape([[0], [1], [0, 0], [0, 1]]))  # root → 2 children, the first → 2
    runner = _head_runner(images=2, batch=4, vocab=5, max_window=5)
    runner.tree_engine, runner.tree_layout = FakeHeadEngine(5, [20]), layout
    assert runner.can_draft_tree(layout) and not runner.can_draft_tree(TreeLayout(StaticShape([[0], [1]])))
    ids = np.zeros((4, 2), np.int32)
    mask = np.zeros((4, 2, runner.capacity + 2), bool)
    out = runner._draft_tree(ids, ids, mask, np.array([1, 0], np.int32), layout, np.full((2, 4), 0.5, np.float32))
    assert out.probs.shape == (2, len(layout.inner), 5) == (2, 2, 5)
    assert out.draws.shape == (2, 4) and (out.draws == 21).all()
    fed = runner.tree_engine.inputs[0]
    np.testing.assert_array_equal(fed["last"], [1, 0])
    assert fed["uniforms"].shape == (2, 4) and runner.step_engine.inputs == []
    assert runner._present_engine is runner.tree_engine and runner._last_window == 2 + len(layout.fed) == 3
    _step(runner, 2)
    assert runner._present_engine is runner.step_engine and runner._last_window == 2


def test_a_tree_engine_is_used_only_where_its_tree_fits_the_window():
    """A runner opened with a smaller --max-window than the tree needs drafts it level by level."""
    layout = TreeLayout(StaticShape([[0], [1], [0, 0], [0, 1]]))  # 4 drafts, 1 fed node
    assert tree_fits(layout, 4) and tree_fits(layout, 64)
    assert not tree_fits(layout, 3)  # 4 drafts: more than a call of 3 slots draws (ModelRunner.draft_tree)
    deep = TreeLayout(StaticShape([[0], [0, 0], [0, 0, 0]]))  # a chain of 3: 2 fed nodes
    assert tree_fits(deep, 3) and not tree_fits(deep, 2)
