"""The skinny-row matrix product (models/skinny_matmul.py) and LlamaGen's fused feed-forward product.

The Triton kernel runs here under TRITON_INTERPRET=1 (a CPU executes it program by program, in
float16: the interpreter has no bfloat16 arithmetic; in a process of its own, conftest's
`interpreted`); the CUDA test at the end runs it compiled on a GPU, in bfloat16, against cuBLAS. The operator's CPU kernel is the torch reference, which is what
lets a compiled block with the operator trace and run on a machine without a GPU."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from specrt.models import skinny_matmul  # noqa: E402
from specrt.models.kv_cache import call_layer  # noqa: E402
from specrt.models.llamagen_gpt import GPT, gpt_config  # noqa: E402
from specrt.models.step_setup import fuse_projections, set_step_matmuls  # noqa: E402
from specrt.models.skinny_matmul import LaunchPlan, launch_plan, triton_partials  # noqa: E402
from kernel_cases import SHAPES  # noqa: E402

@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_the_kernel_computes_each_splits_partial_products(interpreted, case):
    rows, columns, _, plan = SHAPES[case]
    result = interpreted["matmuls"][case]
    assert result["shape"] == [plan.splits, rows, columns] and result["dtype"] == "torch.float32"
    # each plane is its K range's product: float32 sums of float16 inputs, only their order differs
    assert result["planes_error"] < 1e-4
    assert result["sum_error"] < 1e-3


def test_a_plan_that_leaves_out_part_of_k_is_caught(interpreted):
    """Planted bug: the K range each split covers cut short by one block (the tail of every range
    never read). The bound the cases above meet must fail on it."""
    assert interpreted["planted"]["matmul_right"] < 1e-3
    assert interpreted["planted"]["matmul_planted"] > 1.0


def test_more_rows_than_the_tile_are_refused_by_the_kernel():
    with pytest.raises(ValueError, match="at most 16 rows"):
        triton_partials(torch.zeros(17, 8).half(), torch.zeros(8, 8).half(), LaunchPlan(16, 16, 1))


def test_launch_plans_cover_k_with_no_empty_split_and_fill_the_gpu():
    for columns in (16, 1280, 3840, 6912):
        for depth in range(1, 5000, 97):
            plan = launch_plan(columns, depth, multiprocessors=132)
            chunk = plan.chunk(depth)
            assert chunk % plan.block_k == 0
            assert (plan.splits - 1) * chunk < depth <= plan.splits * chunk  # each split has some of K
    # GPT-XL's products on an H100's 132 SMs: cuBLAS ran them as 20-60 tiles; here every SM gets one
    # program at least (the 1 280 x 1 280 product is held to 5 splits by its K: two blocks a program)
    for columns, depth in ((3840, 1280), (1280, 1280), (6912, 1280), (1280, 3456)):
        assert launch_plan(columns, depth, 132).programs(columns) >= 132
    assert launch_plan(1280, 3456, 132).programs(1280) >= 2 * 132  # w2: the longest K, the most splits


def test_products_too_wide_or_in_float32_take_the_ordinary_matmul():
    weight = torch.randn(8, 4).half()
    assert skinny_matmul.fits(torch.randn(2, 3, 4).half(), weight)
    assert not skinny_matmul.fits(torch.randn(17, 4).half(), weight)  # a prefill's rows
    assert not skinny_matmul.fits(torch.randn(2, 4), weight.float())  # Triton's dot would round float32 to tf32
    x = torch.randn(3, 4)
    torch.testing.assert_close(skinny_matmul.skinny_linear(x, weight.float()), x @ weight.float().T)


def test_a_bias_joins_the_float32_sum_before_the_one_cast():
    """The unified-vocabulary LM's projections may carry a bias: the skinny product adds it to the
    float32 sum of the planes, then casts once, so it lands within one half-precision rounding of
    F.linear in float32; a bias left out (the planted bug) misses by the bias itself."""
    torch.manual_seed(1)
    x, weight, bias = torch.randn(2, 1, 64).half(), torch.randn(48, 64).half(), 4 + torch.randn(48).half()
    exact = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    out = skinny_matmul.skinny_linear(x, weight, bias)
    assert out.dtype == torch.float16 and out.shape == (2, 1, 48)
    torch.testing.assert_close(out.float(), exact, rtol=2e-3, atol=2e-2)
    without = skinny_matmul.skinny_linear(x, weight)
    assert (without.float() - exact).abs().min() > 1.0


def _block_and_inputs(dtype):
    torch.manual_seed(0)
    config = gpt_config("GPT-B")
    config.n_layer = 2
    model = GPT(config).eval().to(dtype)
    rows, past_len = 2, 7
    x = torch.randn(rows, 1, config.dim, dtype=dtype)
    cos = torch.randn(rows, 1, config.head_dim // 2)
    sin = torch.randn(rows, 1, config.head_dim // 2)
    past = torch.randn(rows, config.n_kv_head, past_len, config.head_dim, dtype=dtype)
    mask = torch.ones(rows, 1, 1, past_len + 1, dtype=torch.bool)
    return model, (x, cos, sin, past, past, mask)


def test_a_compiled_block_with_the_skinny_operator_traces_whole_and_calls_it(monkeypatch):
    """fullgraph=True: a graph break here would be a step the GPU's CUDA graph cannot hold. The
    operator's CPU kernel counts its calls: one per product (qkv, wo, gate-up, w2)."""
    model, args = _block_and_inputs(torch.bfloat16)
    block = model.layers[0]
    with torch.inference_mode():
        reference = block(*args)[0].float()
        calls = []
        kernel = skinny_matmul.reference_partials
        monkeypatch.setattr(skinny_matmul, "reference_partials", lambda *a: calls.append(1) or kernel(*a))
        set_step_matmuls(model, "skinny")
        compiled = torch.compile(call_layer, fullgraph=True)
        out = compiled(block, *args)[0].float()
    assert len(calls) == 4
    # bfloat16 rounding of a block's output (scale ~3): sums in another order, then one cast
    torch.testing.assert_close(out, reference, rtol=0.02, atol=0.05)


def test_fused_gate_up_gives_the_same_block_and_keeps_the_checkpoint():
    model, args = _block_and_inputs(torch.float32)
    with torch.inference_mode():
        apart = model.layers[0](*args)[0]
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert fuse_projections(model) == 2
    feed_forward = model.layers[0].feed_forward
    assert feed_forward.w1.weight.data_ptr() == feed_forward.gate_up.data_ptr()  # views, no second copy
    with torch.inference_mode():
        fused = model.layers[0](*args)[0]
    torch.testing.assert_close(fused, apart, rtol=1e-5, atol=1e-5)
    after = model.state_dict()
    assert after.keys() == before.keys()  # LlamaGen's keys, no gate_up among them
    assert all(torch.equal(after[name], before[name]) for name in before)
    changed = {name: tensor + 1 if "w3" in name else tensor for name, tensor in before.items()}
    model.load_state_dict(changed)  # writes through the views into the fused buffer
    assert torch.equal(feed_forward.gate_up[feed_forward.w1.out_features:], changed["layers.0.feed_forward.w3.weight"])
    with torch.inference_mode():
        fused_changed = model.layers[0](*args)[0]
        set_step_matmuls(model, "separate")
        assert feed_forward.gate_up is None
        apart_changed = model.layers[0](*args)[0]  # w1 and w3 apart again, reading the changed halves
    assert not torch.allclose(fused_changed, fused)
    torch.testing.assert_close(apart_changed, fused_changed, rtol=1e-5, atol=1e-5)


def test_a_fused_model_still_trains_its_w1_and_w3():
    """With gradients on, the feed-forward runs w1 and w3 apart (their halves of the fused buffer),
    so a backward pass reaches both parameters."""
    model, args = _block_and_inputs(torch.float32)
    fuse_projections(model)
    model.layers[0](*args)[0].sum().backward()
    feed_forward = model.layers[0].feed_forward
    assert feed_forward.w1.weight.grad is not None and feed_forward.w3.weight.grad is not None
    assert feed_forward.w1.weight.grad.abs().sum() > 0 and feed_forward.w3.weight.grad.abs().sum() > 0


def test_unknown_step_matmuls_are_refused():
    model, _ = _block_and_inputs(torch.float32)
    with pytest.raises(ValueError, match="choose from separate, fused, skinny"):
        set_step_matmuls(model, "cutlass")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 2, 16])
def test_on_cuda_the_kernel_matches_cublas_in_bfloat16(rows):
    pytest.importorskip("triton")
    torch.manual_seed(rows)
    for columns, depth in ((3840, 1280), (1280, 1280), (6912, 1280), (1280, 3456)):  # GPT-XL's block products
        x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
        weight = torch.randn(columns, depth, device="cuda", dtype=torch.bfloat16) / depth ** 0.5
        out = skinny_matmul.skinny_linear(x, weight)
        exact = x.double() @ weight.double().T
        # one bfloat16 rounding of the float32 sum, as cuBLAS's own result has
        torch.testing.assert_close(out.double(), exact, rtol=0.01, atol=0.02)
        torch.testing.assert_close(out, torch.nn.functional.linear(x, weight), rtol=0.01, atol=0.02)
