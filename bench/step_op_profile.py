"""Where a bundle's step goes on onnxruntime's CPU provider: kernel time per operator type, and how much
of it copies data rather than computing.

Why: a step's latency on a shared CPU moves with the load, but which operators run and their shares
of the kernel time hold. A step graph over the stacked past_kv spends a large share splitting,
transposing and concatenating the cache; one with per-layer KV inputs (specrt.runtime.kv_inputs)
should spend almost none. Each bundle's `target_step` runs W = 1 for a CFG pair with the cache half
full, under onnxruntime's profiler:

    python -m specrt.bench.step_op_profile /tmp/cpu-precision/fp32-stacked /tmp/cpu-precision/int8-layers ...
"""
from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import click
import numpy as np

# operators that move data without computing anything (a copy on onnxruntime's CPU provider)
COPY_OPS = frozenset({"Split", "Transpose", "Concat", "Slice", "Gather", "Expand", "Tile"})


def half_full_step_feeds(manifest: Any, window: int = 1) -> dict[str, np.ndarray]:
    """target_step's inputs for a CFG pair (batch 2), `window` new tokens, the cache half full."""
    from specrt.bench.onnx_profile import step_feeds
    from specrt.runtime.kv_inputs import stacked_shape

    graph, model = manifest.graph("target_step"), manifest.models["target"]
    capacity, cond = int(model["capacity"]), int(model.get("cond_len", 1))
    past = cond + int(model["grid_size"]) ** 2 // 2
    kv = np.random.default_rng(0).standard_normal(stacked_shape(graph, "max", batch=2, cache_len=capacity))
    return step_feeds(graph, kv.astype(np.float32), past, window, cfg_scale=4.0)


def profile_step(bundle: Path, runs: int, threads: int, scratch: Path) -> dict[str, Any]:
    """Per operator type: calls and kernel microseconds per step; the step's median wall time."""
    import onnxruntime

    from specrt.manifest import read_manifest
    from specrt.runtime.backends.ort_backend import session_options

    manifest = read_manifest(bundle, check_hashes=False)
    options = session_options(threads)
    options.enable_profiling = True
    options.profile_file_prefix = str(scratch / bundle.name)
    session = onnxruntime.InferenceSession(str(manifest.graph_path("target_step")), sess_options=options,
                                           providers=["CPUExecutionProvider"])
    feeds = half_full_step_feeds(manifest)
    session.run(None, feeds)  # warm-up, not counted below: it is profiled too, so skip its events
    for _ in range(runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    steps = [e for e in events if e.get("name") == "model_run"]
    first = steps[1]["ts"] if len(steps) > runs else 0  # the warm-up's run ends before the timed ones
    time: dict[str, float] = defaultdict(float)
    calls: Counter = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= first:
            op = event["args"]["op_name"]
            time[op] += event["dur"] / runs
            calls[op] += 1 / runs
    return {"bundle": str(bundle), "step_ms": statistics.median(e["dur"] for e in steps[-runs:]) / 1e3,
            "ops": {op: {"calls": round(calls[op]), "us": time[op]} for op in sorted(time, key=time.get, reverse=True)}}


def report(profile: dict[str, Any], top: int = 10) -> str:
    ops = profile["ops"]
    total = sum(o["us"] for o in ops.values())
    copies = {op: o for op, o in ops.items() if op in COPY_OPS}
    lines = [f"{profile['bundle']}: step {profile['step_ms']:.1f} ms (median), "
             f"{sum(o['calls'] for o in ops.values())} ops a step; copy-like ops ({', '.join(sorted(copies))}): "
             f"{sum(o['calls'] for o in copies.values())} a step, {sum(o['us'] for o in copies.values()) / 1e3:.2f} ms "
             f"= {100 * sum(o['us'] for o in copies.values()) / total:.1f}% of kernel time"]
    for op, o in list(ops.items())[:top]:
        lines.append(f"   {op:<24}{o['calls']:>5} a step {o['us'] / 1e3:>8.2f} ms {100 * o['us'] / total:>6.1f}%")
    return "\n".join(lines)


@click.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--runs", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--threads", type=click.IntRange(1, 256), default=2, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(bundles: tuple[Path, ...], runs: int, threads: int, json_path: Path | None) -> None:
    """Profile each bundle's target_step (W = 1, CFG pair, cache half full) on onnxruntime's CPU provider."""
    import tempfile

    from specrt.bench.device import device_name

    click.echo(f"target_step, W = 1, CFG pair, cache half full; {runs} runs each, {threads} threads; "
               f"{device_name('ort')}")
    profiles = []
    with tempfile.TemporaryDirectory(prefix="specrt-op-profile-") as scratch:
        for bundle in bundles:
            profiles.append(profile_step(bundle, runs, threads, Path(scratch)))
            click.echo(report(profiles[-1]))
    if json_path:
        json_path.write_text(json.dumps(profiles, indent=2) + "\n")


if __name__ == "__main__":
    main()
