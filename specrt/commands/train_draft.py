"""`specrt train-draft`: train an EAGLE draft head for a target (specrt.export.eagle.train).

Thin layer: the target comes from the demo or checkpoints (the same flags as export), the
data from the target's own samples, the demo's digits tokenised with its VQ, or token ids
in a .npy file; each training flag is one field of eagle.train.Recipe.
"""
from __future__ import annotations

from pathlib import Path

import click

from specrt import validation
from specrt.commands._checkpoint_flags import CheckpointFlags, checkpoint_flags
from specrt.errors import SpecrtError
from specrt.runtime.threads import HELP as THREADS_HELP, checked as checked_threads, resolve as resolve_threads

DATA_FILE = "train_data.npz"


def _target(target: Path | None, vq: Path | None, checkpoint: CheckpointFlags):
    from specrt.export import sources
    from specrt.export.demo.c2i import model_set

    if target is None and vq is None:
        models = model_set()
        return models, "demo:target"
    if target is None or vq is None:
        raise SpecrtError("train-draft on checkpoints needs --target and --vq (the VQ decodes nothing here, but "
                          "it fixes the grid); without both it trains for the demo target")
    target_choice, draft_choice = checkpoint.choices()
    models = sources.checkpoint_models(target, None, vq, target_choice, draft_choice, checkpoint.vq_arch,
                                       checkpoint.image_size, where="specrt train-draft")
    return models, str(target)


def _data(kind: str, models, count: int, tokens: Path | None, labels: Path | None, seed: int, threads: int,
          out: Path, resume: bool, progress: bool):
    """The training sequences, cached in OUT so --resume trains on exactly the same ones."""
    import numpy as np

    from specrt.export.eagle.train import TrainingData, target_samples

    cached = out / DATA_FILE
    if resume and cached.is_file():
        saved = np.load(cached)
        return TrainingData(saved["tokens"], saved["conditions"], str(saved["source"]))
    if kind == "samples":
        data = target_samples(models.target, models.vq, count, seed, threads, progress)
    elif kind == "images":
        if not hasattr(models.vq, "encode"):
            raise SpecrtError("--data images tokenises the demo's digits with its VQ; for checkpoints pass "
                              "--data tokens --tokens CODES.npy --labels LABELS.npy (or --data samples)")
        from specrt.export.demo import demo_dataset
        from specrt.export.demo.training import tokenize_shifted

        split = demo_dataset()
        codes, classes = tokenize_shifted(models.vq, split.train_images, split.train_labels, 1, progress)
        data = TrainingData(codes, classes.astype(np.int64), f"demo digits, VQ tokens ({len(codes)})")
    else:
        if tokens is None or labels is None:
            raise SpecrtError("--data tokens needs --tokens CODES.npy ([N, grid²] image token ids) and --labels "
                              "LABELS.npy ([N] class ids)")
        codes, classes = np.load(tokens).reshape(-1, models.target.config.grid_size**2), np.load(labels).reshape(-1)
        config = models.target.config
        if len(codes) != len(classes) or codes.min() < 0 or codes.max() >= config.vocab_size or \
                classes.min() < 0 or classes.max() > config.num_classes:
            raise SpecrtError(f"--tokens/--labels: need as many labels as rows, ids in [0, {config.vocab_size}) "
                              f"and classes in [0, {config.num_classes}]")
        data = TrainingData(codes.astype(np.int64), classes.astype(np.int64), f"tokens {tokens}")
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / DATA_FILE, tokens=data.tokens, conditions=data.conditions, source=data.source)
    return data


@click.command(name="train-draft")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the head (config.json + model.safetensors, LANTERN's layout) and the resume state.")
@click.option("--target", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="LlamaGen c2i GPT checkpoint (default: the demo target).")
@click.option("--vq", type=click.Path(dir_okay=False, exists=True, path_type=Path), help="Its VQ checkpoint.")
@click.option("--data", "data_kind", type=click.Choice(["samples", "images", "tokens"]), default="samples",
              show_default=True, help="samples: the target's own AR samples at its sampling defaults (Cool-SD); "
                                      "images: the demo's digits (shifted by up to 1 px) tokenised with its VQ; tokens: --tokens/--labels.")
@click.option("--samples", "sample_count", default=1024, show_default=True, help="Target samples to draw (--data samples).")
@click.option("--tokens", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="--data tokens: .npy of image token ids [N, grid²].")
@click.option("--labels", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="--data tokens: .npy of class ids [N].")
@click.option("--steps", default=2000, show_default=True, help="Optimiser steps.")
@click.option("--batch-size", default=32, show_default=True, help="Sequences per step.")
@click.option("--lr", default=1e-3, show_default=True, help="Peak AdamW learning rate (LANTERN: 1e-4 on LlamaGen-XL).")
@click.option("--uncond-fraction", default=0.1, show_default=True,
              help="Rows trained on the null class, so the head's CFG rows make sense.")
@click.option("--noise", default=0.2, show_default=True, help="Width of the uniform noise on input features (EAGLE).")
@click.option("--ce-weight", default=0.1, show_default=True, help="Weight of the cross-entropy term beside SmoothL1.")
@click.option("--head-n-head", type=int, default=None, help="The head's attention heads (default: the target's).")
@click.option("--head-ffn", "ffn_hidden", type=int, default=None, help="The head's MLP width (default: the target's).")
@click.option("--checkpoint-every", default=200, show_default=True, help="Save the resume state every N steps.")
@click.option("--resume", is_flag=True, help="Continue from OUT/train_state.pt (same flags).")
@click.option("--seed", default=0, show_default=True, help="Seed for the head, the batches, the noise and the samples.")
@click.option("--threads", type=int, default=None, callback=checked_threads, help=f"{THREADS_HELP} (use 1 on a shared machine).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@checkpoint_flags
def command(out, target, vq, data_kind, sample_count, tokens, labels, steps, batch_size, lr, uncond_fraction, noise,
            ce_weight, head_n_head, ffn_hidden, checkpoint_every, resume, seed, threads, no_progress,
            checkpoint) -> None:
    """Train an EAGLE draft head for a target: SmoothL1 on the next feature + ce_weight × cross-entropy
    through the frozen lm_head, noisy input features, some unconditional rows (EAGLE / LANTERN).

    The head (LANTERN's drafter layout) goes to OUT; `specrt export --eagle OUT` bundles it and
    `Pipeline.from_torch(target, load_eagle_head(OUT, target), vq)` runs it."""
    from specrt.lazy import require
    from specrt.paths import output_folder

    output_folder("--out", out, write_into_existing=True)  # a run resumes into its own folder
    checkpoint.refuse("describes a draft checkpoint; train-draft trains a head for the --target",
                      "draft_arch", "draft_n_head", "draft_n_kv_head")
    if target is None and vq is None:
        checkpoint.refuse("describes LlamaGen checkpoints (--target/--vq); the demo target has a fixed architecture "
                          "and image size")
    torch = require("torch", "specrt train-draft")
    from specrt.models.eagle_head import EagleConfig
    from specrt.export.eagle.train import Recipe, metrics_line, train_eagle_head

    recipe = Recipe(steps=validation.count("--steps", steps), batch_size=validation.count("--batch-size", batch_size),
                    lr=validation.number("--lr", lr, 0.0, 1.0, low_open=True),
                    ce_weight=validation.number("--ce-weight", ce_weight, 0.0, 100.0),
                    noise=validation.number("--noise", noise, 0.0, 100.0),
                    uncond_fraction=validation.number("--uncond-fraction", uncond_fraction, 0.0, 1.0),
                    checkpoint_every=validation.count("--checkpoint-every", checkpoint_every),
                    seed=validation.seed(seed))
    sample_count = validation.count("--samples", sample_count)
    threads = resolve_threads(threads)
    torch.set_num_threads(threads)
    models, source = _target(target, vq, checkpoint)
    if models.target.config.model_type != "c2i":
        raise SpecrtError("train-draft trains heads for class-conditional (c2i) targets so far")
    try:
        config = EagleConfig.for_target(models.target, n_head=head_n_head, ffn_hidden=ffn_hidden)
    except ValueError as exc:
        raise SpecrtError(f"--head-n-head / --head-ffn: {exc}") from None
    data = _data(data_kind, models, sample_count, tokens, labels, recipe.seed, threads, out, resume, not no_progress)
    click.echo(f"training an EAGLE head for {source} on {data.source}: {recipe.steps} steps of {recipe.batch_size}")
    _head, metrics = train_eagle_head(models.target, data, out, recipe, config, resume=resume,
                                      progress=not no_progress, target_source=source)
    click.echo(f"wrote {out} {metrics_line(metrics)}")
