"""Decoding end to end on a LlamaGen architecture with random weights: ms per image and per token.

Why: plain AR is the figure a user compares with LlamaGen's own sample_c2i.py (its generate()
under torch.compile) on the same GPU. Acceptance does not matter for AR, so random weights in
LlamaGen's layout time exactly what a checkpoint would; the VQ decoder is skipped
(generate(decode=False)), as tokens are what the two scripts share.

    python -m specrt.bench.ar_timing --arch GPT-XL --image-size 256 --dtype bf16 --images 1,8 --device cuda

`--methods` adds speculative methods (sd needs `--draft-arch`) and `--loop host,round` times each
in both loops. Random weights accept whatever they accept, so a method's speed-up says little
about a checkpoint's; what it does show at full size is the loop's cost: `pred.` is the speed-up
its model passes alone would give (the host loop's graph time against ar's; a round row takes its
host-loop twin's), and meas/pred how much of it the loop keeps. A round row also counts the
operations one round runs (`ops/round`: GPU kernels on CUDA, compute operations on a CPU).

The first generate of each batch size is the warm-up (compiling and capturing each step's CUDA
graph); it is reported on its own, then the median of `--repeats` timed runs.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import click

from specrt.bench.cost_model import torch_dtype
from specrt.models.llamagen_gpt import GPT_ARCHS
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION, STEP_ATTENTION, STEP_MATMULS
from specrt.runtime.backends.compiled_step import COMPILE_MODES
from specrt.lazy import require


@dataclass
class ARTiming:
    """One (method, loop, batch size)'s timing (seconds): the warm-up call and the median of the
    timed ones, with the last timed call's tokens per target pass and seconds inside model passes."""

    images: int
    tokens: int
    warmup_s: float
    median_s: float
    method: str = "ar"
    loop: str = "auto"
    accepted_length: float = 1.0
    graph_s: float = 0.0
    speedup: float | None = None
    predicted: float | None = None
    round_ops: int | None = None  # a device round's operations: GPU kernels on CUDA, compute ops on a CPU

    @property
    def ms_per_image(self) -> float:
        return 1000 * self.median_s / self.images

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.median_s / self.tokens


def time_ar(arch: str, image_size: int, dtype: str, batches: tuple[int, ...], device: str, repeats: int,
            compile: bool | None, compile_mode: str = "default", cfg_scale: float = 4.0,
            methods: tuple[str, ...] = ("ar",), loops: tuple[str, ...] = ("auto",),
            draft_arch: str | None = None, step_matmuls: str | None = None,
            step_attention: str = DEFAULT_STEP_ATTENTION) -> list[ARTiming]:
    """Timings of `arch` (a GPT_ARCHS name) for each batch size (images, each a CFG pair), method
    (default parameters) and loop, with speed-ups against ar in the same loop and batch."""
    torch = require("torch", "specrt.bench.ar_timing")
    from specrt.models.llamagen_gpt import GPT, gpt_config
    from specrt.models.llamagen_vq import VQConfig, VQModel
    from specrt.runtime.methods import make_method
    from specrt.runtime.pipeline import Pipeline

    torch.manual_seed(0)
    config = gpt_config(arch, image_size=image_size)
    with torch.device(device):
        target = GPT(config).to(torch_dtype(dtype))
        draft = GPT(gpt_config(draft_arch, image_size=image_size)).to(torch_dtype(dtype)) if draft_arch else None
        vq = VQModel(VQConfig(codebook_size=config.vocab_size))
    window = max(make_method(method).max_window for method in methods)
    pipe = Pipeline.from_torch(target, draft, vq, device=device, max_window=window, compile=compile,
                               compile_mode=compile_mode, max_images=max(batches), step_matmuls=step_matmuls,
                               step_attention=step_attention)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    timings = []
    for images in batches:
        classes = [i % config.num_classes for i in range(images)]
        for method in methods:
            for loop in loops:
                last = {}

                def run() -> float:
                    pipe.loop = loop
                    sync()
                    start = time.perf_counter()
                    last["stats"] = pipe.generate(classes, method=method, seed=0, decode=False, cfg_scale=cfg_scale,
                                                  temperature=1.0, top_k=0, top_p=1.0).stats
                    sync()
                    return time.perf_counter() - start

                warmup = run()
                median = statistics.median(run() for _ in range(repeats))
                stats = last["stats"]
                graph = stats.seconds["target_forward"] + stats.seconds["draft_forward"]
                timings.append(ARTiming(images, config.num_image_tokens, warmup, median, method, loop,
                                        stats.mean_accepted_length, graph, round_ops=_round_ops(pipe, loop, device)))
    _attach_speedups(timings)
    return timings


def _round_ops(pipe: Any, loop: str, device: str) -> int | None:
    """Operations one device round runs (the last call's round, run once more over its finished
    state: every row is padding then, the work the same): GPU kernels on CUDA, compute operations on
    a CPU (bench.step_ops). None for the host loop."""
    if loop != "round" or not pipe.kept_rounds:
        return None
    from specrt.bench.step_ops import step_ops

    torch = require("torch", "specrt.bench.ar_timing")
    round_ = pipe.kept_rounds[-1]
    with torch.inference_mode():
        return step_ops(lambda: round_(round_.state), device)


def _attach_speedups(timings: list[ARTiming]) -> None:
    """Speed-up against ar in the same loop and batch, and the prediction from model-pass time: the
    host loop's own (ar's graph seconds over the method's), a round row its host twin's (the round
    counts its whole time as the target's)."""
    def find(method: str, loop: str, images: int) -> ARTiming | None:
        return next((t for t in timings if (t.method, t.loop, t.images) == (method, loop, images)), None)

    for t in timings:
        ar = find("ar", t.loop, t.images)
        if ar is not None:
            t.speedup = ar.median_s / t.median_s
        graphs = (find(t.method, "host", t.images), find("ar", "host", t.images)) if t.loop == "round" else (t, ar)
        if all(g is not None and g.graph_s > 0 for g in graphs):
            t.predicted = graphs[1].graph_s / graphs[0].graph_s


@click.command()
@click.option("--arch", type=click.Choice(list(GPT_ARCHS)), default="GPT-XL", show_default=True, help="LlamaGen size.")
@click.option("--image-size", type=click.IntRange(min=16, max=1024), default=256, show_default=True,
              help="Pixels a side, a multiple of 16 (LlamaGen's VQ-16 grid).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True)
@click.option("--images", "images_text", default="1,8", show_default=True, help="Batch sizes (images).")
@click.option("--device", default="cuda", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1, max=100), default=2, show_default=True)
@click.option("--compile/--no-compile", "compile_step", default=None,
              help="The step compiled by torch.compile (default: on for CUDA).")
@click.option("--compile-mode", type=click.Choice(COMPILE_MODES), default="default",
              show_default=True)
@click.option("--methods", "methods_text", default="ar", show_default=True,
              help="Comma-separated methods, default parameters each (sd, cool-sd, lantern need --draft-arch).")
@click.option("--loop", "loops_text", default="auto", show_default=True,
              help="Decoding loop(s): auto, round, host, or a comma list (host,round) to time both.")
@click.option("--draft-arch", type=click.Choice(list(GPT_ARCHS)), default=None,
              help="A random draft model of this LlamaGen size (for sd, cool-sd, lantern).")
@click.option("--step-matmuls", type=click.Choice(STEP_MATMULS), default=None,
              help="How the blocks run their products (default: fused on CUDA, separate on a CPU).")
@click.option("--step-attention", type=click.Choice(STEP_ATTENTION), default=DEFAULT_STEP_ATTENTION,
              show_default=True, help="How the blocks attend over the static KV cache.")
def main(arch: str, image_size: int, dtype: str, images_text: str, device: str, repeats: int,
         compile_step: bool | None, compile_mode: str, methods_text: str, loops_text: str,
         draft_arch: str | None, step_matmuls: str | None, step_attention: str) -> None:
    """Time decoding end to end (tokens only) on random weights in LlamaGen's layout: plain AR, or
    the methods given, in the loops given."""
    from specrt.errors import SpecrtError

    try:
        _timed_run(arch, image_size, dtype, images_text, device, repeats, compile_step, compile_mode,
                   methods_text, loops_text, draft_arch, step_matmuls, step_attention)
    except SpecrtError as exc:  # a user's mistake: one line and exit 2, as the specrt commands do
        click.echo(f"specrt.bench.ar_timing: error: {exc}", err=True)
        sys.exit(2)


def _timed_run(arch: str, image_size: int, dtype: str, images_text: str, device: str, repeats: int,
               compile_step: bool | None, compile_mode: str, methods_text: str = "ar", loops_text: str = "auto",
               draft_arch: str | None = None, step_matmuls: str | None = None,
               step_attention: str = DEFAULT_STEP_ATTENTION) -> None:
    from specrt.bench.cost_model import parse_windows
    from specrt.bench.device import device_name
    from specrt.bench.settings import parse_loops
    from specrt.errors import SpecrtError
    from specrt.manifest import DEFAULT_MAX_IMAGES
    from specrt.runtime.methods import make_method
    from specrt.validation import torch_device

    device = torch_device(device)
    batches = parse_windows(images_text, "--images")
    if max(batches) > DEFAULT_MAX_IMAGES:
        raise SpecrtError(f"--images {max(batches)}: at most {DEFAULT_MAX_IMAGES} images a call")
    if image_size % 16:
        raise SpecrtError(f"--image-size {image_size}: a multiple of 16 (LlamaGen's VQ-16 grid)")
    methods = tuple(dict.fromkeys(m.strip() for m in methods_text.split(",") if m.strip()))
    for method in methods:
        if make_method(method).needs_draft and draft_arch is None:
            raise SpecrtError(f"--methods {method}: it drafts with a draft model; give --draft-arch (e.g. GPT-B)")
    loops = parse_loops(loops_text)
    timings = time_ar(arch, image_size, dtype, batches, device, repeats, compile_step, compile_mode,
                      methods=methods or ("ar",), loops=loops, draft_arch=draft_arch, step_matmuls=step_matmuls,
                      step_attention=step_attention)
    where = device_name("torch-cuda" if device.startswith("cuda") else "torch")
    how = "eager" if compile_step is False or (compile_step is None and not device.startswith("cuda")) else \
        f"compiled ({compile_mode})"
    click.echo(f"specrt AR, {arch} c2i random weights, {image_size} px, {dtype}, CFG 4, temperature 1, top-k 0, "
               f"tokens only; {how} step over a static KV cache, {step_matmuls or 'default'} matmuls, "
               f"{step_attention} attention; {where}; "
               f"median of {repeats} after a warm-up call"
               + (f"; draft {draft_arch}" if draft_arch else ""))
    several = len(methods) > 1 or len(loops) > 1
    extra = (f"  {'method':<10}{'loop':<7}{'acc.len':>8}{'speed-up':>9}{'pred.':>7}{'meas/pred':>10}"
             f"{'ops/round':>10}") if several else ""
    click.echo(f"{'batch':>5}  {'ms/image':>9}  {'ms/token':>9}  {'warm-up s':>9}{extra}")
    for t in timings:
        line = f"{t.images:>5}  {t.ms_per_image:>9.1f}  {t.ms_per_token:>9.2f}  {t.warmup_s:>9.1f}"
        if several:
            ratio = t.speedup / t.predicted if t.speedup and t.predicted else None
            line += (f"  {t.method:<10}{t.loop:<7}{t.accepted_length:>8.2f}{_num(t.speedup, 'x'):>9}"
                     f"{_num(t.predicted, 'x'):>7}{_num(ratio):>10}{t.round_ops if t.round_ops else '-':>10}")
        click.echo(line)


def _num(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


if __name__ == "__main__":
    main()
