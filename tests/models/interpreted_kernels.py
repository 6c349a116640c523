"""Runs specrt's Triton kernels under TRITON_INTERPRET=1 and prints what they computed, as JSON.

Why a process of its own: Triton reads TRITON_INTERPRET when triton.language is imported, and a
test process that compiled anything with torch.compile has imported it already. Usage:
`TRITON_INTERPRET=1 python tests/models/interpreted_kernels.py`; the cases are kernel_cases.py's,
plus one run of each kernel with a planted bug: the skinny matmul's K ranges, the attention's
cache splits, each cut short by one block (their tails never read)."""
from __future__ import annotations

import json
import os
import sys


def masked_inputs(batch: int, heads: int, kv_heads: int, width: int, columns: int, dim: int, seed: int):
    """Half-precision q, keys, values (views of a wider cache, as a static cache's are) and an additive
    mask hiding about half the cache from each row, the window causal."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, width, heads, dim, generator=generator).half().transpose(1, 2)  # as the block makes it
    keys = torch.randn(batch, kv_heads, columns + 5, dim, generator=generator).half()[:, :, :columns]
    values = torch.randn(batch, kv_heads, columns + 5, dim, generator=generator).half()[:, :, :columns]
    hidden = torch.rand(batch, 1, width, columns, generator=generator) < 0.5
    hidden[..., -width:] = ~torch.ones(width, width, dtype=torch.bool).tril()
    mask = torch.zeros(batch, 1, width, columns).half().masked_fill(hidden, float("-inf"))
    return q, keys, values, mask


def attention_error(q, keys, values, mask, splits: int) -> dict:
    import torch

    from specrt.models import window_attention

    partials = window_attention.triton_partials(q, keys, values, mask, splits)
    reference = window_attention.reference_partials(q, keys, values, mask, splits)
    rep = q.shape[1] // keys.shape[1]
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.float(), keys.float().repeat_interleave(rep, 1), values.float().repeat_interleave(rep, 1), attn_mask=mask.float())
    return {"shapes": [list(part.shape) for part in partials],
            "partial_errors": [(got - want).abs().max().item() for got, want in zip(partials, reference)],
            "output_error": (window_attention.combine_splits(*partials) - exact).abs().max().item()}


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1: this runs the kernels in Triton's interpreter")
    import torch

    from kernel_cases import ATTENTION_CASES, SHAPES  # beside this file
    from specrt.models import window_attention
    from specrt.models.skinny_matmul import LaunchPlan, reference_partials, triton_partials

    matmuls = []
    for rows, columns, depth, plan in SHAPES:
        generator = torch.Generator().manual_seed(rows * columns + depth)
        x = torch.randn(rows, depth, generator=generator).half()
        weight = torch.randn(columns, depth, generator=generator).half()
        planes = triton_partials(x, weight, plan)
        matmuls.append({
            "shape": list(planes.shape), "dtype": str(planes.dtype),
            "planes_error": (planes - reference_partials(x, weight, plan)).abs().max().item(),
            "sum_error": (planes.sum(0) - x.float() @ weight.float().T).abs().max().item(),
        })
    attention = [attention_error(*masked_inputs(*case[:6], seed=index), splits=case[6])
                 for index, case in enumerate(ATTENTION_CASES)]

    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(1)).half()
    weight = torch.randn(40, 512, generator=torch.Generator().manual_seed(2)).half()
    plan = LaunchPlan(32, 64, 2)
    right = (triton_partials(x, weight, plan).sum(0) - x.float() @ weight.float().T).abs().max().item()
    LaunchPlan.chunk = lambda self, k: -(-k // self.splits) - self.block_k  # the planted bug
    planted = (triton_partials(x, weight, plan).sum(0) - x.float() @ weight.float().T).abs().max().item()

    inputs = masked_inputs(2, 4, 4, 1, 300, 64, seed=99)
    attention_right = attention_error(*inputs, splits=3)["output_error"]
    window_attention.split_chunk = lambda columns, splits: -(-columns // splits) - window_attention.BLOCK_COLUMNS
    attention_planted = attention_error(*inputs, splits=3)["output_error"]
    print(json.dumps({"matmuls": matmuls, "attention": attention,
                      "planted": {"matmul_right": right, "matmul_planted": planted,
                                  "attention_right": attention_right, "attention_planted": attention_planted}}))


if __name__ == "__main__":
    main()
