"""A decode step's attention over the static KV cache through specrt's split-cache Triton kernel
(models/window_attention.py).

The kernel runs under TRITON_INTERPRET=1 in float16 (conftest's `interpreted`: a process of its
own); the CUDA test at the end runs it compiled in bfloat16 against scaled_dot_product_attention.
The operator's CPU kernel is the torch reference, so a compiled block with it traces whole here."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from specrt.models import window_attention  # noqa: E402
from specrt.models.kv_cache import CacheWrite, additive_mask, attend, call_layer  # noqa: E402
from specrt.models.llamagen_gpt import GPT, gpt_config  # noqa: E402
from specrt.models.step_setup import set_step_attention  # noqa: E402
from kernel_cases import ATTENTION_CASES  # noqa: E402


@pytest.mark.parametrize("case", range(len(ATTENTION_CASES)), ids=[str(case) for case in ATTENTION_CASES])
def test_each_split_and_the_joined_output_match_attention(interpreted, case):
    batch, heads, _, width, _, dim, splits = ATTENTION_CASES[case]
    result = interpreted["attention"][case]
    assert result["shapes"] == [[splits, batch, heads, width, dim], [splits, batch, heads, width],
                                [splits, batch, heads, width]]
    # the unnormalised output multiplies float16 probabilities by the values (sums of ~100 terms of
    # size ~1: a few 1e-3); the maxima and the sums of exponentials are float32 throughout
    acc_error, max_error, total_error = result["partial_errors"]
    assert acc_error < 5e-3 and max_error < 1e-5 and total_error < 1e-4
    assert result["output_error"] < 1e-3  # against float32 scaled_dot_product_attention


def test_splits_that_skip_cache_columns_are_caught(interpreted):
    """Planted bug: each split of the cache cut short by one block of columns (keys never read)."""
    assert interpreted["planted"]["attention_right"] < 1e-3
    assert interpreted["planted"]["attention_planted"] > 0.05


def test_the_torch_reference_joins_to_attention_and_splits_cover_the_cache():
    batch, heads, kv_heads, width, columns, dim = 2, 4, 2, 3, 150, 16
    q = torch.randn(batch, heads, width, dim)
    keys, values = torch.randn(2, batch, kv_heads, columns, dim)
    hidden = torch.rand(batch, 1, width, columns) < 0.6
    hidden[..., :64] = True  # the first split hidden from every row: its maximum stays finite, its weight 0
    hidden[..., -width:] = ~torch.ones(width, width, dtype=torch.bool).tril()
    mask = torch.zeros(batch, 1, width, columns).masked_fill(hidden, float("-inf"))
    exact = torch.nn.functional.scaled_dot_product_attention(q, keys.repeat_interleave(2, 1),
                                                             values.repeat_interleave(2, 1), attn_mask=mask)
    for splits in (1, 2, 3):
        joined = window_attention.combine_splits(*window_attention.reference_partials(q, keys, values, mask, splits))
        assert torch.isfinite(joined).all()
        torch.testing.assert_close(joined, exact, rtol=1e-5, atol=1e-5)
    for columns in range(1, 2000, 37):
        for programs in (2, 40, 400):
            splits = window_attention.split_count(programs, columns, 132)
            chunk = window_attention.split_chunk(columns, splits)
            assert chunk % window_attention.BLOCK_COLUMNS == 0
            assert (splits - 1) * chunk < columns <= splits * chunk  # every split has columns


def test_attend_takes_the_kernel_only_for_a_static_cache_with_few_half_precision_rows(monkeypatch):
    calls = []
    reference = window_attention.reference_partials
    monkeypatch.setattr(window_attention, "reference_partials", lambda *args: calls.append(1) or reference(*args))
    batch, heads, width, dim, capacity = 2, 4, 2, 16, 10
    cache = torch.zeros(batch, heads, capacity + width, dim, dtype=torch.bfloat16)
    q, k, v = (torch.randn(batch, heads, width, dim, dtype=torch.bfloat16) for _ in range(3))
    seen = torch.ones(batch, 1, width, capacity + width, dtype=torch.bool)
    seen[..., capacity:] = torch.ones(width, width, dtype=torch.bool).tril()
    mask = additive_mask(seen, torch.bfloat16)
    with_kernel = attend(q, k, v, CacheWrite(cache.clone(), capacity), CacheWrite(cache.clone(), capacity), mask, True)
    assert len(calls) == 1
    without = attend(q, k, v, CacheWrite(cache.clone(), capacity), CacheWrite(cache.clone(), capacity), mask, False)
    torch.testing.assert_close(with_kernel, without, rtol=0.02, atol=0.02)
    attend(q.float(), k.float(), v.float(), CacheWrite(cache.float(), capacity), CacheWrite(cache.float(), capacity),
           additive_mask(seen, torch.float32), True)  # float32: scaled_dot_product_attention
    attend(q, k, v, None, None, None, True)  # a prefill with no cache
    assert len(calls) == 1


def test_a_compiled_block_with_the_kernel_traces_whole(monkeypatch):
    torch.manual_seed(0)
    config = gpt_config("GPT-B")
    config.n_layer = 1
    model = GPT(config).eval().to(torch.bfloat16)
    rows, capacity = 2, 7
    cache = torch.randn(rows, config.n_kv_head, capacity + 1, config.head_dim, dtype=torch.bfloat16)
    seen = torch.ones(rows, 1, 1, capacity + 1, dtype=torch.bool)
    args = (torch.randn(rows, 1, config.dim, dtype=torch.bfloat16), torch.randn(rows, 1, config.head_dim // 2),
            torch.randn(rows, 1, config.head_dim // 2))
    mask = additive_mask(seen, torch.bfloat16)
    calls = []
    reference = window_attention.reference_partials
    monkeypatch.setattr(window_attention, "reference_partials", lambda *a: calls.append(1) or reference(*a))
    with torch.inference_mode():
        eager = model.layers[0](*args, CacheWrite(cache.clone(), capacity), CacheWrite(cache.clone(), capacity), mask)[0]
        assert set_step_attention(model, "triton") == 1
        compiled = torch.compile(call_layer, fullgraph=True)
        out = compiled(model.layers[0], *args, CacheWrite(cache.clone(), capacity), CacheWrite(cache.clone(), capacity),
                       mask)[0]
    assert calls
    torch.testing.assert_close(out.float(), eager.float(), rtol=0.02, atol=0.05)
    with pytest.raises(ValueError, match="choose from sdpa, triton"):
        set_step_attention(model, "flash")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1", reason="needs CUDA")
@pytest.mark.parametrize("heads,kv_heads,width", [(20, 20, 1), (20, 20, 16), (16, 4, 4)])
def test_on_cuda_the_kernel_matches_sdpa_in_bfloat16(heads, kv_heads, width):
    pytest.importorskip("triton")
    torch.manual_seed(width)
    batch, columns, dim = 4, 641, 64  # GPT-XL at 384 px: 577 positions and a window's scratch columns
    q = torch.randn(batch, heads, width, dim, device="cuda", dtype=torch.bfloat16)
    keys, values = torch.randn(2, batch, kv_heads, columns, dim, device="cuda", dtype=torch.bfloat16)
    seen = torch.rand(batch, 1, width, columns, device="cuda") < 0.7
    seen[..., -width:] = torch.ones(width, width, dtype=torch.bool, device="cuda").tril()
    mask = additive_mask(seen, torch.bfloat16)
    out = window_attention.window_attention(q, keys, values, mask)
    rep = heads // kv_heads
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.float(), keys.float().repeat_interleave(rep, 1), values.float().repeat_interleave(rep, 1), attn_mask=mask.float())
    torch.testing.assert_close(out.float(), exact, rtol=0.02, atol=0.02)
