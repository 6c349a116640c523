"""`specrt bench`: every method's speed and fidelity side by side in one run.

Flags map onto specrt.bench: BUNDLE / --backend / --demo-weights / --threads onto
open_models, --methods / --sweep onto build_settings, --images / --seed onto benchmark,
--json / --plot onto write_json / write_plot. --profile-arch switches to the cost model
(measure_step_latency + predicted_speedup) instead of a benchmark run.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import click

from specrt.bench.models import BACKENDS
from specrt import validation
from specrt.errors import SpecrtError

DEFAULT_IMAGES = 180  # 18 per class; the FD noise floor can use 179 real images (half B)


def _committed_results() -> Path:
    from specrt.bench import results

    return Path(results.__file__).resolve().parent / "demo.json"


def _profile(arch: str, results_path: Optional[Path], windows: str, repeats: int, device: str,
             threads: int, json_path: Optional[Path], plot_path: Optional[Path], demo_weights: Optional[Path]) -> None:
    from specrt.bench.cost_model import (
        PROFILE_ARCHS, measure_runners, measure_step_latency, parse_windows, prediction_table, write_profile_plot,
    )
    from specrt.bench.device import device_name
    from specrt.lazy import require

    if arch not in PROFILE_ARCHS:
        raise SpecrtError(f"unknown --profile-arch {arch!r}; choose from {', '.join(PROFILE_ARCHS)}")
    window_list = parse_windows(windows)
    results_path = results_path or _committed_results()
    if not results_path.is_file():
        raise SpecrtError(f"no bench results at {results_path}; run `specrt bench --json FILE` first")
    try:
        bench = json.loads(results_path.read_text())
        measured = bench["results"]
    except (ValueError, KeyError) as exc:
        raise SpecrtError(f"{results_path} is not a `specrt bench --json` file") from exc
    require("torch", "specrt bench --profile-arch").set_num_threads(threads)
    say = lambda msg: click.echo(msg, err=True)  # noqa: E731
    latency = measure_step_latency(arch, window_list, repeats=repeats, device=device, progress=say)
    # the demo's own graphs on onnxruntime, as the default bench runs them: why its speed-ups differ
    from specrt.bench.models import demo_bundle
    from specrt.runtime.pipeline import Pipeline

    pipe = Pipeline.from_bundle(demo_bundle(demo_weights, progress=say), threads=threads)
    reference = measure_runners("demo (ort)", pipe.target, pipe.draft, window_list, repeats)
    where = device_name("torch-cuda" if device.startswith("cuda") else "torch")
    table, predictions = prediction_table(latency, measured, reference)
    click.echo(f"\nstep latency, batch 2 (CFG pair), cache half full, on {where}, {threads} thread(s): {arch} "
               f"(random weights) on PyTorch, the demo's exported graphs on onnxruntime")
    click.echo(table)
    click.echo(f"predicted speed-up = accepted length x t(1) / (t(W) + drafts x t_draft); accepted lengths from "
               f"{results_path} ({bench.get('device', '?')}, {bench.get('backend', '?')})")
    if json_path:
        from specrt.bench.report import write_json

        write_json(str(json_path), {"device": where, "arch": arch, "threads": threads,
                                    "accepted_lengths_from": str(results_path), "windows": latency.windows,
                                    "target_step_s": latency.target_s, "draft_step_s": latency.draft_s,
                                    "demo_target_step_s": reference.target_s, "demo_draft_step_s": reference.draft_s,
                                    "predictions": predictions})
        click.echo(f"wrote {json_path}")
    if plot_path:
        write_profile_plot(str(plot_path), latency, predictions, f"target step latency against W on {where}",
                           reference)
        click.echo(f"wrote {plot_path}")


@click.command(name="bench")
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--methods", default=None, metavar="LIST",
              help="Comma-separated methods (default: ar,sd,cool-sd,lantern,sjd,sjd-pac). ar is always measured.")
@click.option("--sweep", "sweeps", multiple=True, metavar="METHOD:KEY=V1,V2",
              help="One setting per value, e.g. cool-sd:delta=1.5,2.5,4 (repeatable; KEY=..;KEY=.. crosses). "
                   "Default without --methods/--sweep: cool-sd:delta=1.5,2.5,4.")
@click.option("--backend", type=click.Choice(BACKENDS), default="ort", show_default=True,
              help="ort: the bundle (demo: exported once into the cache) on onnxruntime; ort-cuda / ort-trt: onnxruntime's "
                   "CUDA / TensorRT providers; trt: engines from `specrt build`; torch: the demo's PyTorch modules.")
@click.option("--images", type=click.IntRange(min=1), default=DEFAULT_IMAGES, show_default=True,
              help="Images per setting (classes cycle). The demo's FD noise floor has 179 real images to compare "
                   "at most; far fewer make Fréchet distances mostly noise.")
@click.option("--seed", type=int, default=0, show_default=True, help="Image i uses seed+i for every setting.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="CPU threads for onnxruntime / torch (single-stream latency; 1 is steadiest on a shared CPU).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of the speed–fidelity trade-off (with --profile-arch: step latency against W).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the table as Markdown (for a README).")
@click.option("--demo-weights", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A `specrt demo train` folder instead of the packaged demo weights.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the exported demo bundle is kept (default: ~/.cache/specrt/bench).")
@click.option("--profile-arch", metavar="ARCH",
              help="Instead of a run: time target steps of this LlamaGen architecture (random weights) against W, "
                   "e.g. llamagen-c2i-B, and predict each method's speed-up from measured accepted lengths.")
@click.option("--results", "results_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--profile-arch: bench JSON with the accepted lengths (default: the committed demo results).")
@click.option("--windows", default="1,2,4,8,16,32,64", show_default=True, help="--profile-arch: windows W to time.")
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True,
              help="--profile-arch: timed rounds per W (the fastest counts).")
@click.option("--device", default="cpu", show_default=True, help="--profile-arch: torch device (cpu, cuda).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
def command(bundle, methods, sweeps, backend, images, seed, threads, json_path, plot_path, markdown_path, demo_weights,
            cache_dir, profile_arch, results_path, windows, repeats, device, progress) -> None:
    """Measure every method's speed and fidelity side by side (the embedded demo by default)."""
    validation.seed(seed, "--seed")  # image i uses seed + i: checked before anything loads
    if profile_arch:
        _profile(profile_arch, results_path, windows, repeats, device, threads, json_path, plot_path, demo_weights)
        return
    from tqdm import tqdm

    from specrt.bench.models import open_models
    from specrt.bench.run import benchmark, planned_images
    from specrt.bench.settings import DEFAULT_METHODS, DEFAULT_SWEEPS, build_settings

    started = time.perf_counter()
    chosen = methods is not None or bool(sweeps)
    if not chosen:
        sweeps = DEFAULT_SWEEPS
    settings = build_settings(methods or ",".join(DEFAULT_METHODS), sweeps)  # validate before loading anything
    say = (lambda msg: click.echo(msg, err=True)) if progress else None
    models = open_models(bundle, backend, demo_weights, threads, cache_dir, progress=say)
    settings = _draft_free_if_needed(settings, models, chosen)
    bar = tqdm(total=planned_images(settings, images), unit="img", disable=not progress, dynamic_ncols=True,
               leave=False, mininterval=0.5)

    def tick(setting) -> None:
        bar.set_description(setting.label, refresh=False)
        bar.update()
    try:
        run = benchmark(models, settings, images, seed, threads, on_image=tick)
    finally:
        bar.close()
    run.payload["settings"]["wall_time_s"] = round(time.perf_counter() - started, 1)
    _print_run(run)
    _write_outputs(run, json_path, markdown_path, plot_path)


def _draft_free_if_needed(settings: list, models, chosen: bool) -> list:
    """A bundle without a draft runs the draft-free methods: the default list drops the others
    (saying so), an explicit choice of them is a one-line error naming how to get a draft."""
    from specrt.bench.settings import needing_draft

    drafted = needing_draft(settings) if models.pipeline.draft is None else []
    if not drafted:
        return settings
    labels = ", ".join(s.label for s in drafted)
    if chosen:
        raise SpecrtError(f"{labels} need a draft model and {models.bundle} has none: re-export it with "
                          "`specrt export --draft DRAFT.pt ...` or `specrt quantize BUNDLE --out OUT --self-draft int4`, "
                          "or measure ar, sjd, sjd-pac")
    click.echo(f"no draft model in {models.bundle}: measuring the draft-free methods only", err=True)
    return [s for s in settings if s not in drafted]


def _print_run(run) -> None:
    """The final table, the noise floor, the time breakdown and the run time."""
    from specrt.bench.report import format_breakdown, format_fd, format_table

    info, settings = run.payload, run.payload["settings"]
    click.echo(f"device: {info['device']}  backend: {info['backend']} ({settings['threads']} thread(s))  "
               f"bundle: {info['bundle']}")
    click.echo(f"{settings['images_per_setting']} images per setting, interleaved in random order; "
               "speed-up = median latency of ar / setting")
    click.echo(format_table(run.results))
    floor = settings["fd_noise_floor"]
    if floor and floor["frechet_distance"] is not None:
        acc = floor.get("real_class_accuracy")
        click.echo(f"FD noise floor (real vs real, {floor['images']} vs {floor['reference_images']} images, "
                   f"{floor['feature_dim']}-d evaluator features): {format_fd(floor)}"
                   + (f"; evaluator accuracy on real held-out digits: {acc:.3f}" if acc is not None else ""))
    click.echo("\ntime per image, ms (means; other = Python orchestration between model calls)")
    click.echo(format_breakdown(run.results))
    click.echo(f"\nrun time {settings['wall_time_s']:.0f} s")


def _write_outputs(run, json_path: Optional[Path], markdown_path: Optional[Path], plot_path: Optional[Path]) -> None:
    from specrt.bench.report import format_markdown, write_json, write_plot

    info = run.payload
    if json_path:
        write_json(str(json_path), info)
        click.echo(f"wrote {json_path}")
    if markdown_path:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(format_markdown(info), encoding="utf-8")
        click.echo(f"wrote {markdown_path}")
    if plot_path:
        title = (f"{info['bundle'].split(' (')[0]} on {info['backend']}, {info['device']}, "
                 f"{info['settings']['images_per_setting']} images/setting")
        write_plot(str(plot_path), run.results, title, fd_floor=run.fd_floor)
        click.echo(f"wrote {plot_path}")
