"""The PyTorch backend's decode step: over a static KV cache written in place, compiled by torch.compile.

What a machine without a GPU can prove: the compiled step gives the eager step's tokens (fp32),
the step no longer concatenates its cache, and the compiled block runs few operations a layer
(each a GPU kernel on CUDA, where their count sets the step's time).
"""
import numpy as np
import pytest
import torch

from specrt.bench.step_ops import profile_generated_kernels, step_ops
from specrt.models.kv_cache import StaticCache
from specrt.models.llamagen_gpt import GPT, GPTConfig
from specrt.runtime.backends.compiled_step import CompiledStep
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

# at most this many compute operations a layer in a compiled decode step (an eager one runs ~50)
COMPILED_OPS_PER_LAYER = 15


def _model_and_step(layers: int = 4):
    torch.manual_seed(0)
    model = GPT(GPTConfig(dim=64, n_layer=layers, n_head=4, vocab_size=128, num_classes=10, grid_size=4)).eval()
    config = model.config
    rows, width, capacity = 2, 1, config.seq_len + 4
    kv = torch.randn(config.n_layer, 2, rows, config.n_kv_head, capacity + 4, config.head_dim)
    ids = torch.zeros(rows, width, dtype=torch.int64)
    positions = torch.full((rows, width), 5)
    mask = torch.zeros(rows, width, capacity + width, dtype=torch.bool)
    mask[:, :, :5] = True
    mask[:, :, capacity:] = True
    return model, (ids, positions, mask), kv, capacity


def test_compiled_decode_step_runs_few_ops_a_layer_and_no_cache_copy():
    model, (ids, positions, mask), kv, capacity = _model_and_step()
    profile_generated_kernels()
    compiled = CompiledStep()

    def step(run_layer):
        def run():
            with torch.inference_mode():
                return model.step(ids, positions, mask, StaticCache(kv, capacity), run_layer)
        return run

    eager, fused = step(None), step(compiled.run_layer)
    expected = eager()
    actual = fused()  # compiles
    torch.testing.assert_close(actual[0], expected[0], atol=1e-5, rtol=1e-5)
    layers = model.config.n_layer
    eager_ops, compiled_ops = step_ops(eager, "cpu"), step_ops(fused, "cpu")
    assert compiled_ops <= COMPILED_OPS_PER_LAYER * layers, f"{compiled_ops / layers:.1f} ops a layer compiled"
    assert eager_ops > 2 * compiled_ops  # fusion happened: eager runs every small op by itself
    assert compiled.compiled_shapes == 1 and compiled.compile_seconds > 0  # one block, shared by every layer

    joined = _joined_shapes(eager)
    assert joined  # RoPE stacks its rotated pairs: the check sees joins
    cache_sized = [shape for shape in joined if capacity in shape]
    assert not cache_sized, f"the cache was joined, not written in place: {cache_sized}"
    past = kv[:, :, :, :, :capacity]  # the exported graphs' form, which joins: what the check catches
    with torch.inference_mode():
        assert any(capacity in shape for shape in _joined_shapes(lambda: model.step(ids, positions, mask, past)))


class _Joins(torch.overrides.TorchFunctionMode):
    """Records the shape of every tensor passed to torch.cat / torch.stack."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.cat, torch.stack):
            self.shapes += [tuple(t.shape) for t in args[0]]
        return func(*args, **(kwargs or {}))


def _joined_shapes(run) -> list:
    with _Joins() as joins:
        run()
    return joins.shapes


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_compiled_pipeline_gives_the_eager_tokens(method):
    from specrt.export.demo import load_demo
    from specrt.runtime.pipeline import Pipeline

    demo = load_demo()
    tokens = {}
    for compile_step in (False, True):
        pipe = Pipeline.from_torch(demo.target, demo.draft, demo.vq, compile=compile_step)
        assert (pipe.target.compiled is not None) == compile_step
        tokens[compile_step] = np.asarray(pipe.generate([1, 6], method=method, seed=11, decode=False).tokens)
    np.testing.assert_array_equal(tokens[True], tokens[False])


def test_unknown_compile_mode_is_refused():
    with pytest.raises(ValueError, match="compile mode"):
        CompiledStep("fastest")


@pytest.mark.parametrize("cache", ["static", "column"])
def test_compiled_cache_writes_allocate_no_cache_sized_buffer(cache):
    """The compiled block writes the window's keys/values into the cache where it lies: inductor's code
    allocates no buffer the size of a layer's cache. (A scatter_ into the cache, the device round's
    first ColumnCache, became a copy of the whole cache every layer; its index_put_ does not.)"""
    from torch._inductor.utils import run_and_get_code

    from specrt.models.kv_cache import ColumnCache

    model, (ids, positions, mask), kv, capacity = _model_and_step(layers=2)
    step = CompiledStep("default")
    if cache == "column":
        columns = torch.tensor([[5], [7]])
        layer_cache = ColumnCache(kv, columns)
        mask = torch.arange(kv.shape[4])[None, None, :] <= columns[:, :, None]
        positions = columns
    else:
        layer_cache = StaticCache(kv, capacity)
    with torch.inference_mode():
        _, code = run_and_get_code(lambda: model.step(ids, positions, mask, layer_cache, step.run_layer))
    layer_shape = "(" + ", ".join(str(size) for size in kv.shape[2:]) + ")"
    assert code and all(f"empty_strided_cpu({layer_shape}" not in text for text in code), layer_shape
