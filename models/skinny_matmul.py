"""The matrix product of a decode step's few rows, x [M, K] @ weight [N, K]ᵀ for M ≤ 16, in Triton.

Why: a decode step multiplies 2-16 rows (an image's CFG pair, a few images, a short window) by
every weight of the model once, so its time is the time to read the weights. On an H100, cuBLAS
runs such a product in 64-column tiles, one tile to a streaming multiprocessor: GPT-XL's products
have 20-60 tiles for 132 of them, and the compiled step read its weights at about half the
bandwidth (1.07 ms of a 2.14 ms step, bench/results/h100-2026-11-27-step/). This kernel also splits
the inner dimension K: a program multiplies `block_n` columns over one range of K, so a product
runs as cdiv(N, block_n) × splits programs, several to a multiprocessor. Each program writes its
partial sums to its own plane of a [splits, M, N] float32 tensor and the caller sums the planes:
compiled, inductor fuses that sum and the cast back into the pointwise kernel that follows the
product (SwiGLU, RoPE, the residual add), so there are no atomics, no zero fill and the same sum
every run.

`skinny_partials` is a PyTorch operator (specrt::skinny_partials), opaque to torch.compile, so a
compiled block calls it and a CUDA graph replays it. Its CPU kernel computes the same partial sums
with torch, so a compiled step with the operator traces and runs on a machine without a GPU; the
Triton kernel itself is checked there under TRITON_INTERPRET=1 (tests/models/test_skinny_matmul.py).

The launch configuration (`launch_plan`) is a first choice from the shapes and the number of
multiprocessors, not tuned: `python -m specrt.bench.skinny_matmul` times it against cuBLAS and
the other configurations on a GPU.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F

SKINNY_ROWS = 16  # the kernel's row tile: products of more rows go to the ordinary matrix product
SKINNY_DTYPES = (torch.bfloat16, torch.float16)  # Triton's dot over float32 would round to tf32


class LaunchPlan(NamedTuple):
    """How one product is cut: columns per program, K per loop iteration, K ranges (planes)."""

    block_n: int
    block_k: int
    splits: int

    def chunk(self, k: int) -> int:
        """K per split, a whole number of block_k (the last split's range may end early)."""
        return split_length(k, self.splits, self.block_k)

    def programs(self, n: int) -> int:
        return -(-n // self.block_n) * self.splits


def split_length(total: int, splits: int, block: int) -> int:
    """Length of each of `splits` ranges covering `total`, a whole number of `block`s (a kernel's
    loop steps a block at a time; the last range may end early)."""
    per_split = -(-total // splits)
    return -(-per_split // block) * block


def covering_splits(total: int, splits: int, block: int) -> int:
    """How many of `splits` whole-block ranges (split_length) `total` reaches: the split count
    with no empty range, which a kernel launches instead (rounding up to whole blocks can leave
    the last ranges with nothing)."""
    return -(-total // split_length(total, splits, block))


def launch_plan(n: int, k: int, multiprocessors: int, block_n: int = 32, block_k: int = 128) -> LaunchPlan:
    """Splits of K so that the product runs as at least about four programs a multiprocessor,
    while each program still streams at least two block_k iterations of its K range; every split
    has some of K (the count is cut back to what whole block_k ranges need)."""
    column_blocks = -(-n // block_n)
    wanted = -(-4 * multiprocessors // column_blocks)
    most = max(1, k // (2 * block_k))
    return LaunchPlan(block_n, block_k, covering_splits(k, max(1, min(wanted, most)), block_k))


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the product of `x` [..., K] and `weight` [N, K] is one this kernel takes: few rows,
    both in half precision."""
    rows = x.numel() // x.shape[-1]
    return rows <= SKINNY_ROWS and x.dtype in SKINNY_DTYPES and weight.dtype == x.dtype


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., K] through the skinny kernel where it `fits`, else the
    ordinary product. The bias joins the float32 sum of the partials before the one cast, so it
    costs no pass of its own once compiled (the unified-vocabulary LM's projections may have one)."""
    if not fits(x, weight):
        return F.linear(x, weight, bias)
    rows, k = x.numel() // x.shape[-1], x.shape[-1]
    n = weight.shape[0]
    plan = launch_plan(n, k, multiprocessors(str(x.device)))
    total = skinny_partials(x.reshape(rows, k), weight, plan.block_n, plan.block_k, plan.splits).sum(0)
    if bias is not None:
        total = total + bias.float()
    return total.to(x.dtype).reshape(*x.shape[:-1], n)


def block_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], skinny: bool) -> torch.Tensor:
    """A block's projection: through the skinny kernel where the model's step matmuls are "skinny"
    (models.step_setup.use_skinny_matmuls sets the blocks' flag), else F.linear."""
    return skinny_linear(x, weight, bias) if skinny else F.linear(x, weight, bias)


@torch.compiler.assume_constant_result  # compiled, read once while tracing: a number in the graph
def multiprocessors(device: str) -> int:
    """Streaming multiprocessors of a CUDA device (8 elsewhere: a CPU runs the references, where
    any plan gives the same result)."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return 8


@torch.library.custom_op("specrt::skinny_partials", mutates_args=())
def skinny_partials(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, splits: int) -> torch.Tensor:
    """Partial products [splits, M, N] (float32) of x [M, K] and weight [N, K]: plane s holds the
    sum over K range s (LaunchPlan.chunk long). A CPU runs them in torch (the reference)."""
    return reference_partials(x, weight, LaunchPlan(block_n, block_k, splits))


@skinny_partials.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, splits: int) -> torch.Tensor:
    return x.new_empty((splits, x.shape[0], weight.shape[0]), dtype=torch.float32)


@skinny_partials.register_kernel("cuda")
def _(x: torch.Tensor, weight: torch.Tensor, block_n: int, block_k: int, splits: int) -> torch.Tensor:
    return triton_partials(x, weight, LaunchPlan(block_n, block_k, splits))


def reference_partials(x: torch.Tensor, weight: torch.Tensor, plan: LaunchPlan) -> torch.Tensor:
    """The planes of the kernel's partial sums, computed in float32 by torch."""
    k = x.shape[1]
    chunk = plan.chunk(k)
    planes = []
    for split in range(plan.splits):
        start, end = min(split * chunk, k), min((split + 1) * chunk, k)
        planes.append(x[:, start:end].float() @ weight[:, start:end].float().T)
    return torch.stack(planes)


def triton_partials(x: torch.Tensor, weight: torch.Tensor, plan: LaunchPlan) -> torch.Tensor:
    """The planes computed by the Triton kernel (on CUDA, or on a CPU under TRITON_INTERPRET=1)."""
    rows, k = x.shape
    n = weight.shape[0]
    if rows > SKINNY_ROWS:
        raise ValueError(f"the skinny kernel takes at most {SKINNY_ROWS} rows, got {rows}")
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty((plan.splits, rows, n), dtype=torch.float32, device=x.device)
    grid = (-(-n // plan.block_n), plan.splits)
    _kernel()[grid](x, weight, out, rows, n, k, plan.chunk(k),
                    BLOCK_M=SKINNY_ROWS, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k)
    return out


@functools.lru_cache(maxsize=None)
def _kernel() -> Any:
    """The jitted kernel, made at first use (Triton reads TRITON_INTERPRET when a kernel is made)."""
    import triton
    import triton.language as tl

    @triton.jit
    def partial_products(x_ptr, w_ptr, out_ptr, M, N, K, chunk,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        column_block, split = tl.program_id(0), tl.program_id(1)
        rows = tl.arange(0, BLOCK_M)
        columns = column_block * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for offset in range(0, chunk, BLOCK_K):
            ks = split * chunk + offset + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K),
                        other=0.0)
            w = tl.load(w_ptr + columns[:, None] * K + ks[None, :],
                        mask=(columns[:, None] < N) & (ks[None, :] < K), other=0.0)
            acc += tl.dot(x, tl.trans(w))
        out = out_ptr + split * M * N + rows[:, None] * N + columns[None, :]
        tl.store(out, acc, mask=(rows[:, None] < M) & (columns[None, :] < N))

    return partial_products
