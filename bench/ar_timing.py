"""Plain AR end to end on a LlamaGen architecture with random weights: ms per image and per token.

Why: the figure a user compares with LlamaGen's own sample_c2i.py (its generate() under
torch.compile) on the same GPU. Acceptance does not matter for AR, so random weights in
LlamaGen's layout time exactly what a checkpoint would; the VQ decoder is skipped
(generate(decode=False)), as tokens are what the two scripts share.

    python -m specrt.bench.ar_timing --arch GPT-XL --image-size 256 --dtype bf16 --images 1,8 --device cuda

The first generate of each batch size is the warm-up (compiling and capturing each step's CUDA
graph); it is reported on its own, then the median of `--repeats` timed runs.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

import click

from specrt.bench.cost_model import torch_dtype
from specrt.export.llamagen_gpt import GPT_ARCHS
from specrt.runtime.backends.compiled_step import COMPILE_MODES
from specrt.lazy import require


@dataclass
class ARTiming:
    """One batch size's AR timing (seconds): the warm-up call and the median of the timed ones."""

    images: int
    tokens: int
    warmup_s: float
    median_s: float

    @property
    def ms_per_image(self) -> float:
        return 1000 * self.median_s / self.images

    @property
    def ms_per_token(self) -> float:
        """Wall time per decoding step (a step decodes one token of every image in the batch)."""
        return 1000 * self.median_s / self.tokens


def time_ar(arch: str, image_size: int, dtype: str, batches: tuple[int, ...], device: str, repeats: int,
            compile: bool | None, compile_mode: str = "default", cfg_scale: float = 4.0) -> list[ARTiming]:
    """AR timings of `arch` (a GPT_ARCHS name) at each batch size (images, each a CFG pair)."""
    torch = require("torch", "specrt.bench.ar_timing")
    from specrt.export.llamagen_gpt import GPT, gpt_config
    from specrt.export.llamagen_vq import VQConfig, VQModel
    from specrt.runtime.pipeline import Pipeline

    torch.manual_seed(0)
    config = gpt_config(arch, image_size=image_size)
    with torch.device(device):
        target = GPT(config).to(torch_dtype(dtype))
        vq = VQModel(VQConfig(codebook_size=config.vocab_size))
    pipe = Pipeline.from_torch(target, None, vq, device=device, max_window=1, compile=compile,
                               compile_mode=compile_mode, max_images=max(batches))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    timings = []
    for images in batches:
        classes = [i % config.num_classes for i in range(images)]

        def run() -> float:
            sync()
            start = time.perf_counter()
            pipe.generate(classes, method="ar", seed=0, decode=False, cfg_scale=cfg_scale, temperature=1.0,
                          top_k=0, top_p=1.0)
            sync()
            return time.perf_counter() - start

        warmup = run()
        timings.append(ARTiming(images, config.num_image_tokens, warmup,
                                statistics.median(run() for _ in range(repeats))))
    return timings


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
def main(arch: str, image_size: int, dtype: str, images_text: str, device: str, repeats: int,
         compile_step: bool | None, compile_mode: str) -> None:
    """Time plain AR end to end (tokens only) on random weights in LlamaGen's layout."""
    from specrt.errors import SpecrtError

    try:
        _timed_run(arch, image_size, dtype, images_text, device, repeats, compile_step, compile_mode)
    except SpecrtError as exc:  # a user's mistake: one line and exit 2, as the specrt commands do
        click.echo(f"specrt.bench.ar_timing: error: {exc}", err=True)
        sys.exit(2)


def _timed_run(arch: str, image_size: int, dtype: str, images_text: str, device: str, repeats: int,
               compile_step: bool | None, compile_mode: str) -> None:
    from specrt.bench.cost_model import parse_windows
    from specrt.bench.device import device_name
    from specrt.errors import SpecrtError
    from specrt.manifest import DEFAULT_MAX_IMAGES
    from specrt.validation import torch_device

    device = torch_device(device)
    batches = parse_windows(images_text, "--images")
    if max(batches) > DEFAULT_MAX_IMAGES:
        raise SpecrtError(f"--images {max(batches)}: at most {DEFAULT_MAX_IMAGES} images a call")
    if image_size % 16:
        raise SpecrtError(f"--image-size {image_size}: a multiple of 16 (LlamaGen's VQ-16 grid)")
    timings = time_ar(arch, image_size, dtype, batches, device, repeats, compile_step, compile_mode)
    where = device_name("torch-cuda" if device.startswith("cuda") else "torch")
    how = "eager" if compile_step is False or (compile_step is None and not device.startswith("cuda")) else \
        f"compiled ({compile_mode})"
    click.echo(f"specrt AR, {arch} c2i random weights, {image_size} px, {dtype}, CFG 4, temperature 1, top-k 0, "
               f"tokens only; {how} step over a static KV cache; {where}; median of {repeats} after a warm-up call")
    click.echo(f"{'batch':>5}  {'ms/image':>9}  {'ms/token':>9}  {'warm-up s':>9}")
    for t in timings:
        click.echo(f"{t.images:>5}  {t.ms_per_image:>9.1f}  {t.ms_per_token:>9.2f}  {t.warmup_s:>9.1f}")


if __name__ == "__main__":
    main()
