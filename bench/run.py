"""One benchmark run end to end: measure every setting, judge fidelity, attach speed-ups.

    models = open_models()                      # the demo on onnxruntime (bench.models)
    run = benchmark(models, build_settings(...), images=200)
    print(format_table(run.results)); write_json(path, run.payload)

Everything a reader needs to trust a number goes into the payload: device, backend,
bundle, thread count, image count and seeds, sampling parameters, the Fréchet-distance
noise floor at the run's sample size, and the wall time of the whole run.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from specrt.bench.device import device_name
import numpy as np

from specrt.bench.measure import THEORY_IMAGES, SettingRecords, has_theory, run_settings, summarise, theory_pass
from specrt.bench.models import BenchModels
from specrt.bench.report import MethodResult, attach_speedups, to_json_object
from specrt.bench.settings import Setting


@dataclass
class BenchRun:
    results: list[MethodResult]
    payload: dict[str, Any]

    @property
    def fd_floor(self) -> Optional[float]:
        floor = self.payload["settings"].get("fd_noise_floor")
        return floor["frechet_distance"] if floor else None


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("numpy", "onnxruntime", "torch"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


# The demo's committed run (bench/results/demo.json, 180 images, 64-d evaluator features): the FD
# noise floor is 61 ± 28 while the methods' distances are 120-240 ± 30-37; at 8 images the floor is
# 1520 ± 792. The floor falls as ~1/N (61 x 179 ≈ 1520 x 8 ≈ 11,000), so at 180 images it sits at
# half the smallest method's distance: the fewest images at which gaps between methods show.
FIDELITY_IMAGES = 180


def fidelity_sample_note(images: int, feature_dim: int) -> Optional[str]:
    """A warning when `images` per setting are too few for the fidelity columns, else None.

    Below feature_dim + 1 images the sample covariance of the evaluator's features is singular, so
    a Fréchet distance (and the real-vs-real noise floor) is dominated by the estimator, not the
    images: those columns mean nothing. Between that and FIDELITY_IMAGES the floor (~11,000 / N on
    the demo) is above half the methods' distances, so their gaps are inside the noise."""
    if images >= FIDELITY_IMAGES:
        return None
    if images <= feature_dim:
        return (f"{images} images per setting: the Fréchet distances and the FD noise floor mean nothing at this "
                f"size (the evaluator's {feature_dim}-d feature covariance needs more than {feature_dim} images); "
                f"use --images {FIDELITY_IMAGES} or more to compare methods' fidelity")
    return (f"{images} images per setting: the Fréchet distances are rough at this size (the noise floor falls as "
            f"~1/images and is above half the methods' distances below {FIDELITY_IMAGES}); use --images "
            f"{FIDELITY_IMAGES} or more to compare methods' fidelity")


def planned_images(settings: Sequence[Setting], images: int, batches: Sequence[int] = (1,)) -> int:
    """How many images a run generates (timed run + Theorem-2 pass), for a progress bar."""
    return images * len(settings) * len(batches) + min(images, THEORY_IMAGES) * sum(map(has_theory, settings))


def _bytes_per_image(pipe: Any) -> int:
    """What a run keeps of one image: its RGB pixels and its tokens (int64)."""
    try:
        height, width = pipe.image_size
        tokens = pipe.target.spec.num_image_tokens
    except AttributeError:
        return 1 << 16
    return height * width * 3 + 8 * tokens


def same_tokens_at_every_batch(records: Sequence[SettingRecords]) -> bool:
    """Whether every setting produced the same tokens at each batch size (each image's numbers
    drawn from its own seed make batching exact; the run checks it on every image it times)."""
    first: dict[Setting, list] = {}
    for record in records:
        reference = first.setdefault(record.setting, record.token_maps)
        if not all(np.array_equal(a, b) for a, b in zip(reference, record.token_maps)):
            return False
    return True


def benchmark(models: BenchModels, settings: Sequence[Setting], images: int, seed: int = 0,
              threads: Optional[int] = None, on_image: Optional[Callable[[Setting], None]] = None,
              keep_tokens: bool = False, batches: Sequence[int] = (1,)) -> BenchRun:
    """Measure `settings` on `images` images each (interleaved) at every batch size, judge them, and
    build the JSON payload (with every image's tokens when keep_tokens: to compare settings or
    backends offline)."""
    from specrt import validation

    started = time.perf_counter()
    kept = len(settings) * len(batches) * _bytes_per_image(models.pipeline)
    validation.within_memory("images", validation.count("images", images), kept,
                             f"every setting's images and tokens at {len(batches)} batch size(s), kept for the judge")
    records, labels = run_settings(models.pipeline, settings, images, seed, on_image, batches, models.drafts,
                                   models.prompts)
    theory_images = min(images, THEORY_IMAGES)
    theory = theory_pass(models.pipeline, settings, theory_images, seed, on_image, models.drafts, models.prompts)
    results = [summarise(r, theory.get(r.setting)) for r in records]
    if keep_tokens:
        for result, record in zip(results, records):
            result.tokens = [t.tolist() for t in record.token_maps]
    floor = None
    if models.judge is not None:
        judged: dict[Setting, dict] = {}  # the same tokens at every batch size: judged once per setting
        for result, record in zip(results, records):
            if record.setting not in judged or record.batch == 1:
                judged[record.setting] = {**models.judge.score(np.stack(record.images), labels),
                                          "images": len(record.images)}
            result.quality = judged[record.setting]
        floor = models.judge.noise_floor(images)
        floor["feature_dim"] = models.judge.feature_dim
    attach_speedups(results)
    settings_info = {
        "images_per_setting": images,
        "seed": seed,
        "image_plan": ("image i: prompt i mod len(prompts)" if models.prompts else "image i: class i mod num_classes")
                      + ", seed + i; settings run in a fresh random order per image (per block of max(batches) images)",
        **({"prompts": list(models.prompts)} if models.prompts else {}),
        "batches": list(batches),
        "latency": "per image: generate-call wall time / images in the call (batch 1: the image's latency)",
        "tokens_identical_across_batches": same_tokens_at_every_batch(records) if len(batches) > 1 else None,
        "threads": threads,
        "sampling": dict(models.pipeline.sampling_defaults),
        "settings": [{"method": s.method, "params": s.params, "label": s.label,
                      **({"draft": s.draft} if s.draft else {}), **({"loop": s.loop} if s.loop else {}),
                      **({"chosen_by": s.chosen_by} if s.chosen_by else {})}
                     for s in settings],
        "loop": ([*dict.fromkeys(s.loop for s in settings)] if any(s.loop for s in settings)
                 else getattr(models.pipeline, "loop", None)),  # several: each setting's in "settings"
        **({"drafts": models.draft_sources} if models.drafts else {}),
        "speedup": "median latency of ar / median latency of the setting, same run, batch size and loop",
        "predicted_speedup": "the cost model on this run's graph timings: ar's target + draft + VQ-decode seconds "
                             "per image / the setting's (host work free); measured_over_predicted = mean_speedup_vs_ar "
                             "(mean latencies) / predicted_speedup_vs_ar",
        "theorem2": f"relaxed settings re-run untimed on the first {theory_images} images with the runtime's "
                    "Theorem-2 estimates on (timed runs have them off), on the host loop (the device round has none)",
        "fd_noise_floor": floor,
        "fd_reference": "held-out real digits, half A (class-interleaved); floor = half B's first N images vs half A",
        "wall_time_s": None,
        "versions": _versions(),
    }
    payload = to_json_object(results, device=device_name(models.backend), backend=models.backend,
                             bundle=models.bundle, settings=settings_info)
    settings_info["wall_time_s"] = round(time.perf_counter() - started, 1)
    return BenchRun(results, payload)
