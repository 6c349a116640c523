"""`specrt bench`: every method's speed and fidelity side by side in one run.

Flags map onto specrt.bench: BUNDLE / --backend / --demo-weights / --threads onto
open_models, --methods / --sweep onto build_settings, --images / --seed onto benchmark,
--json / --plot onto write_json / write_plot, --loop onto each pipeline's `loop` (several: a
setting per loop, build_settings). --profile-arch switches to the cost model
(measure_step_latency + predicted_speedup) instead of a benchmark run.
"""
from __future__ import annotations

import importlib
import json
import time
import warnings
from pathlib import Path
from typing import Optional

import click

from specrt.bench.models import BACKENDS
from specrt.commands._help import COMMON, DEMO_SHORT_HELP, sectioned
from specrt.commands._path_flags import nonblank
from specrt.export.demo.registry import DEFAULT_DEMO, demo_names
from specrt import validation
from specrt.errors import SpecrtError, SpecrtWarning
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION, STEP_ATTENTION, STEP_MATMULS, step_matmuls_for
from specrt.runtime.backends.compiled_step import COMPILE_MODES
from specrt.runtime.threads import checked as checked_threads

PLOT_FORMATS = {".png": "PNG"}  # what --plot writes (matplotlib's PNG)
DEFAULT_IMAGES = 180  # 18 per class; the FD noise floor can use 179 real images (half B); run.FIDELITY_IMAGES


def _committed_results() -> Path:
    from specrt.bench import results

    return Path(results.__file__).resolve().parent / "demo.json"


def _profile(arch: str, results_path: Optional[Path], windows: str, repeats: int, device: str,
             threads: int, json_path: Optional[Path], plot_path: Optional[Path], demo_weights: Optional[Path],
             images_list: str = "1", dtypes: str = "fp32", cuda_graphs: bool = True,
             precisions: tuple[str, ...] = (), compile_step: Optional[bool] = None, compile_mode: str = "default",
             step_matmuls: Optional[str] = None, step_attention: str = DEFAULT_STEP_ATTENTION) -> None:
    from specrt.bench.cost_model import (
        DTYPES, PROFILE_ARCHS, measure_step_latency, memory_bandwidth, parse_windows,
        prediction_table, profile_config, write_profile_plot,
    )
    from specrt.bench.device import device_name
    from specrt.lazy import require

    if arch not in PROFILE_ARCHS:
        raise SpecrtError(f"unknown --profile-arch {arch!r}; choose from {', '.join(PROFILE_ARCHS)}")
    from specrt.manifest import DEFAULT_MAX_IMAGES
    from specrt.runtime.methods import checked_max_window

    step_matmuls = _step_kernels(device, step_matmuls, step_attention)
    window_list = parse_windows(windows)
    checked_max_window(max(window_list), profile_config(arch).num_image_tokens, "--windows")
    batches = parse_windows(images_list, "--profile-images")  # the same rule: positive integers
    if max(batches) > DEFAULT_MAX_IMAGES:
        raise SpecrtError(f"--profile-images {max(batches)}: at most {DEFAULT_MAX_IMAGES} images a step (a bundle's "
                          f"default --max-batch)")
    dtype_list = [d.strip() for d in dtypes.split(",") if d.strip()]
    unknown = [d for d in dtype_list if d not in DTYPES] or ([] if dtype_list else [dtypes])
    if unknown:
        raise SpecrtError(f"--profile-dtypes {dtypes!r}: choose from {', '.join(DTYPES)}")
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
    on_gpu = device.startswith("cuda")
    curves = [measure_step_latency(arch, window_list, repeats=repeats, device=device, progress=say, images=images,
                                   dtype=dtype, cuda_graphs=cuda_graphs, compile=compile_step, compile_mode=compile_mode,
                                   step_matmuls=step_matmuls, step_attention=step_attention)
              for dtype in dtype_list for images in batches]
    bandwidth = memory_bandwidth(device)
    reference = _profile_reference(window_list, repeats, device, threads, demo_weights, say, cuda_graphs, compile_step)
    where = device_name("torch-cuda" if on_gpu else "torch")
    how = (" as CUDA graphs" if cuda_graphs else " eager (no CUDA graphs)") if on_gpu else ""
    click.echo(f"\nstep latency, cache half full, on {where}, {threads} thread(s): {arch} (random weights) on PyTorch"
               f"{how}, the demo's {'PyTorch modules on the same device' if on_gpu else 'exported graphs on onnxruntime'}")
    if bandwidth:
        click.echo(f"memory bandwidth (device-to-device copy, read + write): {bandwidth / 1e12:.2f} TB/s")
    entries = []
    for curve in curves:
        table, predictions = prediction_table(curve, measured, reference)
        floor = curve.bytes_per_step / bandwidth if bandwidth and curve.bytes_per_step else None
        click.echo(f"\n== {arch} {curve.dtype}, {curve.images} image(s) per step ({2 * curve.images} rows with CFG), "
                   f"{'compiled' if curve.compiled else 'eager'} step over a static KV cache, {step_matmuls} matmuls, "
                   f"{step_attention} attention")
        if curve.ops_per_step:
            what = "GPU kernels" if on_gpu else "compute ops"
            click.echo(f"{what} per W={curve.windows[0]} step: {curve.ops_per_step} ({curve.ops_per_layer:.1f} per layer, "
                       f"{curve.layers} layers)" + (f"; compiling took {curve.compile_s:.1f} s" if curve.compiled else ""))
        if floor:
            click.echo(f"bytes read per step (weights + KV): {curve.bytes_per_step / 1e6:.0f} MB -> memory-bound floor "
                       f"{1000 * floor:.2f} ms; t(1) = {1000 * curve.target_s[0]:.2f} ms = "
                       f"{curve.target_s[0] / floor:.1f}x the floor")
        click.echo(table)
        entries.append({"dtype": curve.dtype, "images": curve.images, "windows": curve.windows,
                        "target_step_s": curve.target_s, "draft_step_s": curve.draft_s,
                        "bytes_per_step": curve.bytes_per_step, "memory_bound_floor_s": floor,
                        "ops_per_step": curve.ops_per_step, "ops_per_layer": curve.ops_per_layer,
                        "compiled": curve.compiled, "compile_s": curve.compile_s,
                        "step_matmuls": step_matmuls, "step_attention": step_attention,
                        "predictions": predictions})
    click.echo(f"\npredicted speed-up = accepted length x t(1) / (straggle x (t(W) + drafts x t_draft)), straggle = "
               f"target steps a batch ran per image round in the --batch run (1 at batch 1); accepted lengths from "
               f"{results_path} ({bench.get('device', '?')}, {bench.get('backend', '?')})")
    onnx_curves = {}
    if precisions:
        from specrt.bench.onnx_profile import measure_onnx_steps, onnx_table

        onnx_curves = measure_onnx_steps(arch, window_list, repeats, threads, precisions, progress=say)
        click.echo(f"\n{arch}'s exported target step on onnxruntime ({threads} thread(s)), same feeds; int4 = "
                   "`specrt quantize --mode int4` (MatMulNBits, block 32, accuracy_level 4)")
        click.echo(onnx_table(onnx_curves))
    if json_path:
        from specrt.bench.report import write_json

        first = entries[0]
        write_json(str(json_path), {"device": where, "arch": arch, "threads": threads,
                                    "cuda_graphs": bool(cuda_graphs and on_gpu),
                                    "accepted_lengths_from": str(results_path),
                                    "memory_bandwidth_bytes_per_s": bandwidth,
                                    "windows": first["windows"], "target_step_s": first["target_step_s"],
                                    "draft_step_s": first["draft_step_s"], "dtype": first["dtype"],
                                    "images": first["images"],
                                    "demo_target_step_s": reference.target_s, "demo_draft_step_s": reference.draft_s,
                                    "predictions": first["predictions"], "curves": entries,
                                    "onnxruntime_target_step_s": {p: c.target_s for p, (c, _) in onnx_curves.items()},
                                    "onnxruntime_weight_bytes_per_step": {p: b for p, (_, b) in onnx_curves.items()}})
        click.echo(f"wrote {json_path}")
    if plot_path:
        write_profile_plot(str(plot_path), curves[0], entries[0]["predictions"],
                           f"target step latency against W on {where}", reference, more=tuple(curves[1:]))
        click.echo(f"wrote {plot_path}")


def _profile_reference(windows, repeats: int, device: str, threads: int, demo_weights: Optional[Path], say,
                       cuda_graphs: bool = True, compile_step: Optional[bool] = None):
    """The demo's own step costs beside the architecture's: its exported graphs on onnxruntime
    (as the default bench runs them) on a CPU, its PyTorch modules on the same GPU otherwise."""
    from specrt.bench.cost_model import measure_runners
    from specrt.runtime.pipeline import Pipeline

    if device.startswith("cuda"):
        from specrt.export.demo import load_demo

        demo = load_demo(demo_weights)
        pipe = Pipeline.from_torch(demo.target, demo.draft, demo.vq, device=device, cuda_graphs=cuda_graphs,
                                   compile=compile_step)
        return measure_runners("demo (torch)", pipe.target, pipe.draft, windows, repeats, device)
    from specrt.bench.models import demo_bundle

    pipe = Pipeline.from_bundle(demo_bundle(demo_weights, progress=say), threads=threads)
    return measure_runners("demo (ort)", pipe.target, pipe.draft, windows, repeats)


def _loops(text: str, backend: str, profile_arch: Optional[str], precision: Optional[str]) -> tuple[str, ...]:
    """--loop's loops (bench.settings.parse_loops), refused in one line where no loop is chosen: the
    step profile times single steps, bundles (every backend but torch) run the host loop."""
    from specrt.bench.settings import parse_loops

    loops = parse_loops(text)
    if loops == ("auto",):
        return loops
    if profile_arch:
        raise SpecrtError("--loop picks how a bench run decodes; --profile-arch times single target steps")
    if precision is not None:
        raise SpecrtError("--loop picks how the torch backend decodes; --precision runs bundles, on the host loop")
    if "round" in loops and backend != "torch":
        raise SpecrtError(f"--loop round runs on --backend torch (the demo's PyTorch modules); --backend {backend} "
                          "runs the host loop")
    return loops


def _precisions(text: str) -> tuple[str, ...]:
    """'fp32,int4' -> ('fp32', 'int4'); 'none' -> ()."""
    if text.strip().lower() == "none":
        return ()
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise SpecrtError(f"--precision {text!r}: expected a comma-separated list such as fp32,int4")
    return names


def _step_kernels(device: str, step_matmuls: Optional[str], step_attention: str) -> str:
    """The step matmuls the torch step runs on `device` (the device's default where none is asked),
    after refusing a Triton kernel off CUDA: on a CPU its torch reference would be timed instead."""
    for flag, triton in (("--step-matmuls skinny", step_matmuls == "skinny"),
                         ("--step-attention triton", step_attention == "triton")):
        if triton and not device.startswith("cuda"):
            raise SpecrtError(f"{flag} times a Triton kernel on a CUDA --device; on a CPU its torch reference "
                              f"would be timed instead")
    return step_matmuls_for("cuda" if device.startswith("cuda") else "cpu", step_matmuls)


def _batches(text: str) -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16): images per generate call, each a positive integer."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SpecrtError(f"--batch {text!r}: expected a comma-separated list such as 1,4,16")
    return tuple(dict.fromkeys(validation.count("--batch", part) for part in parts))


@sectioned("bench", sections=[
    (COMMON, ["methods", "sweeps", "demo", "images", "seed", "json_path", "plot_path", "help"]),
    ("Models and inputs", ["drafts", "demo_weights", "prompts_path", "cache_dir"]),
    ("Runs", ["batch_text", "precision"]),
    ("Output", ["keep_tokens", "markdown_path", "progress"]),
    ("Performance", ["backend", "threads", "device", "loop_text", "cuda_graphs", "compile_step", "compile_mode",
                     "step_matmuls", "step_attention"]),
    ("Step profile (--profile-arch)", ["profile_arch", "results_path", "windows", "repeats", "profile_images",
                                       "profile_dtypes"]),
    ("Serving under load (--serve)", ["serve", "serve_url", "in_process", "loads", "rate_seconds",
                                      "overload_seconds", "saturation_seconds", "slots", "groups", "max_queue"]),
])
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--methods", default=None, metavar="LIST",
              help="Comma-separated methods (default: ar,sd,cool-sd,lantern,sjd,sjd-pac,auto). ar is always measured; "
                   "auto: one more row, the lossless setting `generate --method auto` chooses here (measured afresh "
                   "before the timed run, at the first --batch).")
@click.option("--sweep", "sweeps", multiple=True, metavar="METHOD:KEY=V1,V2",
              help="One setting per value, e.g. cool-sd:delta=1.5,2.5,4 (repeatable; KEY=..;KEY=.. crosses). "
                   "Default without --methods/--sweep: cool-sd:delta=1.5,2.5,4 and "
                   "sjd:coupling=independent,maximal,gumbel.")
@click.option("--drafts", "drafts", default=None, metavar="LIST",
              help="Run every drafted setting once per draft, side by side: independent (the demo's draft GPT), "
                   "eagle (the demo's EAGLE head on the same target), e.g. --drafts independent,eagle.")
@click.option("--backend", type=click.Choice(BACKENDS), default="ort", show_default=True,
              help="ort: the bundle (demo: exported once into the cache) on onnxruntime; ort-cuda / ort-trt: onnxruntime's "
                   "CUDA / TensorRT providers; trt: engines from `specrt build`; torch: the demo's PyTorch modules.")
@click.option("--images", type=click.IntRange(min=1), default=DEFAULT_IMAGES, show_default=True,
              help="Images per setting (classes cycle). The demo's FD noise floor has 179 real images to compare "
                   "at most; far fewer make Fréchet distances mostly noise.")
@click.option("--seed", type=int, default=0, show_default=True, help="Image i uses seed+i for every setting.")
@click.option("--batch", "batch_text", default="1", show_default=True, metavar="LIST",
              help="Images per generate call, e.g. 1,4,16: every setting runs at every batch size (same images, "
                   "same tokens); latency is per image (call time / images), speed-up against ar at the same batch.")
@click.option("--threads", type=int, default=1, show_default=True, callback=checked_threads,
              help="CPU threads per model call (intra-op, the same for onnxruntime and torch); 1 gives the steadiest "
                   "single-stream latency on a shared CPU.")
@click.option("--tokens", "keep_tokens", is_flag=True,
              help="Also write every image's tokens into --json (results[].tokens, [grid][grid] per image, image i "
                   "= class i mod classes, seed + i), to compare settings or backends offline.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the results as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG (a .png name; without a suffix .png is added) of the speed–fidelity trade-off "
                   "(with --profile-arch: step latency against W).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the table as Markdown (for a README).")
@click.option("--prompts", "prompts_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Text-to-image: one prompt a line (# comments and blank lines skipped); image i uses prompt "
                   "i mod count. Default: the t2i demo's 80 prompts (every digit × thick/thin × slanted/upright "
                   "× wide/narrow).")
@click.option("--demo-weights", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A `specrt demo train` folder instead of the packaged weights of the demo.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the exported demo bundle is kept (default: ~/.cache/specrt/bench; created if missing).")
@click.option("--profile-arch", metavar="ARCH",
              help="Instead of a run: time target steps of this LlamaGen architecture (random weights) against W, "
                   "e.g. llamagen-c2i-B, and predict each method's speed-up from measured accepted lengths.")
@click.option("--results", "results_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--profile-arch: bench JSON with the accepted lengths (default: the committed demo results).")
@click.option("--windows", default="1,2,4,8,16,32,64", show_default=True, help="--profile-arch: windows W to time.")
@click.option("--repeats", type=click.IntRange(min=1, max=1000), default=7, show_default=True,
              help="--profile-arch: timed rounds per W (the fastest counts).")
@click.option("--profile-images", default="1", show_default=True, metavar="LIST",
              help="--profile-arch: images per step to time (each a CFG pair of rows), e.g. 1,8.")
@click.option("--profile-dtypes", default="fp32", show_default=True, metavar="LIST",
              help="--profile-arch: weight and KV types to time: fp32, bf16, fp16 (e.g. fp32,bf16).")
@click.option("--device", default="cpu", show_default=True,
              help="torch device (cpu, cuda, cuda:N) for --backend torch and --profile-arch.")
@click.option("--loop", "loop_text", default="auto", show_default=True, metavar="LIST",
              help="--backend torch: which loop decodes — round: the device round (each round one function of device "
                   "tensors, the host reading once a round; ar, sd, cool-sd, lantern chains, sjd, sjd-pac without "
                   "proactive_drafting; the mar demo's ar and cspd), host: the host loop, auto: the round on a GPU "
                   "where the method has one. "
                   "A list runs every setting once per loop, side by side (e.g. host,round; rows 'loop=...', "
                   "speed-ups against ar in the same loop).")
@click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
              help="--backend torch and --profile-arch on CUDA: replay each window size's step as a CUDA graph.")
@click.option("--compile/--no-compile", "compile_step", default=None,
              help="--backend torch and --profile-arch: run the step compiled by torch.compile (default: on for CUDA, "
                   "off on a CPU; the first steps compile, then the result is cached on disk).")
@click.option("--compile-mode", type=click.Choice(COMPILE_MODES), default="default",
              show_default=True, help="torch.compile's mode for --compile.")
@click.option("--step-matmuls", type=click.Choice(STEP_MATMULS), default=None,
              help="--backend torch and --profile-arch: how the blocks run their matrix products: fused (products that read one "
                   "input as one, as the feed-forward's w1 and w3; the default on CUDA), separate (each its own, "
                   "as LlamaGen; the default on a CPU), "
                   "skinny (fused, and a step's few rows through specrt's Triton kernel; CUDA).")
@click.option("--step-attention", type=click.Choice(STEP_ATTENTION), default=DEFAULT_STEP_ATTENTION, show_default=True,
              help="--backend torch and --profile-arch: how the blocks attend over the static KV cache: sdpa (torch's "
                   "scaled_dot_product_attention) or triton (a step's few query rows through specrt's split-cache "
                   "Triton kernel; CUDA).")
@click.option("--precision", "precision", default=None, metavar="LIST",
              help="fp32,int8,int4 (and self-int4: fp32 target, its own int4 copy as the draft): run the settings "
                   "(default ar,sd,cool-sd,lantern) on the bundle and its quantized copies (made once by specrt quantize "
                   "into the cache, with the quantizer that suits this machine: int8 is onnxruntime's on a CPU-only "
                   "one). With --profile-arch (CPU): time the exported step graph on onnxruntime at these "
                   "precisions (fp32, int8, int4; default fp32,int4; 'none' skips).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
@click.option("--demo", type=click.Choice(demo_names()), default=None,
              help=DEMO_SHORT_HELP + " mar: ar against cspd (default sweep cspd:draft_len=2,4,8; --backend torch "
                                     "takes --device and --loop); t2i: prompt following beside the Fréchet "
                                     "distance.")
@click.option("--serve", is_flag=True,
              help="Measure `specrt serve` instead: both --batching modes (a server each, 127.0.0.1) under open-loop "
                   "Poisson load at --loads of dynamic batching's saturated throughput; throughput and p50/p95/p99 "
                   "latency per load, answers checked against the same request alone. --methods: the methods mixed "
                   "(default sjd); --plot: latency against load.")
@click.option("--serve-url", default=None, metavar="HOST:PORT", callback=nonblank,
              help="--serve against this running server's gRPC port (127.0.0.1 only) instead of starting servers.")
@click.option("--in-process", is_flag=True,
              help="--serve without Triton: the runtime's scheduler in this process, in flight against whole generate "
                   "calls (a dynamic batcher's batches), on --backend / --device / --threads — where PyTriton is not "
                   "installed (a GPU machine) and to tell the scheduler's share from the server's.")
@click.option("--loads", default="0.25,0.5,0.75,1.0,1.5", show_default=True, metavar="LIST",
              help="--serve: offered loads, as fractions of dynamic batching's saturated throughput.")
@click.option("--rate-seconds", type=float, default=30.0, show_default=True, help="--serve: seconds of load per rate.")
@click.option("--overload-seconds", type=float, default=120.0, show_default=True,
              help="--serve: seconds of load for loads above 1.")
@click.option("--saturation-seconds", type=float, default=20.0, show_default=True,
              help="--serve: seconds of the closed loop (2 x --slots clients) measuring saturated throughput.")
@click.option("--slots", type=int, default=8, show_default=True,
              help="--serve: the in-flight server's --slots and the dynamic server's --max-batch.")
@click.option("--groups", type=int, default=None,
              help="--serve: the in-flight server's --groups (batches of different methods side by side; default: "
                   "the scheduler's, 4).")
@click.option("--max-queue", type=int, default=64, show_default=True, help="--serve: both servers' --max-queue.")
def command(bundle, methods, sweeps, drafts, backend, images, seed, batch_text, threads, keep_tokens, json_path, plot_path, markdown_path, prompts_path, demo_weights,
            cache_dir, profile_arch, results_path, windows, repeats, profile_images, profile_dtypes, device, loop_text,
            cuda_graphs, compile_step, compile_mode, precision, progress, demo, serve, serve_url, loads, rate_seconds,
            overload_seconds, saturation_seconds, slots, groups, max_queue, in_process, step_matmuls,
            step_attention) -> None:
    """Measure every method's speed and fidelity side by side (the embedded demo by default)."""
    validation.seed(seed, "--seed")  # image i uses seed + i: checked before anything loads
    from specrt.paths import cache_folder, output_file
    from specrt.runtime.family_registry import family_for

    if plot_path is not None:  # a PNG, named as generate names its images (no suffix: .png is added)
        from specrt.commands._outputs import image_output

        plot_path = image_output(plot_path, "--plot", PLOT_FORMATS)
    for flag, path in (("--json", json_path), ("--plot", plot_path), ("--markdown", markdown_path)):
        output_file(flag, path)  # before minutes of measuring: the folder exists and takes files
    cache_dir = cache_folder("--cache-dir", cache_dir)
    if serve or serve_url or in_process:
        from specrt.commands import _serve_bench

        _serve_bench.run(bundle, serve_url, loads, rate_seconds, overload_seconds, saturation_seconds, slots, groups, max_queue,
                         methods, seed, threads, json_path, plot_path, markdown_path,
                         demo_weights, cache_dir, _serve_bench.InProcess(in_process, backend, device, demo))
        return
    from specrt.bench.models import refuse_torch_bundle

    refuse_torch_bundle(bundle, backend)  # a flag mistake first, then what the manifest says
    loops = _loops(loop_text, backend, profile_arch, precision)
    family = family_for(bundle, demo)  # a damaged manifest is one line here, before anything runs
    batches = _batches(batch_text)
    step_kernels_asked = step_matmuls is not None or step_attention != DEFAULT_STEP_ATTENTION
    if step_kernels_asked and not (profile_arch or backend == "torch"):
        raise SpecrtError(f"--step-matmuls / --step-attention choose how the PyTorch step runs: they apply to "
                          f"--backend torch and --profile-arch, not to --backend {backend}")
    if family.bench_runner is not None:  # a family with its own bench (runtime/families)
        if step_kernels_asked:
            raise SpecrtError("--step-matmuls / --step-attention choose how LlamaGen-style blocks run; this family's "
                              "bench has no such blocks")
        module, _, function = family.bench_runner.partition(":")
        getattr(importlib.import_module(module), function)(
            bundle=bundle, demo=demo, methods=methods, sweeps=sweeps, backend=backend, device=device, images=images,
            seed=seed, threads=threads, json_path=json_path, markdown_path=markdown_path, demo_weights=demo_weights,
            cache_dir=cache_dir, progress=progress, loops=loops, batches=batches)
        return
    if profile_arch:
        device = validation.torch_device(device)
        default = "fp32,int4" if device == "cpu" else "none"  # the onnxruntime curves run on the CPU
        _profile(profile_arch, results_path, windows, repeats, device, threads, json_path, plot_path, demo_weights,
                 profile_images, profile_dtypes, cuda_graphs, _precisions(precision if precision is not None else default),
                 compile_step, compile_mode, step_matmuls, step_attention)
        return
    if precision is not None:
        if demo not in (None, DEFAULT_DEMO) or prompts_path:
            raise SpecrtError("--precision runs the c2i demo or a class-conditional BUNDLE")
        if device.strip().lower() != "cpu":
            raise SpecrtError(f"--device {device} applies to --backend torch (and --profile-arch); --precision runs "
                              f"bundles, on the device --backend picks")
        _precision_run(bundle, backend, demo_weights, threads, cache_dir, methods, sweeps, images, seed, json_path,
                       progress, _precisions(precision))
        return
    from tqdm import tqdm

    from specrt.bench.models import open_models
    from specrt.bench.run import benchmark, planned_images
    from specrt.bench.settings import AUTO, DEFAULT_METHODS, DEFAULT_SWEEPS, build_settings, parse_drafts, without_auto

    started = time.perf_counter()
    chosen = methods is not None or bool(sweeps)
    if not chosen:
        sweeps = DEFAULT_SWEEPS
    drafts = parse_drafts(drafts)
    names, with_auto = without_auto(methods or ",".join(DEFAULT_METHODS + (AUTO,)))
    settings = build_settings(names, sweeps, drafts, loops)  # validate before loading
    say = (lambda msg: click.echo(msg, err=True)) if progress else None
    if device != "cpu" and backend != "torch":
        raise SpecrtError(f"--device {device} applies to --backend torch (and --profile-arch); "
                          f"--backend {backend} picks its device itself")
    device = validation.torch_device(device)  # a CPU-only torch and --device cuda: one line, before loading
    if backend == "torch":
        step_matmuls = _step_kernels(device, step_matmuls, step_attention)
    prompts = _read_prompts(prompts_path) if prompts_path else None
    models = open_models(bundle, backend, demo_weights, threads, cache_dir, progress=say, device=device,
                         cuda_graphs=cuda_graphs and device.startswith("cuda"), drafts=drafts,
                         demo=demo, prompts=prompts, compile=compile_step, compile_mode=compile_mode,
                         step_matmuls=step_matmuls, step_attention=step_attention)
    if bundle is not None:  # a quantized bundle on a backend its graphs were not made for: one line
        from specrt.commands._backend_advice import warn_bundle_backend

        warn_bundle_backend(bundle, backend)
    settings = _draft_free_if_needed(settings, models, chosen)
    if models.judge is not None:  # said before minutes of measuring, and again under the table
        from specrt.bench.run import fidelity_sample_note

        note = fidelity_sample_note(images, models.judge.feature_dim)
        if note:
            warnings.warn(note, SpecrtWarning)
    if len(loops) == 1:  # one loop: the pipelines' own (several: each setting sets its own, measure.pipeline_for)
        for pipe in {id(p): p for p in (models.pipeline, *models.drafts.values())}.values():
            pipe.loop = loops[0]
    if max(batches) > (models.pipeline.max_images or max(batches)):
        raise SpecrtError(f"--batch {max(batches)} exceeds this bundle's {models.pipeline.max_images} images per "
                          f"call (re-export with `specrt export --max-batch {max(batches)}`)")
    auto = _auto_choice(models, batches[0], backend, device, threads, say) if with_auto else None
    if auto is not None:
        from specrt.bench.settings import auto_setting

        settings = [*settings, auto_setting(auto)]
    bar = tqdm(total=planned_images(settings, images, batches), unit="img", disable=not progress, dynamic_ncols=True,
               leave=False, mininterval=0.5)

    def tick(setting) -> None:
        bar.set_description(setting.label, refresh=False)
        bar.update()
    try:
        run = benchmark(models, settings, images, seed, threads, on_image=tick, keep_tokens=keep_tokens,
                        batches=batches)
    finally:
        bar.close()
    run.payload["settings"]["wall_time_s"] = round(time.perf_counter() - started, 1)
    if auto is not None:
        run.payload["settings"]["auto"] = {"chose": auto.label, "predicted_speedup": auto.predicted_speedup,
                                           "batch": batches[0], "guarantee": auto.guarantee,
                                           "candidates": auto.candidates}
    _print_run(run)
    _write_outputs(run, json_path, markdown_path, plot_path)


def _auto_choice(models, batch: int, backend: str, device: str, threads: int, say):
    """What `generate --method auto` chooses for the bench's pipeline at `batch` (runtime/choosing),
    measured afresh (the cache is written, not read: the row shows this run's choice), on the run's
    prompts for a prompt model, every class otherwise."""
    from specrt.bench.device import device_name
    from specrt.runtime.choosing import choose_method

    pipe = models.pipeline
    where = device_name("torch-cuda" if device.startswith("cuda") else backend)
    choice = choose_method(pipe, batch=batch, identity=models.bundle, device=where, remeasure=True,
                           backend=f"{backend}, device {device}, threads {threads}, loop {getattr(pipe, 'loop', '')}",
                           conditions={"prompts": list(models.prompts)} if models.prompts else None, progress=say)
    if say:
        say(f"auto chose {choice.label} (predicted {choice.predicted_speedup:.2f}x ar at batch {batch})")
    return choice


def _precision_run(bundle, backend, demo_weights, threads, cache_dir, methods, sweeps, images, seed, json_path,
                   progress, precisions) -> None:
    """--precision: the settings (default ar and the drafted methods) on fp32 and quantized copies of one bundle."""
    from tqdm import tqdm

    from specrt.bench.models import _judge_for_bundle, cache_root, demo_bundle
    from specrt.bench.precision import check_precisions, format_precision_table, precision_benchmark
    from specrt.bench.run import planned_images
    from specrt.bench.settings import build_settings
    from specrt.runtime.pipeline import Pipeline
    from specrt.runtime.threads import set_torch_threads

    started = time.perf_counter()
    precisions = check_precisions(precisions)
    if backend == "torch":
        raise SpecrtError("--precision benchmarks bundles (onnxruntime or TensorRT backends), not --backend torch")
    settings = build_settings(methods or "ar,sd,cool-sd,lantern", sweeps)
    say = (lambda msg: click.echo(msg, err=True)) if progress else None
    set_torch_threads(threads)  # torch runs the evaluator
    if bundle is None:
        from specrt.export.demo.fidelity import FidelityJudge

        source, judge = demo_bundle(demo_weights, cache_dir, say), FidelityJudge.from_demo(demo_weights)
    else:
        source, judge = Path(bundle), _judge_for_bundle(Path(bundle))
    bar = tqdm(total=planned_images(settings, images) * len(precisions), unit="img", disable=not progress,
               dynamic_ncols=True, leave=False, mininterval=0.5)

    def tick(setting) -> None:
        bar.set_description(setting.label, refresh=False)
        bar.update()
    try:
        rows, payload = precision_benchmark(
            source, precisions, lambda path: Pipeline.from_bundle(path, backend=backend, threads=threads), judge,
            settings, images, seed, threads, backend, Path(cache_dir or cache_root() / "bench"), tick, say)
    finally:
        bar.close()
    from specrt.bench.device import device_name

    payload.update(device=device_name(backend), backend=backend, threads=threads, images_per_setting=images,
                   wall_time_s=round(time.perf_counter() - started, 1))
    click.echo(f"device: {payload['device']}  backend: {backend} ({threads} thread(s))  bundle: {source}; "
               f"{images} images per setting and precision")
    click.echo(format_precision_table(rows))
    click.echo(f"greedy agree = {payload['greedy_agreement']}; MB/target step = weights one target step reads "
               f"(embedding tables excluded); run time {payload['wall_time_s']:.0f} s")
    if json_path:
        from specrt.bench.report import write_json

        write_json(str(json_path), payload)
        click.echo(f"wrote {json_path}")


def _read_prompts(path: Path) -> list[str]:
    """--prompts FILE: one prompt a line; an empty file is a one-line error."""
    from specrt.export.demo.t2i.captions import read_prompt_file

    try:
        prompts = read_prompt_file(path.read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecrtError(f"cannot read prompts from {path}: {exc}") from exc
    if not prompts:
        raise SpecrtError(f"{path} holds no prompt (one a line; blank lines and # comments are skipped)")
    return prompts


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
    looped = any(r.loop for r in run.results)
    click.echo(f"{settings['images_per_setting']} images per setting, interleaved in random order; "
               "speed-up = median latency of ar / setting" + (" (ar in the same loop)" if looped else ""))
    click.echo(format_table(run.results))
    floor = settings["fd_noise_floor"]
    if floor and floor["frechet_distance"] is not None:
        acc = floor.get("real_class_accuracy")
        click.echo(f"FD noise floor (real vs real, {floor['images']} vs {floor['reference_images']} images, "
                   f"{floor['feature_dim']}-d evaluator features): {format_fd(floor)}"
                   + (f"; evaluator accuracy on real held-out digits: {acc:.3f}" if acc is not None else ""))
        from specrt.bench.run import fidelity_sample_note

        note = fidelity_sample_note(settings["images_per_setting"], floor["feature_dim"])
        if note:
            click.echo(f"note: {note}")
    if any("prompt_following" in r.quality for r in run.results):
        from specrt.bench.report import format_prompt_following

        click.echo("\nprompt following (share of images the evaluator reads as asked; real = held-out digits "
                   "against their own measured captions)")
        click.echo(format_prompt_following(run.results, (floor or {}).get("real_prompt_following")))
    click.echo("\ntime per image, ms (means; other = Python orchestration between model calls); speed-up = ar's "
               "total / total;\npred. = the cost model on this run's graph timings: ar's target_forward + draft_forward"
               " + vq_decode / the setting's (host work free; a loop=round row: its loop=host twin's, as the round"
               " counts its whole time as target_forward);\nmeas/pred = speed-up / pred.; "
               "syncs/round = waits for the device per target call (the device round: its one read a round)")
    click.echo(format_breakdown(run.results))
    click.echo(f"\nrun time {settings['wall_time_s']:.0f} s")


def _write_outputs(run, json_path: Optional[Path], markdown_path: Optional[Path], plot_path: Optional[Path]) -> None:
    from specrt.atomic_file import write_text
    from specrt.bench.report import format_markdown, write_json, write_plot

    info = run.payload
    if json_path:
        write_json(str(json_path), info)
        click.echo(f"wrote {json_path}")
    if markdown_path:
        write_text(markdown_path, format_markdown(info))
        click.echo(f"wrote {markdown_path}")
    if plot_path:
        title = (f"{info['bundle'].split(' (')[0]} on {info['backend']}, {info['device']}, "
                 f"{info['settings']['images_per_setting']} images/setting")
        write_plot(str(plot_path), run.results, title, fd_floor=run.fd_floor)
        click.echo(f"wrote {plot_path}")
