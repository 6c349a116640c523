"""`specrt demo ...`: the embedded demo model family (train it, report on its quality).

Thin layer: each flag is one argument of specrt.export.demo's train_demo / quality_summary.
torch is imported only when a subcommand runs, so `specrt --help` stays fast and works
without the export extra.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from specrt import validation
from specrt.errors import SpecrtError
from specrt.export.demo.registry import DEFAULT_DEMO, DEMOS, demo_names, get_demo
from specrt.runtime.threads import HELP as THREADS_HELP, checked as checked_threads, resolve as resolve_threads


@click.group(name="demo")
def group() -> None:
    """Train and evaluate the embedded demo models (digits, LlamaGen architecture)."""


@group.command(name="train")
@click.option("--demo", type=click.Choice(demo_names()), default=DEFAULT_DEMO, show_default=True,
              help="Which demo to train: " + "; ".join(f"{d.name}: {d.summary}" for d in DEMOS.values()) + ".")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the safetensors weights and demo.json.")
@click.option("--seed", default=0, show_default=True, help="Seed for every model's initialisation and batches.")
@click.option("--steps-scale", default=1.0, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="Multiply every model's training steps (e.g. 0.05 for a quick smoke run).")
@click.option("--threads", type=int, callback=checked_threads, help=f"{THREADS_HELP} (use 1 on a machine other jobs keep busy).")
@click.option("--no-eval", is_flag=True, help="Skip the sampling-quality summary at the end.")
def train(demo: str, out_dir: Path, seed: int, steps_scale: float, threads: int, no_eval: bool) -> None:
    """Train a demo family (c2i: tokenizer, target, draft and evaluator from scratch, CPU ~30 min;
    t2i: text encoder, target, draft and evaluator on top of the packaged c2i demo, ~44 min on a
    2-core CPU with --threads 2)."""
    from specrt.paths import output_folder

    output_folder("--out", out_dir, write_into_existing=True)
    entry = get_demo(demo)
    models = entry.hook("train")(out_dir, seed=seed, steps_scale=steps_scale, evaluate=not no_eval,
                                 threads=resolve_threads(threads))
    click.echo(f"wrote {out_dir} (training took {models.config['training']['seconds']['total']:.0f} s)")
    if "quality" in models.config:
        click.echo(entry.hook("format_quality")(models.config["quality"]))


@group.command(name="report")
@click.option("--weights", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A `specrt demo train` output folder (default: the packaged demo weights).")
@click.option("--per-class", default=18, show_default=True, type=click.IntRange(min=2),
              help="AR samples per digit class.")
@click.option("--grid", "grid_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the samples as a PNG grid, one row per class.")
@click.option("--seed", default=0, show_default=True)
@click.option("--cfg-scale", type=float, default=None, help="Override the demo's tuned CFG scale.")
@click.option("--temperature", type=float, default=None, help="Override the demo's tuned temperature.")
@click.option("--top-k", type=int, default=None, help="Override the demo's top-k (0 = off).")
@click.option("--draft-len", default=4, show_default=True, type=click.IntRange(min=1),
              help="Draft length for the speculative-decoding acceptance measurement.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the numbers as JSON.")
@click.option("--threads", type=int, callback=checked_threads, help=f"{THREADS_HELP}.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress lines on stderr.")
@click.option("--record", is_flag=True,
              help="Store these sampling settings as the weights' defaults and the numbers as their "
                   "\"quality\" entry in demo.json (needs --weights; for maintainers re-tuning the demo).")
def report(weights: Path | None, per_class: int, grid_path: Path | None, seed: int, cfg_scale: float | None,
           temperature: float | None, top_k: int | None, draft_len: int, json_path: Path | None,
           progress: bool, record: bool, threads: int) -> None:
    """The c2i demo: sample per class, print evaluator accuracy, Fréchet distances and SD accepted
    length (the t2i demo's figures: `specrt demo train --demo t2i` and `specrt bench --demo t2i`)."""
    import dataclasses

    import torch

    from specrt.export.demo import demo_dataset, load_demo
    from specrt.export.demo.report import format_summary, quality_summary

    from specrt.paths import output_file

    if record and weights is None:
        raise SpecrtError("--record rewrites a weights folder's demo.json: name it with --weights DIR")
    output_file("--grid", grid_path)
    output_file("--json", json_path)
    validation.seed(seed, "--seed")
    torch.set_num_threads(resolve_threads(threads))
    models = load_demo(weights)
    overrides = {k: v for k, v in (("cfg_scale", cfg_scale), ("temperature", temperature), ("top_k", top_k))
                 if v is not None}
    params = dataclasses.replace(models.sampling_defaults, **overrides)
    say = (lambda msg: click.echo(msg, err=True)) if progress else None
    summary = quality_summary(models, demo_dataset(), per_class, seed=seed, params=params, draft_len=draft_len,
                              grid_path=grid_path, progress=say)
    click.echo(format_summary(summary))
    if grid_path is not None:
        click.echo(f"wrote {grid_path}")
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    if record:
        from specrt.export.demo.store import update_config

        click.echo(f"updated {update_config(weights, sampling_defaults=summary['sampling'], quality=summary)}")
