"""Attention of a decode step's few query rows over a static KV cache, in Triton (split over the cache).

Why: a decode step's attention reads each layer's cached keys and values once for 1-16 query
rows. On an H100 the compiled GPT-XL step ran it as cuDNN's fused attention plus a reduction
kernel, 9.4 µs a layer (0.34 ms of a 2.14 ms step, bench/results/h100-2026-11-27-step/), for a
few hundred kilobytes a layer. This kernel gives the work to more programs: one per (row of the
batch, key head, block of query rows, split of the cache columns), so a step's attention is
B·Hkv·splits programs instead of B·H; the query heads that share a key head (GQA) are stacked as
rows of one tile, so each key is read once for all of them. Each split writes its unnormalised
output with its running maximum and sum; `combine_splits` joins them in torch (compiled, one
small fused kernel) — the flash-decoding scheme, without a kernel of its own for the join.

The mask is the step's additive one [B, 1, W, S] (0 seen, −inf hidden; kv_cache.additive_mask);
every query row sees at least itself, but a whole split may be hidden from a row, which the
kernel keeps finite (its running maximum starts at −1e30, not −inf). `window_partials` is a
PyTorch operator (specrt::window_partials) with a torch reference as its CPU kernel, so a
compiled block with it traces whole on a CPU; the Triton kernel is tested under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from specrt.models.skinny_matmul import SKINNY_DTYPES, SKINNY_ROWS, covering_splits, multiprocessors, split_length

HIDDEN = -1e30  # a running maximum that no score lowers: a split a row cannot see adds exp(−1e30 − M) = 0
BLOCK_COLUMNS = 64  # cache columns a loop iteration reads


def fits(q: torch.Tensor, keys: torch.Tensor, mask: Any) -> bool:
    """Whether the kernel takes this attention: few query rows a key head, half precision, an
    additive mask (a boolean one or none goes to scaled_dot_product_attention)."""
    rows = (q.shape[1] // keys.shape[1]) * q.shape[2]
    return (rows <= SKINNY_ROWS and q.dtype in SKINNY_DTYPES and keys.dtype == q.dtype
            and isinstance(mask, torch.Tensor) and mask.dtype == q.dtype)


def window_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√D + mask)·v for q [B, H, W, D] over keys/values [B, Hkv, S, D] (GQA: H a
    multiple of Hkv) under an additive mask [B, 1, W, S]: [B, H, W, D] in q's dtype."""
    splits = split_count(keys.shape[0] * keys.shape[1], keys.shape[2], multiprocessors(str(q.device)))
    acc, maximum, total = window_partials(q, keys, values, mask, splits)
    return combine_splits(acc, maximum, total).to(q.dtype)


def combine_splits(acc: torch.Tensor, maximum: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The attention output from each split's unnormalised output acc [S, B, H, W, D], running
    maximum and sum of exponentials [S, B, H, W] (float32)."""
    overall = maximum.amax(0)
    weight = torch.exp(maximum - overall)
    return (acc * weight[..., None]).sum(0) / (total * weight).sum(0)[..., None]


def split_count(programs: int, columns: int, multiprocessors: int) -> int:
    """Splits of the cache columns: about two programs a multiprocessor, each split at least two
    BLOCK_COLUMNS long, none empty."""
    wanted = max(1, -(-2 * multiprocessors // max(1, programs)))
    most = max(1, columns // (2 * BLOCK_COLUMNS))
    return covering_splits(columns, min(wanted, most), BLOCK_COLUMNS)


def split_chunk(columns: int, splits: int) -> int:
    """Cache columns a split covers: a whole number of BLOCK_COLUMNS (the last split may end early)."""
    return split_length(columns, splits, BLOCK_COLUMNS)


@torch.library.custom_op("specrt::window_partials", mutates_args=())
def window_partials(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                    splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each split's (acc [S, B, H, W, D], maximum [S, B, H, W], total [S, B, H, W]), float32.
    A CPU computes them in torch (the reference)."""
    return reference_partials(q, keys, values, mask, splits)


@window_partials.register_fake
def _(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
      splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, heads, width, dim = q.shape
    return (q.new_empty((splits, batch, heads, width, dim), dtype=torch.float32),
            q.new_empty((splits, batch, heads, width), dtype=torch.float32),
            q.new_empty((splits, batch, heads, width), dtype=torch.float32))


@window_partials.register_kernel("cuda")
def _(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
      splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return triton_partials(q, keys, values, mask, splits)


def reference_partials(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                       splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's per-split results, computed in float32 by torch."""
    batch, heads, width, dim = q.shape
    rep = heads // keys.shape[1]
    keys = keys.float().repeat_interleave(rep, dim=1)
    values = values.float().repeat_interleave(rep, dim=1)
    scores = (q.float() @ keys.transpose(-1, -2)) * dim ** -0.5 + mask.float()  # [B, H, W, S]
    chunk = split_chunk(keys.shape[2], splits)
    accs, maxima, totals = [], [], []
    for split in range(splits):
        part = scores[..., split * chunk:(split + 1) * chunk]
        maximum = part.amax(-1).clamp_min(HIDDEN) if part.shape[-1] else scores.new_full(scores.shape[:-1], HIDDEN)
        probs = torch.exp(part - maximum[..., None])
        accs.append(probs @ values[:, :, split * chunk:(split + 1) * chunk])
        maxima.append(maximum)
        totals.append(probs.sum(-1))
    return torch.stack(accs), torch.stack(maxima), torch.stack(totals)


def triton_partials(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                    splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-split results computed by the Triton kernel (on CUDA, or on a CPU under TRITON_INTERPRET=1)."""
    batch, heads, width, dim = q.shape
    kv_heads, columns = keys.shape[1], keys.shape[2]
    rows = (heads // kv_heads) * width
    if rows > SKINNY_ROWS:
        raise ValueError(f"the window attention kernel takes at most {SKINNY_ROWS} query rows a key head, got {rows}")
    if keys.stride(-1) != 1 or values.stride(-1) != 1 or q.stride(-1) != 1:  # the kernel reads rows of D in a run
        q, keys, values = q.contiguous(), keys.contiguous(), values.contiguous()
    mask = mask.expand(batch, 1, width, columns).contiguous()  # no copy for the step's [B, 1, W, S] mask
    acc = torch.empty((splits, batch, heads, width, dim), dtype=torch.float32, device=q.device)
    maximum = torch.empty((splits, batch, heads, width), dtype=torch.float32, device=q.device)
    total = torch.empty_like(maximum)
    _kernel()[(batch * kv_heads, splits)](
        q, keys, values, mask, acc, maximum, total, q.stride(0), q.stride(1), q.stride(2),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        kv_heads, heads, width, columns, split_chunk(columns, splits), dim ** -0.5,
        BLOCK_M=SKINNY_ROWS, BLOCK_S=BLOCK_COLUMNS, BLOCK_D=_power_of_two(dim), DIM=dim)
    return acc, maximum, total


def _power_of_two(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


@functools.lru_cache(maxsize=None)
def _kernel() -> Any:
    """The jitted kernel, made at first use (Triton reads TRITON_INTERPRET when a kernel is made)."""
    import triton
    import triton.language as tl

    @triton.jit
    def split_attention(q_ptr, k_ptr, v_ptr, mask_ptr, acc_ptr, max_ptr, total_ptr, q_batch, q_head, q_row,
                        k_batch, k_head, k_col, v_batch, v_head, v_col,
                        KV_HEADS, HEADS, WIDTH, COLUMNS, chunk, scale,
                        BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, DIM: tl.constexpr):
        batch_head, split = tl.program_id(0), tl.program_id(1)
        b, g = batch_head // KV_HEADS, batch_head % KV_HEADS
        rep = HEADS // KV_HEADS
        rows = tl.arange(0, BLOCK_M)  # the query heads of key head g, each with its WIDTH rows
        row_ok = rows < rep * WIDTH
        head, w = g * rep + rows // WIDTH, rows % WIDTH
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims < DIM
        query_rows = (b * HEADS + head) * WIDTH + w  # [B, H, W] flattened, as the outputs lie
        q = tl.load(q_ptr + (b * q_batch + head * q_head + w * q_row)[:, None] + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        maximum = tl.full((BLOCK_M,), -1e30, dtype=tl.float32)
        total = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        start = split * chunk
        for offset in range(0, chunk, BLOCK_S):
            cols = start + offset + tl.arange(0, BLOCK_S)
            col_ok = cols < COLUMNS
            k = tl.load(k_ptr + b * k_batch + g * k_head + cols[:, None] * k_col + dims[None, :],
                        mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale
            bias = tl.load(mask_ptr + (b * WIDTH + w)[:, None] * COLUMNS + cols[None, :],
                           mask=row_ok[:, None] & col_ok[None, :], other=float("-inf"))
            scores = scores + bias.to(tl.float32)
            new_max = tl.maximum(maximum, tl.max(scores, 1))
            probs = tl.exp(scores - new_max[:, None])
            shrink = tl.exp(maximum - new_max)
            total = total * shrink + tl.sum(probs, 1)
            v = tl.load(v_ptr + b * v_batch + g * v_head + cols[:, None] * v_col + dims[None, :],
                        mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = acc * shrink[:, None] + tl.dot(probs.to(v.dtype), v)
            maximum = new_max
        out_rows = split * (tl.num_programs(0) // KV_HEADS) * HEADS * WIDTH + query_rows
        tl.store(acc_ptr + out_rows[:, None] * DIM + dims[None, :], acc, mask=row_ok[:, None] & dim_ok[None, :])
        tl.store(max_ptr + out_rows, maximum, mask=row_ok)
        tl.store(total_ptr + out_rows, total, mask=row_ok)

    return split_attention
