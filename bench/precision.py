"""`specrt bench --precision fp32,int8,int4`: the same settings on quantized copies of one bundle.

Each precision other than fp32 is the bundle quantized by `specrt quantize` (target and draft)
with the quantizer that suits this machine (engines.quantize.default_tool: int4 onnxruntime
MatMulNBits; int8 onnxruntime's 8-bit MatMulNBits on a CPU-only machine, ModelOpt QDQ where a
GPU runtime is installed; fp8 ModelOpt QDQ), made once into the bench cache;
`self-int4` / `self-int8` keep the fp32 target and draft with its own quantized copy, so their
sd accepted length stands beside the independent draft's in the same table. Per
precision and setting: latency, accepted length, speed-up against the fp32 bundle's ar, the
weight bytes one target step reads, and fidelity against the fp32 target: the run's class
accuracy and Fréchet distance beside fp32's, and greedy-token agreement (AR at temperature 0,
the same classes, token for token equal to fp32's). Settings are interleaved within each
precision's run (bench.run.benchmark); precisions run one after another, so ratios against the
fp32 ar cross runs — each precision's own ar is reported too.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.manifest import read_manifest

# self-int4 / self-int8: the fp32 target with its own quantized copy as the draft (--self-draft)
PRECISIONS = ("fp32", "int8", "fp8", "int4", "self-int4", "self-int8")
AGREEMENT_IMAGES = 10
Progress = Callable[[str], None]


def check_precisions(precisions: Sequence[str]) -> tuple[str, ...]:
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise SpecrtError(f"--precision: unknown {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}")
    if "fp32" not in precisions:
        raise SpecrtError("--precision must include fp32: speed-ups and fidelity are measured against it")
    return tuple(precisions)


def quantized_bundle(source: Path, precision: str, cache_dir: Path, progress: Optional[Progress] = None) -> Path:
    """`source` quantized to `precision` (target and draft; self-*: the draft only, as the
    target's own quantized copy), made once under `cache_dir`."""
    if precision == "fp32":
        return source
    from specrt.engines.quantize import QuantizeOptions, quantize_bundle

    manifest = read_manifest(source, check_hashes=False)
    digest = hashlib.sha256("".join(sorted(r["sha256"] for r in manifest.files.values())).encode()).hexdigest()[:12]
    options = QuantizeOptions(mode=precision.removeprefix("self-"))
    out = cache_dir / f"{source.name}-{precision}-{options.tool}-{digest}"
    if not (out / "manifest.json").is_file():
        if progress:
            progress(f"quantizing {source} to {precision} ({options.tool}) once into {out} ...")
        quantize_bundle(source, out, options, self_draft=precision.startswith("self-"), progress=progress)
    return out


def quantizer(bundle: Path) -> str:
    """The tool that quantized a bundle's graphs ('-' for an fp32 bundle)."""
    records = [g.quantization for g in read_manifest(bundle, check_hashes=False).graphs.values() if g.quantization]
    return records[0]["tool"] if records else "-"


def target_weight_bytes(bundle: Path) -> int:
    """Weight bytes one target step reads (bench.onnx_profile.weight_bytes of target_step)."""
    import onnx

    from specrt.bench.onnx_profile import weight_bytes

    manifest = read_manifest(bundle, check_hashes=False)
    return weight_bytes(onnx.load(str(manifest.graph_path("target_step")), load_external_data=True))


def greedy_tokens(pipeline: Any, images: int) -> np.ndarray:
    classes = pipeline.target.spec.num_classes
    return np.concatenate([pipeline.generate([i % classes], method="ar", seed=i, temperature=0.0).tokens
                           for i in range(images)])


@dataclass
class PrecisionRow:
    precision: str
    quantizer: str
    label: str
    latency_ms: float
    accepted_length: float
    speedup_vs_fp32_ar: float
    speedup_vs_own_ar: Optional[float]
    weight_mb_per_target_step: float
    greedy_agreement: float
    class_accuracy: Optional[float]
    frechet_distance: Optional[float]


def precision_benchmark(source: Path, precisions: Sequence[str], open_pipeline: Callable[[Path], Any], judge: Any,
                        settings: Sequence[Any], images: int, seed: int, threads: Optional[int], backend: str,
                        cache_dir: Path, on_image: Optional[Callable[[Any], None]] = None,
                        progress: Optional[Progress] = None) -> tuple[list[PrecisionRow], dict[str, Any]]:
    """Rows for the table and a JSON payload (each precision's full bench payload under `runs`)."""
    from specrt.bench.models import BenchModels
    from specrt.bench.run import benchmark

    bundles = {p: quantized_bundle(source, p, cache_dir, progress) for p in precisions}
    runs, reference, fp32_ar = {}, None, None
    rows: list[PrecisionRow] = []
    for precision in precisions:
        pipeline = open_pipeline(bundles[precision])
        models = BenchModels(pipeline, backend, f"{bundles[precision]} ({precision})", judge)
        run = benchmark(models, settings, images, seed, threads, on_image)
        runs[precision] = run.payload
        tokens = greedy_tokens(pipeline, min(images, AGREEMENT_IMAGES))
        reference = tokens if reference is None else reference
        ar = next((r for r in run.results if r.method == "ar"), None)
        fp32_ar = fp32_ar or (ar.latency_s["median"] if ar else None)
        weights = target_weight_bytes(bundles[precision])
        for result in run.results:
            rows.append(PrecisionRow(
                precision=precision, quantizer=quantizer(bundles[precision]), label=result.label,
                latency_ms=1000 * result.latency_s["median"],
                accepted_length=result.mean_accepted_length,
                speedup_vs_fp32_ar=fp32_ar / result.latency_s["median"] if fp32_ar else float("nan"),
                speedup_vs_own_ar=result.speedup_vs_ar, weight_mb_per_target_step=weights / 1e6,
                greedy_agreement=float((tokens == reference).mean()),
                class_accuracy=result.quality.get("class_accuracy"),
                frechet_distance=result.quality.get("frechet_distance")))
    payload = {"precisions": list(precisions), "bundles": {p: str(b) for p, b in bundles.items()},
               "rows": [vars(r) for r in rows],
               "greedy_agreement": f"AR at temperature 0 on the first {min(images, AGREEMENT_IMAGES)} images' classes "
                                   "and seeds: share of tokens equal to the fp32 bundle's",
               "speedup": "median latency of the fp32 bundle's ar / setting's; precisions run one after another",
               "runs": runs}
    return rows, payload


def format_precision_table(rows: Sequence[PrecisionRow]) -> str:
    headers = ["precision", "quantizer", "setting", "ms/image", "acc.len", "vs fp32 ar", "vs own ar",
               "MB/target step", "greedy agree", "class acc", "FD"]

    def cell(value: Optional[float], fmt: str) -> str:
        return "-" if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, fmt)
    table = [[r.precision, r.quantizer, r.label, cell(r.latency_ms, ".1f"), cell(r.accepted_length, ".2f"),
              cell(r.speedup_vs_fp32_ar, ".2f") + "x", cell(r.speedup_vs_own_ar, ".2f") + "x",
              cell(r.weight_mb_per_target_step, ".2f"), cell(r.greedy_agreement, ".3f"),
              cell(r.class_accuracy, ".3f"), cell(r.frechet_distance, ".1f")] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *table)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in table])
