"""A decode step's block products and attention timed on a GPU: cuBLAS and cuDNN against specrt's
Triton kernels.

Why: the kernels' launch plans (models/skinny_matmul.launch_plan, models/window_attention.split_count)
were chosen from the shapes and the multiprocessor count, not measured; this times the skinny
matmul's chosen plan and its neighbours (columns per program, K per iteration, half and twice the
splits) for each product of a LlamaGen block at a step's row counts, beside cuBLAS's F.linear over
the same weight and the two products the feed-forward ran before w1 and w3 were fused; then the
attention of one layer over a half-full cache at windows 1 and 16, scaled_dot_product_attention
against the split-cache kernel at several split counts (with the join compiled, as the step
compiles it). Each time is a CUDA graph of `--calls` calls replayed (launch gaps as a step's graph
has them): microseconds a call, and for the products the share of the copy bandwidth measured in
the same run that reading the weight at that time means.

    python -m specrt.bench.step_kernels --arch GPT-XL --rows 2,16
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
    require("torch", "specrt.bench.step_kernels")
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
    from specrt.models.skinny_matmul import LaunchPlan, covering_splits

    options = {plan}
    for block_n, block_k in itertools.product((16, 32, 64), (64, 128, 256)):
        for splits in {max(1, plan.splits // 2), plan.splits, plan.splits * 2}:
            options.add(LaunchPlan(block_n, block_k, covering_splits(depth, splits, block_k)))
    return sorted(options)


def attention_splits(programs: int, columns: int, multiprocessors: int) -> list[int]:
    """The split count the kernel chooses and its neighbours (none empty)."""
    from specrt.models.skinny_matmul import covering_splits
    from specrt.models.window_attention import BLOCK_COLUMNS, split_count

    chosen = split_count(programs, columns, multiprocessors)
    return sorted({covering_splits(columns, splits, BLOCK_COLUMNS) for splits in (1, max(1, chosen // 2), chosen,
                                                                                  2 * chosen)})


@click.command()
@click.option("--arch", type=click.Choice(list(GPT_ARCHS)), default="GPT-XL", show_default=True,
              help="LlamaGen size whose block products and attention are timed.")
@click.option("--image-size", type=click.Choice(["256", "384", "512"]), default="384", show_default=True,
              help="Pixels a side: the attention's cache length (384: the step profile's GPT-XL).")
@click.option("--rows", "rows_text", default="2,16", show_default=True,
              help="Rows a product, batch rows an attention (2 = one image's CFG pair).")
@click.option("--calls", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="Calls in one CUDA graph.")
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--sweep/--no-sweep", default=True, show_default=True, help="Time the chosen plans' neighbours too.")
def main(arch: str, image_size: str, rows_text: str, calls: int, repeats: int, sweep: bool) -> None:
    """Time cuBLAS and cuDNN against specrt's Triton kernels on one block's products and attention (CUDA only)."""
    try:
        _timed(arch, int(image_size), rows_text, calls, repeats, sweep)
    except SpecrtError as exc:  # a user's mistake: one line and exit 2, as the specrt commands do
        click.echo(f"specrt.bench.step_kernels: error: {exc}", err=True)
        sys.exit(2)


def _timed(arch: str, image_size: int, rows_text: str, calls: int, repeats: int, sweep: bool) -> None:
    torch = require("torch", "specrt.bench.step_kernels")
    if not torch.cuda.is_available():
        raise SpecrtError("specrt.bench.step_kernels times CUDA kernels; no CUDA device here")
    require("triton", "specrt.bench.step_kernels")
    from specrt.bench.cost_model import memory_bandwidth
    from specrt.models.skinny_matmul import SKINNY_ROWS

    rows_list = [int(text) for text in rows_text.split(",") if text.strip().isdigit()]
    if not rows_list or not all(1 <= rows <= SKINNY_ROWS for rows in rows_list):
        raise SpecrtError(f"--rows {rows_text!r}: integers from 1 to {SKINNY_ROWS}")
    bandwidth = memory_bandwidth("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    click.echo(f"{torch.cuda.get_device_name(0)}, {sms} SMs, copy bandwidth {bandwidth / 1e12:.2f} TB/s; {arch} "
               f"bf16, {calls} calls a CUDA graph, fastest of {repeats}")
    _time_products(torch, arch, rows_list, calls, repeats, sweep, bandwidth, sms)
    _time_attention(torch, arch, image_size, rows_list, calls, repeats, sweep, sms)


def _time_products(torch: Any, arch: str, rows_list: list[int], calls: int, repeats: int, sweep: bool,
                   bandwidth: float, sms: int) -> None:
    from specrt.models.skinny_matmul import launch_plan, skinny_partials

    click.echo("\nblock products: us a product (share of the copy bandwidth reading the weight)")
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


def _time_attention(torch: Any, arch: str, image_size: int, rows_list: list[int], calls: int, repeats: int,
                    sweep: bool, sms: int) -> None:
    """One layer's attention over a half-full static cache (its scratch columns included)."""
    from specrt.models.kv_cache import additive_mask
    from specrt.models.llamagen_gpt import gpt_config
    from specrt.models.window_attention import combine_splits, split_count, window_partials

    config = gpt_config(arch, image_size=image_size)
    join = torch.compile(combine_splits, dynamic=True)  # one compile for every shape below (dynamo keeps 8 static ones)
    click.echo(f"\nattention of one layer, {config.n_head} heads of {config.head_dim}, cache half full: us a call")
    for rows in rows_list:
        for width in (1, 16):
            columns = config.seq_len + width
            q = torch.randn(rows, config.n_head, width, config.head_dim, device="cuda", dtype=torch.bfloat16)
            keys, values = torch.randn(2, rows, config.n_kv_head, columns, config.head_dim, device="cuda",
                                       dtype=torch.bfloat16)
            seen = torch.zeros(rows, 1, width, columns, dtype=torch.bool, device="cuda")
            seen[..., :config.seq_len // 2] = True
            seen[..., -width:] = torch.ones(width, width, dtype=torch.bool, device="cuda").tril()
            mask = additive_mask(seen, torch.bfloat16)
            label = f"  rows {rows:2d} W {width:2d} columns {columns:4d}"
            seconds = graph_seconds(
                torch, lambda: torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask),
                calls, repeats)
            click.echo(f"{label}  {'scaled_dot_product_attention':34s} {seconds * 1e6:7.2f} us")
            if (config.n_head // config.n_kv_head) * width > 16:
                continue
            chosen = split_count(rows * config.n_kv_head, columns, sms)
            for splits in attention_splits(rows * config.n_kv_head, columns, sms) if sweep else [chosen]:
                kernel = graph_seconds(torch, lambda: window_partials(q, keys, values, mask, splits), calls, repeats)
                whole = graph_seconds(torch, lambda: join(*window_partials(q, keys, values, mask, splits)), calls,
                                      repeats)
                mark = " (chosen)" if splits == chosen else ""
                click.echo(f"{label}  {f'triton x{splits}{mark}, kernel / with the join':34s} "
                           f"{kernel * 1e6:7.2f} / {whole * 1e6:.2f} us")


if __name__ == "__main__":
    main()
