"""The continuous family's decode step: the MAR transformer over a static KV cache written in place.

What a machine without a GPU can prove: the PyTorch runner's step (kv_cache.StaticCache) and the
device round's (kv_cache.ColumnCache) give the concatenating step's z (the exported graphs' form)
to 1e-5 in fp32, through commits, rollbacks, dropped images and rejected drafts; no operation of
theirs joins or copies a cache-sized tensor; each layer runs a bounded number of compute operations
(each a kernel on a GPU); and torch.compile traces the step whole (fullgraph), as a captured
round needs.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.bench.step_ops import step_ops  # noqa: E402
from specrt.models.kv_cache import ColumnCache, StaticCache, call_layer  # noqa: E402
from specrt.models.mar.model import MARConfig, random_mar  # noqa: E402
from specrt.runtime.families.continuous.device_model import ContinuousDeviceModel  # noqa: E402
from specrt.runtime.families.continuous.runner import ContinuousRunner  # noqa: E402
from specrt.runtime.families.continuous.torch_runner import TorchContinuousRunner  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

# compute operations a layer of an eager decode step may run. Over the static cache: two layer
# norms, four linears, GELU, two residual adds, attention and the window's two writes (12); over the
# column cache the writes are index_put_s with their row/head indices (16). The concatenating step
# these replace ran 17, two of them copies of the whole cache.
STATIC_OPS_PER_LAYER = 12
COLUMN_OPS_PER_LAYER = 16
CONFIG = dict(token_dim=3, seq_len=9, dim=32, n_head=4, num_classes=5, input_norm=True)


def _mar(layers: int = 2):
    return random_mar(MARConfig(n_layer=layers, **CONFIG), seed=layers)


def _static_step(layers: int, rows: int = 2, width: int = 1, past: int = 5):
    """A decode step over a StaticCache whose committed columns hold random keys/values: (run, the
    concatenating step over the same past, the cache's committed columns)."""
    mar = _mar(layers)
    cfg, capacity = mar.cfg, mar.cfg.seq_len + 1
    kv = torch.randn(cfg.n_layer, 2, rows, cfg.n_head, capacity + width, cfg.head_dim)
    tokens = torch.randn(rows, width, cfg.token_dim)
    class_ids = torch.tensor([1, cfg.num_classes] * (rows // 2))
    positions = past + torch.arange(width).repeat(rows, 1)
    window = torch.ones(width, width, dtype=torch.bool).tril()
    mask = torch.zeros(rows, width, capacity + width, dtype=torch.bool)
    mask[:, :, :past] = True
    mask[:, :, capacity:] = window
    joined_mask = torch.cat([mask[:, :, :past], mask[:, :, capacity:]], dim=2)

    def run(run_layer=None):
        with torch.inference_mode():
            return mar.transformer.decode_step(tokens, class_ids, positions, mask, StaticCache(kv, capacity), run_layer)

    def concatenating():
        with torch.inference_mode():
            return mar.transformer.step(tokens, class_ids, positions, kv[:, 0, :, :, :past], kv[:, 1, :, :, :past],
                                        joined_mask)
    return run, concatenating, capacity


def _column_step(layers: int, rows: int = 2):
    mar = _mar(layers)
    cfg = mar.cfg
    columns = cfg.seq_len + 2
    kv = torch.randn(cfg.n_layer, 2, rows, cfg.n_head, columns, cfg.head_dim)
    tokens = torch.randn(rows, 1, cfg.token_dim)
    positions = torch.tensor([[4], [6]])
    mask = torch.arange(columns)[None, None, :] <= positions[:, :, None]

    def run():
        with torch.inference_mode():
            return mar.transformer.decode_step(tokens, torch.tensor([1, 2]), positions, mask,
                                               ColumnCache(kv, positions))
    return run, columns


def _ops_per_layer(make) -> float:
    """Compute operations a layer: the step's count at 4 layers less its count at 2, halved (what runs
    once a step, the input embedding and the final norm, cancels)."""
    counts = {}
    for layers in (2, 4):
        run = make(layers)[0]
        run()
        counts[layers] = step_ops(run, "cpu")
    return (counts[4] - counts[2]) / 2


def test_decode_steps_run_few_ops_a_layer():
    static = _ops_per_layer(_static_step)
    column = _ops_per_layer(_column_step)
    assert static <= STATIC_OPS_PER_LAYER, f"{static} ops a layer over the static cache"
    assert column <= COLUMN_OPS_PER_LAYER, f"{column} ops a layer over the column cache"


class _Copies(torch.overrides.TorchFunctionMode):
    """Records the shapes of what every joining or copying operation reads."""

    COPYING = {torch.cat: 0, torch.stack: 0, torch.Tensor.copy_: 1, torch.Tensor.clone: 0,
               torch.Tensor.contiguous: 0, torch.Tensor.index_put_: 2, torch.Tensor.scatter_: 3}

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.COPYING:
            read = args[self.COPYING[func]] if len(args) > self.COPYING[func] else None
            read = read if isinstance(read, (list, tuple)) else [read]
            self.shapes += [tuple(t.shape) for t in read if isinstance(t, torch.Tensor)]
        return func(*args, **(kwargs or {}))


def _copied_shapes(run) -> list:
    with _Copies() as copies:
        run()
    return copies.shapes


def test_decode_steps_copy_no_cache():
    run, concatenating, capacity = _static_step(layers=2, width=3, past=5)
    copied = _copied_shapes(run)
    assert copied, "the window's writes are copies: the check sees them"
    assert not [shape for shape in copied if len(shape) > 2 and shape[-2] >= capacity], copied
    assert any(len(shape) > 2 and shape[-2] == 5 for shape in _copied_shapes(concatenating))  # it catches a join
    run, columns = _column_step(layers=2)
    assert not [shape for shape in _copied_shapes(run) if len(shape) > 2 and shape[-2] == columns]


@pytest.mark.parametrize("width", [1, 3])
def test_static_step_gives_the_concatenating_steps_z(width):
    run, concatenating, _ = _static_step(layers=3, rows=4, width=width)
    z_joined, present_k, present_v = concatenating()
    z, present = run()
    torch.testing.assert_close(z, z_joined, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(present[:, 0], present_k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(present[:, 1], present_v, atol=1e-5, rtol=1e-5)


def test_decode_steps_compile_whole():
    """Each block traced whole as the runners run it (their `run_layer`), and the device round's
    window traced whole around them: what a captured round needs."""
    traced_block = torch.compile(call_layer, backend="aot_eager", fullgraph=True)
    run, _, _ = _static_step(layers=2, width=2)
    torch.testing.assert_close(run(traced_block)[0], run()[0], atol=1e-5, rtol=1e-5)

    mar = _mar()
    eager, traced = TorchContinuousRunner(mar), TorchContinuousRunner(mar)
    traced.run_layer = traced_block
    window = np.random.default_rng(1).standard_normal((3, mar.cfg.token_dim)).astype(np.float32)
    for runner in (eager, traced):
        runner.start([1, 4], cfg_scale=3.0)
    np.testing.assert_allclose(traced.step(window), eager.step(window), atol=1e-5, rtol=1e-5)

    models = [ContinuousDeviceModel(torch, mar, np.array([1, 4]), 3.0, mar.cfg.seq_len + 3, run_layer)
              for run_layer in (None, traced_block)]
    inputs, positions = torch.randn(2, 2, mar.cfg.token_dim), torch.tensor([[0, 1], [3, 4]])
    with torch.inference_mode():
        expected = models[0].window(inputs, positions)
        whole = torch.compile(models[1].window, backend="aot_eager", fullgraph=True)(inputs, positions)
    torch.testing.assert_close(whole, expected, atol=1e-5, rtol=1e-5)


class _ConcatenatingRunner(TorchContinuousRunner):
    """The same module with the runner's host cache passed in and handed back: the graphs' contract."""

    _new_cache = ContinuousRunner._new_cache
    _run_window = ContinuousRunner._run_window
    _write_rows = ContinuousRunner._write_rows
    _keep_rows = ContinuousRunner._keep_rows


def test_runner_over_the_static_cache_gives_the_concatenating_runners_z():
    """Ragged windows under CFG, commits of every kind, a rollback, a dropped image and a window wider
    than any before (the buffer's scratch widens): every step's z agrees."""
    mar = _mar(layers=2)
    static, joined = TorchContinuousRunner(mar), _ConcatenatingRunner(mar)
    rng = np.random.default_rng(0)
    window = lambda n: rng.standard_normal((n, mar.cfg.token_dim)).astype(np.float32)  # noqa: E731
    plan = [([window(1), window(1), window(1)], [1, 1, 1]), ([window(2), window(2), window(2)], [2, 2, 2]),
            ([window(3), None, window(1)], [1, 0, 1]), ("truncate", [2, 3, 2]), ([window(2), window(4), window(1)],
                                                                                  [2, 3, 0]),
            ("retain", [0, 2]), ([window(5), window(3)], [4, 3]), ([window(1), window(2)], [1, 1])]
    for runner in (static, joined):
        runner.start([1, 2, 4], cfg_scale=2.0)
    for action, counts in plan:
        if action == "truncate":
            for runner in (static, joined):
                runner.truncate(counts)
        elif action == "retain":
            for runner in (static, joined):
                runner.retain(counts)
        else:
            z = static.step(action)
            np.testing.assert_allclose(z, joined.step(action), atol=1e-5, rtol=1e-5)
            for runner in (static, joined):
                runner.commit(counts)
    np.testing.assert_array_equal(static.lengths, joined.lengths)
    assert static._kv.shape[4] >= static.capacity + 5


def test_device_window_gives_the_whole_sequences_z():
    """Windows at every position, drafts later overwritten, a repeated position (the catch-up pass
    at the first position) and images at different lengths: each slot's z is the z of its position
    in one causal pass over the whole sequence (the concatenating step over an empty cache)."""
    mar = _mar(layers=2)
    cfg, images = mar.cfg, 2
    class_ids = np.array([1, 3])
    model = ContinuousDeviceModel(torch, mar, class_ids, 2.0, cfg.seq_len + 4)
    inputs = torch.randn(images, cfg.seq_len + 1, cfg.token_dim)
    rows = torch.tensor([1, 3, cfg.num_classes, cfg.num_classes])
    with torch.inference_mode():
        past = mar.transformer.empty_cache(2 * images)
        whole = mar.transformer.step(inputs.repeat(2, 1, 1), rows, torch.arange(cfg.seq_len + 1), *past)[0]
        whole = whole.reshape(2, images, cfg.seq_len + 1, -1)

        def window(starts, width, feed=None):
            positions = torch.tensor(starts)[:, None] + torch.arange(width)
            fed = inputs.gather(1, positions[:, :, None].expand(-1, -1, cfg.token_dim)) if feed is None else feed
            z = model.window(fed, positions)
            if feed is None:
                expected = whole.gather(2, positions[None, :, :, None].expand(2, -1, -1, whole.shape[-1]))
                torch.testing.assert_close(z, expected, atol=1e-5, rtol=1e-5)

        catch_up = torch.tensor([[0, 0], [0, 0]])
        torch.testing.assert_close(model.window(inputs[:, :1].repeat(1, 2, 1), catch_up),
                                   whole[:, :, :1].repeat(1, 1, 2, 1), atol=1e-5, rtol=1e-5)
        window([1, 1], 2)
        window([3, 3], 3, feed=torch.randn(images, 3, cfg.token_dim))  # drafts a later round rejects
        window([3, 3], 1)
        window([4, 4], 3)
        window([7, 5], 2)  # image 1 rejected its last drafts, image 0 went on
        window([9, 7], 1)
