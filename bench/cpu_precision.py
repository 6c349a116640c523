"""Plain AR on a CPU, one image: a LlamaGen bundle at fp32, int8 and int4 beside LlamaGen's own eager
generate() on the same weights, alternating in one run.

Why: a user on a CPU-only box quantizes to go faster, and the figure to beat is LlamaGen's own
generate() on the same machine. Random weights in LlamaGen's layout time exactly what a checkpoint
would for AR (acceptance does not enter); tokens only, as LlamaGen's generate() returns tokens.

    python -m specrt.bench.cpu_precision --arch GPT-B --threads 2 --rounds 4 --work /tmp/cpu-precision \\
        --llamagen /path/to/LlamaGen      # a checkout of FoundationVision/LlamaGen (optional)

The target (seed 0) is exported once per KV input form of the step graphs (`--kv-inputs`: per-layer
inputs, what `specrt export` writes on a CPU-only machine, and the stacked past_kv, both by
default: the A/B of one run) with `specrt export`'s other defaults (write_bundle), and quantized
with `specrt quantize`'s functions and defaults: int8 and int4 by onnxruntime (MatMulNBits with 8-
and 4-bit weights, blocks of 128 and 32, accuracy level 4), the target graphs only. Each round runs every path once
in turn (an untimed warm-up call each first), so a busy phase of a shared machine hits all of
them alike; the table gives each path's median and fastest round and its speed-up over the fp32
bundle and over LlamaGen, round by round (the ratio of the two paths' times in the same round,
then the median).
"""
from __future__ import annotations

import os

# torch's OpenMP workers spin while they wait; on a small shared CPU that made LlamaGen's and
# specrt's PyTorch steps 10x slower (16 tokens: 30 s against 3 s passive). onnxruntime's sessions
# here do not spin either (runtime/backends/ort_backend.session_options). Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import click  # noqa: E402

from specrt.lazy import require  # noqa: E402

SAMPLING = dict(cfg_scale=4.0, temperature=1.0, top_k=0, top_p=1.0)  # as bench.ar_timing


KV_FORMS = {"layers": "", "stacked": ", stacked KV"}  # `specrt export --kv-inputs` -> the paths' name suffix


def export_paths(arch: str, image_size: int, work: Path, say: Callable[[str], None],
                 forms: tuple[str, ...] = ("layers",)) -> dict[str, Path]:
    """fp32 / int8 / int4 bundles of one random target under `work` (made once), for each KV input
    form of the step graphs (specrt.runtime.kv_inputs): name (`fp32`, `int8, stacked KV`, ...) -> folder."""
    torch = require("torch", "specrt.bench.cpu_precision")
    from specrt.engines.quantize import QuantizeOptions, quantize_bundle
    from specrt.export.bundle import ExportOptions, ModelSet, write_bundle
    from specrt.models.llamagen_gpt import GPT, gpt_config
    from specrt.models.llamagen_vq import VQConfig, VQModel

    config = gpt_config(arch, image_size=image_size)
    if not (work / "target.pt").is_file():
        torch.manual_seed(0)
        torch.save({"model": GPT(config).state_dict()}, work / "target.pt")  # LlamaGen's checkpoint layout
    options = {"int8": QuantizeOptions(mode="int8", tool="onnxruntime"), "int4": QuantizeOptions(mode="int4")}
    bundles: dict[str, Path] = {}
    for form in forms:
        fp32 = work / f"fp32-{form}"
        if not (fp32 / "manifest.json").is_file():
            say(f"exporting {arch} ({image_size} px, random weights, seed 0, --kv-inputs {form}) to {fp32} ...")
            target = GPT(config).eval()
            target.load_state_dict(torch.load(work / "target.pt", map_location="cpu")["model"])
            vq = VQModel(VQConfig(codebook_size=config.vocab_size)).eval()
            write_bundle(ModelSet(target=target, draft=None, vq=vq), fp32, ExportOptions(kv_inputs=form), progress=say)
            del target, vq
        bundles["fp32" + KV_FORMS[form]] = fp32
        for name, option in options.items():
            out = work / f"{name}-{form}"
            if not (out / "manifest.json").is_file():
                say(f"quantizing {fp32.name} to {name} ...")
                quantize_bundle(fp32, out, option, graphs=["target"], progress=say)
            bundles[name + KV_FORMS[form]] = out
    return bundles


def llamagen_runner(repo: Path, arch: str, image_size: int, weights: Path) -> Callable[[int, int], Any]:
    """LlamaGen's own model class and generate() (eager, as sample_c2i.py runs without --compile)
    on the weights saved beside the bundle."""
    torch = require("torch", "specrt.bench.cpu_precision")
    sys.path.insert(0, str(repo))
    from autoregressive.models.generate import generate
    from autoregressive.models.gpt import GPT_models

    grid = image_size // 16
    model = GPT_models[arch](vocab_size=16384, block_size=grid * grid, num_classes=1000, cls_token_num=1,
                             model_type="c2i")
    model.load_state_dict(torch.load(weights, map_location="cpu")["model"])
    model.eval()

    def run(class_id: int, seed: int) -> Any:
        torch.manual_seed(seed)
        return generate(model, torch.tensor([class_id]), grid * grid, sample_logits=True, **SAMPLING)
    return run


def torch_runner(arch: str, image_size: int, weights: Path, threads: int) -> Callable[[int, int], Any]:
    """specrt's PyTorch pipeline (eager on a CPU) on the same weights."""
    torch = require("torch", "specrt.bench.cpu_precision")
    from specrt.models.llamagen_gpt import GPT, gpt_config
    from specrt.models.llamagen_vq import VQConfig, VQModel
    from specrt.runtime.pipeline import Pipeline

    config = gpt_config(arch, image_size=image_size)
    target = GPT(config).eval()
    target.load_state_dict(torch.load(weights, map_location="cpu")["model"])
    pipe = Pipeline.from_torch(target, None, VQModel(VQConfig(codebook_size=config.vocab_size)).eval(), device="cpu",
                               max_window=1, threads=threads)
    return lambda class_id, seed: pipe.generate([class_id], method="ar", seed=seed, decode=False, **SAMPLING)


def time_paths(paths: dict[str, Callable[[int, int], Any]], rounds: int, say: Callable[[str], None]
               ) -> dict[str, list[float]]:
    """Seconds per image of each path, `rounds` times, alternating; one untimed call each first."""
    for name, run in paths.items():
        say(f"warm-up: {name}")
        run(207, 0)
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(rounds):
        for name, run in paths.items():
            start = time.perf_counter()
            run(207, r + 1)
            seconds[name].append(time.perf_counter() - start)
        say(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()))
    return seconds


def ratio(seconds: dict[str, list[float]], base: str, name: str) -> Optional[float]:
    """Median over rounds of base's time / name's time in the same round (a speed-up)."""
    if base not in seconds:
        return None
    return statistics.median(b / t for b, t in zip(seconds[base], seconds[name]))


def table(seconds: dict[str, list[float]]) -> str:
    """Each path's median and fastest round, its speed-up over the fp32 bundle (of the same KV input
    form, for a bundle) and over LlamaGen."""
    lines = [f"{'path':<34}{'median s':>9}{'fastest s':>10}{'vs fp32 bundle':>15}{'vs LlamaGen':>12}"]
    for name, times in seconds.items():
        suffix = next((s for s in KV_FORMS.values() if s and name.startswith("bundle") and name.endswith(s)), "")
        cells = [ratio(seconds, f"bundle fp32{suffix}", name), ratio(seconds, "LlamaGen generate(), eager", name)]
        shown = "".join(f"{'-' if c is None else f'{c:.2f}x':>{w}}" for c, w in zip(cells, (15, 12)))
        lines.append(f"{name:<34}{statistics.median(times):>9.2f}{min(times):>10.2f}{shown}")
    return "\n".join(lines)


@click.command()
@click.option("--arch", default="GPT-B", show_default=True, help="LlamaGen size (GPT-B, GPT-L, ...).")
@click.option("--image-size", type=click.IntRange(min=16, max=512), default=256, show_default=True)
@click.option("--threads", type=click.IntRange(min=1, max=256), default=2, show_default=True,
              help="onnxruntime intra-op threads and torch threads.")
@click.option("--rounds", type=click.IntRange(min=1, max=50), default=4, show_default=True)
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for the bundles and the weights (kept: a second run reuses them).")
@click.option("--llamagen", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A checkout of FoundationVision/LlamaGen: time its generate() on the same weights.")
@click.option("--torch/--no-torch", "with_torch", default=True, show_default=True,
              help="Also time specrt's PyTorch pipeline on the same weights.")
@click.option("--kv-inputs", "kv_inputs", type=click.Choice(["layers", "stacked", "both"]), default="both",
              show_default=True, help="The bundles' step graphs: per-layer KV inputs (what `specrt export` writes "
                                      "on a CPU-only machine), the stacked past_kv, or both (A/B in one run).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(arch: str, image_size: int, threads: int, rounds: int, work: Path, llamagen: Optional[Path],
         with_torch: bool, kv_inputs: str, json_path: Optional[Path]) -> None:
    """Time plain AR, one image, tokens only: the bundle at each precision, specrt's PyTorch
    pipeline and LlamaGen's eager generate(), alternating."""
    torch = require("torch", "specrt.bench.cpu_precision")
    from specrt.bench.device import device_name
    from specrt.runtime.pipeline import Pipeline

    say = lambda msg: click.echo(msg, err=True)  # noqa: E731
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads)
    forms = ("layers", "stacked") if kv_inputs == "both" else (kv_inputs,)
    bundles = export_paths(arch, image_size, work, say, forms)
    paths: dict[str, Callable[[int, int], Any]] = {}
    if llamagen is not None:
        paths["LlamaGen generate(), eager"] = llamagen_runner(llamagen, arch, image_size, work / "target.pt")
    if with_torch:
        paths["specrt PyTorch fp32 (eager)"] = torch_runner(arch, image_size, work / "target.pt", threads)
    for name, bundle in bundles.items():
        pipe = Pipeline.from_bundle(bundle, threads=threads)
        paths[f"bundle {name}"] = (lambda p: lambda c, s: p.generate([c], method="ar", seed=s, decode=False,
                                                                      **SAMPLING))(pipe)
    seconds = time_paths(paths, rounds, say)
    where = device_name("ort")
    click.echo(f"plain AR, {arch} c2i, random weights (seed 0), {image_size} px, CFG 4, temperature 1, top-k 0, "
               f"one image, tokens only; {where}, {threads} threads; {rounds} rounds alternating")
    click.echo(table(seconds))
    if json_path:
        json_path.write_text(json.dumps({"device": where, "arch": arch, "image_size": image_size, "threads": threads,
                                         "kv_inputs": list(forms),
                                         "rounds": rounds, "sampling": SAMPLING, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
                                         "seconds": seconds}, indent=2) + "\n")


if __name__ == "__main__":
    main()
