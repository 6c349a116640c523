"""A decode step's block products timed on a GPU: cuBLAS against specrt's skinny-row Triton kernel.

Why: the kernel's launch plan (models/skinny_matmul.launch_plan) was chosen from the shapes and
the multiprocessor count, not measured; this times the plan it chooses and its neighbours (columns
per program, K per iteration, half and twice the splits) for each product of a LlamaGen block at
a step's row counts, beside cuBLAS's F.linear over the same weight and the two products the
feed-forward ran before w1 and w3 were fused. Each time is a CUDA graph of `--calls` products
replayed (launch gaps as a step's graph has them), reported as microseconds a product and the
share of the copy bandwidth measured in the same run that reading the weight at that time means.

    python -m specrt.bench.skinny_matmul --arch GPT-XL --rows 2,16
"""
from __future__ import annotations

import itertools
import sys
from typing import Any, Callable

import click

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.models.llamagen_gpt import GPT_ARCHS


def block_products(arch: str) -> list[tuple[str, int, int]]:
    """(name, columns N, depth K) of each product of one block of `arch` (w1 and w3 fused)."""
    require("torch", "specrt.bench.skinny_matmul")
    from specrt.models.llamagen_gpt import gpt_config

    config = gpt_config(arch)
    qkv = (config.n_head + 2 * config.n_kv_head) * config.head_dim
    return [("wqkv", qkv, config.dim), ("wo", config.dim, config.dim),
            ("w1+w3", 2 * config.ffn_hidden, config.dim), ("w2", config.dim, config.ffn_hidden)]


def graph_seconds(torch: Any, run: Callable[[], Any], calls: int, repeats: int) -> float:
    """Seconds one call of `run` takes as part of a CUDA graph of `calls` calls (fastest of repeats)."""
    for _ in range(3):  # compiles and warms outside the capture
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            run()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000 / calls)
    return best


def plans_around(plan: Any, depth: int) -> list[Any]:
    """The chosen plan and its neighbours: columns per program, K per iteration, splits halved and doubled."""
    from specrt.models.skinny_matmul import LaunchPlan

    options = {plan}
    for block_n, block_k in itertools.product((16, 32, 64), (64, 128, 256)):
        for splits in {max(1, plan.splits // 2), plan.splits, plan.splits * 2}:
            candidate = LaunchPlan(block_n, block_k, splits)
            chunk = candidate.chunk(depth)
            options.add(LaunchPlan(block_n, block_k, -(-depth // chunk)))  # no empty split
    return sorted(options)


@click.command()
@click.option("--arch", type=click.Choice(list(GPT_ARCHS)), default="GPT-XL", show_default=True,
              help="LlamaGen size whose block products are timed.")
@click.option("--rows", "rows_text", default="2,16", show_default=True, help="Rows a product (2 = one image's CFG pair).")
@click.option("--calls", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="Products in one CUDA graph.")
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--sweep/--no-sweep", default=True, show_default=True, help="Time the chosen plan's neighbours too.")
def main(arch: str, rows_text: str, calls: int, repeats: int, sweep: bool) -> None:
    """Time cuBLAS and the skinny-row kernel on one block's products (CUDA only)."""
    try:
        _timed(arch, rows_text, calls, repeats, sweep)
    except SpecrtError as exc:  # a user's mistake: one line and exit 2, as the specrt commands do
        click.echo(f"specrt.bench.skinny_matmul: error: {exc}", err=True)
        sys.exit(2)


def _timed(arch: str, rows_text: str, calls: int, repeats: int, sweep: bool) -> None:
    torch = require("torch", "specrt.bench.skinny_matmul")
    if not torch.cuda.is_available():
        raise SpecrtError("specrt.bench.skinny_matmul times CUDA kernels; no CUDA device here")
    require("triton", "specrt.bench.skinny_matmul")
    from specrt.bench.cost_model import memory_bandwidth
    from specrt.models.skinny_matmul import SKINNY_ROWS, launch_plan, skinny_partials

    rows_list = [int(text) for text in rows_text.split(",") if text.strip()]
    if not rows_list or not all(1 <= rows <= SKINNY_ROWS for rows in rows_list):
        raise SpecrtError(f"--rows {rows_text!r}: integers from 1 to {SKINNY_ROWS}")
    bandwidth = memory_bandwidth("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    click.echo(f"{torch.cuda.get_device_name(0)}, {sms} SMs, copy bandwidth {bandwidth / 1e12:.2f} TB/s; {arch} "
               f"bf16 block products, {calls} a CUDA graph, fastest of {repeats}")
    click.echo("us a product (share of the copy bandwidth reading the weight)")
    for rows in rows_list:
        for name, columns, depth in block_products(arch):
            weight = torch.randn(columns, depth, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
            seconds_floor = weight.numel() * weight.element_size() / bandwidth

            def show(label: str, seconds: float) -> None:
                click.echo(f"  rows {rows:2d} {name:6s} N {columns:5d} K {depth:5d}  {label:34s} "
                           f"{seconds * 1e6:7.2f} us ({seconds_floor / seconds:4.0%})")

            show("cuBLAS F.linear", graph_seconds(torch, lambda: torch.nn.functional.linear(x, weight), calls, repeats))
            if name == "w1+w3":
                half = columns // 2
                w1, w3 = weight[:half], weight[half:]
                show("cuBLAS w1, w3 apart", graph_seconds(
                    torch, lambda: (torch.nn.functional.linear(x, w1), torch.nn.functional.linear(x, w3)), calls,
                    repeats))
            chosen = launch_plan(columns, depth, sms)
            for plan in plans_around(chosen, depth) if sweep else [chosen]:
                seconds = graph_seconds(torch, lambda: skinny_partials(x, weight, *plan), calls, repeats)
                show(f"skinny n{plan.block_n} k{plan.block_k} x{plan.splits}" + (" (chosen)" if plan == chosen else ""),
                     seconds)


if __name__ == "__main__":
    main()
