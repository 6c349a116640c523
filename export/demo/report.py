"""`specrt demo report`: is the demo family good enough for acceptance rates to mean something?

Samples N images per class with plain AR + CFG, then reads them against real held-out
digits through the evaluator: class accuracy (recognisable as the asked-for digit?) and the
Fréchet distance to held-out images, printed next to the same distance between two
disjoint halves of real images (the floor a perfect model would reach at this sample
size). It also measures vanilla speculative decoding's mean accepted length with the demo
draft, the figure every speed-up of the demo rests on.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from specrt.lazy import require
from specrt.runtime.pipeline import Pipeline, from_uint8, to_uint8
from specrt.runtime.sampling import SamplingParams

torch = require("torch", "the demo report")

from specrt.export.demo.dataset import NUM_CLASSES, DigitsSplit  # noqa: E402
from specrt.export.demo.evaluator import embed, frechet_distance  # noqa: E402
from specrt.export.demo.store import DemoModels  # noqa: E402

SD_DRAFT_LEN = 4
SD_SEQUENCES_PER_CLASS = 2


def save_grid(images: np.ndarray, rows: int, path: str | Path, scale: int = 2) -> Path:
    """Write images [N,3,H,W] in [-1,1] as a PNG grid with `rows` rows (row r = class r)."""
    image_module = require("PIL.Image", "writing PNG grids")
    n, _, h, w = images.shape
    cols = -(-n // rows)
    canvas = np.zeros((rows * (h + 2), cols * (w + 2), 3), dtype=np.uint8)
    pixels = np.clip(images * 127.5 + 128.0, 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    for i in range(n):
        r, c = divmod(i, cols)
        canvas[r * (h + 2) + 1:r * (h + 2) + 1 + h, c * (w + 2) + 1:c * (w + 2) + 1 + w] = pixels[i]
    img = image_module.fromarray(canvas)
    img = img.resize((img.width * scale, img.height * scale), image_module.NEAREST)
    path = Path(path)
    img.save(path)
    return path


def demo_pipeline(models: DemoModels) -> Pipeline:
    """The runtime's PyTorch pipeline over the demo family (the same decoder users run)."""
    return Pipeline.from_torch(models.target, models.draft, models.vq)


def _sampling_kwargs(params: SamplingParams) -> dict:
    return {"cfg_scale": params.cfg_scale, "temperature": params.temperature, "top_k": params.top_k,
            "top_p": params.top_p}


def sample_per_class(models: DemoModels, per_class: int, params: SamplingParams, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """AR samples, `per_class` for each digit in class order -> (images [10·N,3,32,32] in [-1,1], labels).

    The images go through the uint8 pixels a user gets, so the evaluator judges those."""
    labels = np.repeat(np.arange(NUM_CLASSES), per_class)
    result = demo_pipeline(models).generate(labels, method="ar", seed=seed, **_sampling_kwargs(params))
    return from_uint8(result.images), labels


def quality_summary(models: DemoModels, split: DigitsSplit, per_class: int, seed: int = 0,
                    params: SamplingParams | None = None, draft_len: int = SD_DRAFT_LEN,
                    grid_path: str | Path | None = None, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Evaluator accuracy (real held-out, AR samples), Fréchet distances, SD accepted length;
    `progress` gets a line as each of the three steps starts and ends (minutes on a CPU)."""
    params = params or models.sampling_defaults
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    elapsed = lambda: f"{time.monotonic() - started:.0f} s"  # noqa: E731
    say(f"[1/3] AR samples: {per_class} per class, {per_class * NUM_CLASSES} images ...")
    images, labels = sample_per_class(models, per_class, params, seed)
    if grid_path is not None:
        save_grid(images, NUM_CLASSES, grid_path)
    say(f"[2/3] evaluator on the samples and the held-out digits ({elapsed()} so far) ...")
    feats, preds = embed(models.evaluator, images)
    as_pixels = lambda images: from_uint8(to_uint8(images))  # noqa: E731  real images, same uint8 path
    real_feats, real_preds = embed(models.evaluator, as_pixels(split.held_out_images))
    half_a, half_b = split.held_out_halves()
    feats_a, feats_b = embed(models.evaluator, as_pixels(half_a))[0], embed(models.evaluator, as_pixels(half_b))[0]
    n = min(len(feats), len(feats_b))  # same set sizes on both sides: FD is biased by sample size
    real_accuracy = float(np.mean(real_preds == split.held_out_labels))
    ar_accuracy = float(np.mean(preds == labels))

    sd_labels = np.repeat(np.arange(NUM_CLASSES), SD_SEQUENCES_PER_CLASS)
    say(f"[3/3] speculative decoding, draft_len {draft_len}: {len(sd_labels)} sequences ({elapsed()} so far) ...")
    stats = demo_pipeline(models).generate(sd_labels, method="sd", seed=seed + 1, draft_len=draft_len,
                                           **_sampling_kwargs(params)).stats
    say(f"done in {elapsed()}")
    return {
        "sampling": {"cfg_scale": params.cfg_scale, "temperature": params.temperature,
                     "top_k": params.top_k, "top_p": params.top_p},
        "samples_per_class": per_class,
        "held_out_real_accuracy": real_accuracy,
        "ar_sample_accuracy": ar_accuracy,
        "ar_accuracy_ratio": ar_accuracy / real_accuracy,
        "fd_ar_vs_real": frechet_distance(feats[:n], feats_a),
        "fd_real_vs_real": frechet_distance(feats_b[:n], feats_a),
        "fd_set_sizes": [n, len(feats_a)],
        "sd_draft_len": draft_len,
        "sd_sequences": len(sd_labels),
        "sd_mean_accepted_length": stats.mean_accepted_length,
    }


def format_summary(summary: dict) -> str:
    """The report as the CLI prints it."""
    s = summary["sampling"]
    sizes = summary["fd_set_sizes"]
    lines = [
        f"sampling: cfg_scale={s['cfg_scale']} temperature={s['temperature']} top_k={s['top_k']} top_p={s['top_p']}",
        f"evaluator accuracy, held-out real images : {summary['held_out_real_accuracy']:.3f}",
        f"evaluator accuracy, AR samples ({summary['samples_per_class']}/class) : {summary['ar_sample_accuracy']:.3f}"
        f"  ({summary['ar_accuracy_ratio']:.0%} of real)",
        f"Fréchet distance AR samples vs real      : {summary['fd_ar_vs_real']:.3f}  (sets {sizes[0]} vs {sizes[1]})",
        f"Fréchet distance real half vs real half  : {summary['fd_real_vs_real']:.3f}  (sets {sizes[0]} vs {sizes[1]})",
        f"speculative decoding, draft_len={summary['sd_draft_len']}: mean accepted length "
        f"{summary['sd_mean_accepted_length']:.2f} tokens/target step ({summary['sd_sequences']} sequences)",
    ]
    return "\n".join(lines)
