"""What a method's measured accepted length buys on a real architecture, on this machine.

The demo models are tiny, so on a CPU their forward cost barely grows with the window W
and per-call overhead dominates; a LlamaGen-size target behaves differently. This module
measures the target step latency t(W) for a LlamaGen architecture with random weights (no
checkpoint needed) and turns each method's accepted length τ into a predicted speed-up:

    speed-up = τ · t(1) / (s · (t(W_method) + n_draft · t_draft(1)))

where W_method is the target window a method verifies per forward and n_draft the draft
forwards per iteration. The draft is an EAGLE head for the target (specrt.export.eagle: fc
over [embedding; feature], one decoder layer of the target's width, the target's lm_head and
the sampling head), which is what LANTERN and Cool-SD draft with.

Batches: with b images per step (`--profile-images b`), t is measured for b CFG pairs and a
batch runs until its slowest image is done, so a method pays s ≥ 1 steps per image round:
s = target graph runs × b / per-image target forwards, read from a `specrt bench --batch b`
run (1 at batch 1 and for AR). Images per second follow: b · τ / (tokens · s · (t(W) + …)).

The formula itself (`speedup`, with StepLatency, window_cost and predicted_speedup) is
runtime/cost_model.py's, imported here: `--method auto` prices its candidates with the same one.

Every `specrt bench` run also applies the formula to its own graph timings (run_predicted_speedup:
each setting's t(W), draft cost, τ and s as the run measured them), so the time-per-image table
shows, per setting, the speed-up the graphs alone would give beside the measured one.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from specrt.atomic_file import atomic_path
from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION, step_matmuls_for
# the formula and the step profile it reads live in the runtime (--method auto prices settings too)
from specrt.runtime.cost_model import (StepLatency, predicted_images_per_s, predicted_speedup, speedup,  # noqa: F401
                                       window_cost)

PROFILE_ARCHS = {
    "llamagen-c2i-B": ("GPT-B", 256),
    "llamagen-c2i-L": ("GPT-L", 256),
    "llamagen-c2i-XL": ("GPT-XL", 384),
    "llamagen-c2i-XXL": ("GPT-XXL", 384),
}
DEFAULT_WINDOWS = (1, 2, 4, 8, 16, 32, 64)


def _interleaved_best(fns: list[Callable[[], Any]], repeats: int, sync: Callable[[], None],
                      progress: Callable[[int], None] | None = None, warm: bool = False) -> list[float]:
    """Fastest latency of each fn over `repeats` rounds, timed round-robin in a fresh random
    order every round. Other processes on a shared machine only ever add time, so the fastest
    repeat is the closest estimate of a step's own cost (the median still moved by 30% between
    runs on the 2 shared cores here); the round-robin spreads busy phases over all windows.

    `warm`: every timed call right after an untimed call of itself, as a decode loop repeats the
    same few window sizes (onnxruntime binds one buffer set per size; timed after a call of another
    size, a one-token step measured 30% slower than in decoding: specrt plan-tree times this way)."""
    import random

    for fn in fns:  # warm-up: allocator, first-touch pages, kernel selection
        fn()
        sync()
    samples: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    rng = random.Random(0)
    for round_index in range(repeats):
        rng.shuffle(order)
        for i in order:
            if warm:
                fns[i]()
                sync()
            start = time.perf_counter()
            fns[i]()
            sync()
            samples[i].append(time.perf_counter() - start)
        if progress:
            progress(round_index + 1)
    return [min(s) for s in samples]


DTYPES = ("fp32", "bf16", "fp16")


def torch_dtype(name: str) -> Any:
    """'fp32' | 'bf16' | 'fp16' -> the torch dtype; SpecrtError for anything else."""
    torch = require("torch", "specrt bench --profile-arch")
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in table:
        raise SpecrtError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return table[name]


def bytes_per_step(model: Any, kv: Any) -> int:
    """The bytes a decode step reads at least: every weight but the embedding tables (a step
    gathers a few rows of those), and the whole KV buffer (the masked attention reads it all)."""
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                  if not name.startswith(("tok_embeddings", "cls_embedding")))
    return int(weights + kv.numel() * kv.element_size())


def memory_bandwidth(device: str, megabytes: int = 1024, repeats: int = 10) -> float | None:
    """Device memory bandwidth in bytes/s from a device-to-device copy (bytes read + written),
    fastest of `repeats`; None on CPU, where a step's floor is not this simple."""
    if not device.startswith("cuda"):
        return None
    torch = require("torch", "specrt bench --profile-arch")
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        target.copy_(source)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    del source, target
    return 2 * megabytes * 2**20 / best


def measure_models(name: str, target: Any, draft: Any, windows: tuple[int, ...] = DEFAULT_WINDOWS, repeats: int = 7,
                   device: str = "cpu", progress: Callable[[str], None] | None = None, images: int = 1,
                   dtype: str = "fp32", cuda_graphs: bool = True, compile: bool | None = None,
                   compile_mode: str = "default", step_matmuls: str | None = None,
                   step_attention: str = DEFAULT_STEP_ATTENTION) -> StepLatency:
    """t(W) of a target GPT (`images` CFG pairs, past half full) at each window, and t_draft(1) of
    a draft GPT, with weights and KV buffer in `dtype`, and the operations of a W = 1 step.

    Each step is run as the runtime runs it (TorchRunner): over a static cache written in place,
    compiled where `compile` (default: on CUDA), and on CUDA timed as a replayed CUDA graph, so
    t(W) is the GPU's time and not Python's kernel launches (`cuda_graphs=False` times eager
    steps, launch-bound for every LlamaGen size at small batch). `step_matmuls`: how the blocks
    run their products (models.step_kernels; None: the device's default) and `step_attention` how
    they attend, set on the models here as TorchRunner sets them."""
    torch = require("torch", "specrt bench --profile-arch")
    from specrt.bench.step_ops import profile_generated_kernels, step_ops
    from specrt.models.kv_cache import StaticCache
    from specrt.models.step_setup import set_step_attention, set_step_matmuls
    from specrt.runtime.head import apply_head
    from specrt.runtime.sampling import SamplingParams, guidance_mix

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    compile = device.startswith("cuda") if compile is None else compile
    compiled = None
    if compile:
        from specrt.runtime.backends.compiled_step import CompiledStep

        if not device.startswith("cuda"):
            profile_generated_kernels()  # before compiling: each fused C++ kernel counts as one op
        compiled = CompiledStep(compile_mode)
    weights_type = torch_dtype(dtype)
    config = target.config
    capacity = config.seq_len + max(windows)
    past_len = config.cond_len + config.num_image_tokens // 2
    rows = 2 * images  # [cond; uncond] per image
    # CFG scale 2 over each image's [cond; uncond] pair, the host's own guidance matrix
    mix = torch.from_numpy(guidance_mix(images, SamplingParams(cfg_scale=2.0))).to(device)

    def step_fn(model, window: int, kv) -> Callable[[], Any]:
        """One step of `window` tokens for every row after a half-full cache (the KV buffer is shared)."""
        ids = torch.zeros(rows, window, dtype=torch.long, device=device)
        positions = (past_len + torch.arange(window, device=device))[None].expand(rows, window)
        mask = torch.zeros(rows, window, capacity + window, dtype=torch.bool, device=device)
        mask[:, :, :past_len] = True
        mask[:, :, capacity:] = torch.ones(window, window, dtype=torch.bool, device=device).tril()
        uniforms = torch.full((images, window), 0.5, device=device)

        cache = StaticCache(kv, capacity)  # the window written into the scratch columns, as TorchRunner does
        args: tuple = (ids, positions, mask, cache, compiled.run_layer if compiled else None)
        if getattr(model, "draft_kind", None) == "eagle":  # an EAGLE head also reads a feature per token
            args = (ids, torch.zeros(rows, window, config.dim, device=device, dtype=weights_type), positions, mask,
                    cache)

        def run() -> Any:
            with torch.inference_mode():  # the model and the sampling head every step graph ends in
                return apply_head(model.step(*args)[0], mix, uniforms)
        return run

    def kv_for(cfg):
        return torch.zeros(cfg.n_layer, 2, rows, cfg.n_kv_head, capacity + max(windows), cfg.head_dim,
                           device=device, dtype=weights_type)

    graphs = cuda_graphs and device.startswith("cuda")
    if graphs:
        from specrt.runtime.backends.torch_backend import CapturedStep

    def timed(fn: Callable[[], Any]) -> Callable[[], Any]:
        if not graphs:
            return fn
        with torch.inference_mode():
            return CapturedStep(torch, fn).replay

    target = target.to(device=device, dtype=weights_type).eval()
    step_matmuls = step_matmuls_for(torch.device(device).type, step_matmuls)
    set_step_matmuls(target, step_matmuls)
    set_step_attention(target, step_attention)
    kv = kv_for(config)
    floor_bytes = bytes_per_step(target, kv[:, :, :, :, :capacity])  # the scratch columns are the window's
    steps = [step_fn(target, window, kv) for window in windows]
    steps[0]()  # warm (compiles) before counting
    ops = step_ops(steps[0], device)
    fns = [timed(step) for step in steps]
    report = (lambda done: progress(f"{name} {dtype} x{images}: round {done}/{repeats} over "
                                    f"W={','.join(map(str, windows))}")) if progress else None
    target_s = _interleaved_best(fns, repeats, sync, report)
    del kv, fns
    draft = draft.to(device=device, dtype=weights_type).eval()
    set_step_matmuls(draft, step_matmuls)
    set_step_attention(draft, step_attention)
    draft_s = _interleaved_best([timed(step_fn(draft, 1, kv_for(draft.config)))], repeats, sync)[0]
    return StepLatency(name, device, list(windows), target_s, draft_s, images, dtype, floor_bytes,
                       config.num_image_tokens, ops, config.n_layer, compiled is not None,
                       compiled.compile_seconds if compiled else 0.0)


def measure_runners(name: str, target: Any, draft: Any, windows: tuple[int, ...] = DEFAULT_WINDOWS,
                    repeats: int = 7, device: str = "cpu") -> StepLatency:
    """measure_models for runtime ModelRunners (e.g. the onnxruntime backend over a bundle): the
    step cost the benchmark itself paid, input preparation included."""
    import numpy as np

    from specrt.runtime.window import Window

    from specrt.runtime.sampling import SamplingParams, guidance_mix

    def prepared(runner: Any) -> Any:
        runner.allocate(guidance_mix(1, SamplingParams(cfg_scale=2.0)))  # one image, its CFG pair
        runner.reset_counters()
        runner.prefill(np.array([0, runner.spec.null_class], dtype=np.int32), np.full((1, 1), 0.5))
        half = runner.spec.num_image_tokens // 2
        runner.step(Window.chain([0] * half), np.full((1, half), 0.5))
        runner.commit(range(half))
        return runner

    target, draft = prepared(target), prepared(draft)
    usable = [w for w in windows if w <= target.max_window]
    step = lambda runner, w: (lambda: runner.step(Window.chain([0] * w), np.full((1, w), 0.5)))  # noqa: E731
    target_s = _interleaved_best([step(target, w) for w in usable], repeats, lambda: None)
    draft_s = _interleaved_best([step(draft, 1)], repeats, lambda: None)[0]
    return StepLatency(name, device, usable, target_s, draft_s, tokens=target.spec.num_image_tokens)


def measure_step_latency(arch: str, windows: tuple[int, ...] = DEFAULT_WINDOWS, repeats: int = 7,
                         device: str = "cpu", progress: Callable[[str], None] | None = None, images: int = 1,
                         dtype: str = "fp32", cuda_graphs: bool = True, compile: bool | None = None,
                         compile_mode: str = "default", step_matmuls: str | None = None,
                         step_attention: str = DEFAULT_STEP_ATTENTION) -> StepLatency:
    """measure_models on a LlamaGen architecture with random weights and an EAGLE head for it."""
    if arch not in PROFILE_ARCHS:
        raise SpecrtError(f"unknown --profile-arch {arch!r}; choose from {', '.join(PROFILE_ARCHS)}")
    torch = require("torch", "specrt bench --profile-arch")
    from specrt.models.eagle_head import EagleConfig, EagleHead
    from specrt.models.llamagen_gpt import GPT

    torch.manual_seed(0)
    config = profile_config(arch)
    if progress:
        progress(f"{arch}: random weights ({config.n_layer} layers, dim {config.dim}, {config.num_image_tokens} "
                 f"tokens) on {device}")
    with torch.device(device):  # initialise on the device: XL's random weights are 3 GB
        target = GPT(config)
        draft = EagleHead(EagleConfig.for_target(target)).tie_to(target)
    return measure_models(arch, target, draft, windows, repeats, device, progress, images, dtype, cuda_graphs,
                          compile, compile_mode, step_matmuls, step_attention)


def profile_config(arch: str) -> Any:
    """The GPTConfig of a PROFILE_ARCHS name (its LlamaGen size at its image size); needs torch."""
    require("torch", "specrt bench --profile-arch")
    from specrt.models.llamagen_gpt import gpt_config

    name, image_size = PROFILE_ARCHS[arch]
    return gpt_config(name, image_size=image_size)


GRAPH_PARTS = ("target_forward", "draft_forward", "vq_decode")  # bench breakdown keys spent inside model graphs


def graph_seconds(breakdown: dict[str, float]) -> float:
    """Seconds per image a bench setting spent inside model graphs (target, draft, VQ decode):
    the part of its latency the cost model accounts for; the rest is host work."""
    return sum(breakdown.get(part, 0.0) for part in GRAPH_PARTS)


def run_predicted_speedup(breakdown: dict[str, float], ar_breakdown: dict[str, float]) -> float | None:
    """The cost model on a bench run's own graph timings: ar's graph seconds per image over the
    setting's, i.e. the speed-up the setting would show if host work cost nothing.

    It is predicted_speedup's τ · t(1) / (s · (t(W) + n_draft · t_draft)) with every term read
    from the run instead of a profile. An image takes tokens / τ target forwards; at b images per
    graph step and straggle s it pays for s · tokens / (b · τ) steps of t(W) + n_draft · t_draft
    each, ar for tokens / b steps of t(1), so the ratio of their target + draft seconds per image
    is the formula, with t(W) the setting's own target seconds per step at its windows and
    n_draft · t_draft the draft seconds it really spent per step (test_cost_model.py checks the
    two agree). The VQ decode every setting pays alike is added to both sides, so measured /
    predicted (on mean latencies) is (1 − the setting's host share) / (1 − ar's): the host's cost
    alone. None when either breakdown has no graph time."""
    setting, ar = graph_seconds(breakdown), graph_seconds(ar_breakdown)
    return ar / setting if setting > 0 and ar > 0 else None


def straggle(result: dict[str, Any]) -> float:
    """Steps a batch runs per image round in a bench result: target graph runs × batch / per-image
    target forwards (1 at batch 1; above 1 while a batch waits for its slowest images)."""
    batch, calls = int(result.get("batch", 1)), result.get("target_calls_per_image")
    forwards = result.get("target_forwards_per_image")
    if batch <= 1 or not calls or not forwards:
        return 1.0
    return max(1.0, calls * batch / forwards)


def at_batch(measured: list[dict[str, Any]], images: int) -> list[dict[str, Any]]:
    """The bench results measured at this batch size, else the batch-1 ones (the same accepted
    lengths: images do not depend on their batch; only the straggle is unknown, taken as 1)."""
    same = [r for r in measured if int(r.get("batch", 1)) == images]
    return same or [r for r in measured if int(r.get("batch", 1)) == 1]


def parse_windows(text: str, flag: str = "--windows") -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4), sorted; SpecrtError naming `flag` for anything that is not positive integers."""
    try:
        windows = sorted({int(w) for w in text.split(",") if w.strip()})
    except ValueError:
        raise SpecrtError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not windows or windows[0] < 1:
        raise SpecrtError(f"{flag} {text!r}: expected positive integers")
    return tuple(windows)


def prediction_table(latency: StepLatency, measured: list[dict[str, Any]],
                     reference: StepLatency | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The t(W) table and, per measured bench result, its window cost and predicted speed-up
    on `latency`'s architecture (and on `reference`, the demo's own models, when given)."""
    row = lambda name, cells: f"{name:<16}" + "".join(f"{c:>8}" for c in cells)  # noqa: E731
    lines = [row("W", latency.windows)]
    for curve in filter(None, (latency, reference)):
        lines += [curve.arch,
                  row("  t(W) ms", [f"{1000 * t:.1f}" for t in curve.target_s]),
                  row("  t(W)/t(1)", [f"{t / curve.target_s[0]:.2f}" for t in curve.target_s]),
                  f"  draft step (W=1): {1000 * curve.draft_s:.1f} ms = {curve.draft_s / curve.target_s[0]:.2f} t(1)"]
    predictions = []
    measured = at_batch(measured, latency.images)
    for result in measured:
        params, tau, lag = result.get("params", {}), result["mean_accepted_length"], straggle(result)
        window, drafts = window_cost(result["method"], params)
        entry = {"label": result.get("label", result["method"]), "method": result["method"], "params": params,
                 "window": window, "draft_forwards": drafts, "mean_accepted_length": tau,
                 "batch": latency.images, "straggle": lag,
                 "measured_speedup": result.get("speedup_vs_ar"),
                 "predicted_speedup": predicted_speedup(latency, result["method"], params, tau, lag),
                 "predicted_images_per_s": predicted_images_per_s(latency, result["method"], params, tau, lag)}
        if reference is not None:
            entry["predicted_speedup_reference"] = predicted_speedup(reference, result["method"], params,
                                                                     result["mean_accepted_length"])
        predictions.append(entry)
    _attach_run_costs(predictions, measured)
    width = max([len(p["label"]) for p in predictions] + [7])
    ref_head = f"  {reference.arch[:10]:>10}" if reference is not None else ""
    lines += ["", f"{'setting':<{width}}  acc.len    W  drafts  straggle  {latency.arch[:16]:>16}  img/s{ref_head}"
                  f"  measured  | in the bench run: target fwd / AR's, draft call / AR's target fwd"]
    for p in predictions:
        measured_speedup = "-" if p["measured_speedup"] is None else f"{p['measured_speedup']:.2f}x"
        ref_cell = f"  {p['predicted_speedup_reference']:9.2f}x" if reference is not None else ""
        run_cells = "".join("       -" if p.get(k) is None else f"  {p[k]:6.2f}"
                            for k in ("run_target_forward_ratio", "run_draft_call_ratio"))
        rate = "-" if p["predicted_images_per_s"] is None else f"{p['predicted_images_per_s']:.3g}"
        lines.append(f"{p['label']:<{width}}  {p['mean_accepted_length']:7.2f}  {p['window']:3d}  {p['draft_forwards']:6d}"
                     f"  {p['straggle']:8.2f}  {p['predicted_speedup']:15.2f}x  {rate:>5}{ref_cell}  {measured_speedup:>8}"
                     f"  |{run_cells}")
    return "\n".join(lines), predictions


def _attach_run_costs(predictions: list[dict[str, Any]], measured: list[dict[str, Any]]) -> None:
    """What one target forward and one draft call cost inside the bench run itself, relative to
    an AR target forward (from the run's time breakdown): the demo's real t(W)/t(1)."""
    def per_call(result: dict[str, Any], part: str, count: str) -> float | None:
        calls = result.get(count) or 0.0
        seconds = result.get("breakdown_s", {}).get(part)
        return seconds / calls if calls and seconds is not None else None

    ar = next((r for r in measured if r["method"] == "ar"), None)
    base = per_call(ar, "target_forward", "target_forwards_per_image") if ar else None
    for p, result in zip(predictions, measured):
        target = per_call(result, "target_forward", "target_forwards_per_image")
        draft = per_call(result, "draft_forward", "draft_forwards_per_image")
        p["run_target_forward_ratio"] = target / base if base and target is not None else None
        p["run_draft_call_ratio"] = draft / base if base and draft is not None else None


def write_profile_plot(path: str, latency: StepLatency, predictions: list[dict[str, Any]], title: str,
                       reference: StepLatency | None = None, more: tuple[StepLatency, ...] = ()) -> None:
    """Left: t(W)/t(1) (and the demo target's, when given, and `more` curves: other batch sizes
    and dtypes) between the flat and linear extremes; right: predicted vs measured speed-up per
    setting on `latency`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    base = latency.target_s[0]
    left.plot(latency.windows, [t / base for t in latency.target_s], marker="o",
              label=f"{latency.arch}: t(1) = {1000 * base:.1f} ms, draft {1000 * latency.draft_s:.1f} ms")
    for curve in more:
        left.plot(curve.windows, [t / curve.target_s[0] for t in curve.target_s], marker=".",
                  label=f"{curve.arch} {curve.dtype} x{curve.images} img: t(1) = {1000 * curve.target_s[0]:.1f} ms")
    if reference is not None:
        ref = reference.target_s[0]
        left.plot(reference.windows, [t / ref for t in reference.target_s], marker="s",
                  label=f"{reference.arch}: t(1) = {1000 * ref:.1f} ms, draft {1000 * reference.draft_s:.1f} ms")
    left.plot(latency.windows, latency.windows, ls="--", color="gray", label="linear in W (compute-bound)")
    left.axhline(1.0, ls=":", color="gray", label="flat (launch/memory-bound: W is free)")
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    left.set_xlabel("window W (tokens verified per target forward)")
    left.set_ylabel("target step latency relative to W = 1")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    labels = [p["label"] for p in predictions]
    ys = range(len(predictions))
    bars = [("measured on the demo (bench run)", [p["measured_speedup"] or 0.0 for p in predictions])]
    if reference is not None:
        bars.append((f"predicted from {reference.arch} step costs alone (no per-round orchestration)",
                     [p.get("predicted_speedup_reference", 0.0) for p in predictions]))
    bars.append((f"predicted on {latency.arch}", [p["predicted_speedup"] for p in predictions]))
    height = 0.8 / len(bars)
    for k, (label, values) in enumerate(bars):
        right.barh([y - 0.4 + height * (k + 0.5) for y in ys], values, height=height, label=label)
    right.set_yticks(list(ys), labels, fontsize=8)
    right.invert_yaxis()
    right.axvline(1.0, color="gray", ls="--", lw=0.8)
    right.set_xlabel("speed-up vs ar")
    right.legend(fontsize=7, loc="lower right")
    right.grid(alpha=0.3, axis="x")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        with atomic_path(path) as partial:
            fig.savefig(partial, dpi=110, format="png")
    finally:
        plt.close(fig)
