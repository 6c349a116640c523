"""`specrt bench --demo mar` (or a continuous BUNDLE): ar against cspd settings in one run.

Same plan as the discrete bench (bench/run.py): image i asks for class i mod 10 with seed + i
under every setting, the settings run in a fresh random order per image (so load drifts hit
them alike), speed-ups are median-latency ratios against ar from the same run, and images
are judged by the c2i demo's evaluator (class accuracy, Fréchet distance against held-out real
digits, with the real-vs-real floor at the same size). Latency is the generation alone; the
tokenizer decoder runs once per image for every setting alike and is left out.
Per setting: tokens per target pass (accepted drafts + the one the target adds), target passes
per image, acceptance rate of drafted tokens, residual proposals per image.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt.bench.report import latency_summary
from specrt.bench.settings import _parse_value
from specrt.errors import SpecrtError
from specrt.runtime.families.continuous.methods import CONTINUOUS_METHODS, make_continuous_method

DEFAULT_SWEEPS = ("cspd:draft_len=2,4,8",)
SAMPLING_SWEEP_KEYS = ("cfg_scale", "temperature", "cfg_schedule")


@dataclass(frozen=True)
class ContinuousSetting:
    method: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.method}({inner})" if inner else self.method


@dataclass
class ContinuousRow:
    setting: ContinuousSetting
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    residual_proposals: int = 0
    images: list[np.ndarray] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)

    def summary(self, ar_median: Optional[float]) -> dict[str, Any]:
        n = len(self.latencies)
        latency = latency_summary(self.latencies)
        return {"method": self.setting.method, "params": dict(self.setting.params), "label": self.setting.label,
                "images": n, "tokens_per_target_pass": self.tokens / self.target_passes,
                "target_passes_per_image": self.target_passes / n,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
                "residual_proposals_per_image": self.residual_proposals / n, "latency_s": latency,
                "speedup_vs_ar": ar_median / latency["median"] if ar_median else None, "quality": self.quality}


def build_settings(methods: str = "ar,cspd", sweeps: Sequence[str] = ()) -> list[ContinuousSetting]:
    """ar first, then each method at its defaults or at every value of its --sweep METHOD:KEY=V1,V2
    (';' between keys crosses them); each setting is checked by building its method."""
    names = [m.strip() for m in methods.split(",") if m.strip()]
    swept: dict[str, list[dict[str, Any]]] = {}
    for spec in sweeps:
        method, sep, rest = spec.partition(":")
        axes = [part.partition("=") for part in rest.split(";")]
        if not sep or any(not eq or not key.strip() for key, eq, _ in axes):
            raise SpecrtError(f"--sweep {spec!r}: expected METHOD:KEY=V1,V2[;KEY=V1,V2]")
        grid = [[(key.strip(), _parse_value(v)) for v in values.split(",") if v.strip()] for key, _, values in axes]
        swept.setdefault(method.strip(), []).extend(dict(combo) for combo in itertools.product(*grid))
    settings = [ContinuousSetting("ar")]
    for name in dict.fromkeys([*names, *swept]):
        if name not in CONTINUOUS_METHODS:
            raise SpecrtError(f"unknown method {name!r} for a continuous model; choose from {', '.join(CONTINUOUS_METHODS)}")
        for params in swept.get(name, [{}]):
            setting = ContinuousSetting(name, tuple(sorted(params.items())))
            if setting not in settings:
                settings.append(setting)
    for setting in settings:
        method_params = {k: v for k, v in setting.params if k not in SAMPLING_SWEEP_KEYS}
        try:
            make_continuous_method(setting.method, **method_params)
        except SpecrtError as exc:
            raise SpecrtError(f"setting {setting.label}: {exc}") from None
    return settings


def run_continuous(pipe: Any, settings: Sequence[ContinuousSetting], images: int, seed: int = 0,
                   judge: Any = None, conditions: Optional[Sequence[int]] = None,
                   on_image: Optional[Callable[[ContinuousSetting], None]] = None) -> dict[str, Any]:
    """Measure every setting on `images` images (interleaved) and judge them; the JSON payload."""
    rows = {s: ContinuousRow(s) for s in settings}
    labels = np.asarray(conditions if conditions is not None else [i % pipe.num_classes for i in range(images)])
    order_rng = np.random.default_rng(seed)
    decode = pipe.decoder is not None  # a bundle without a tokenizer decoder is timed, not judged
    for i in range(images):
        for index in order_rng.permutation(len(settings)):
            setting = settings[index]
            result = pipe.generate([int(labels[i])], method=setting.method, seed=seed + i, decode=decode,
                                   **dict(setting.params))
            row, stats = rows[setting], result.stats
            row.latencies.append(result.seconds[0])
            row.tokens += stats.tokens
            row.target_passes += stats.target_forwards  # per image (one image per call here)
            row.drafted += stats.drafted
            row.accepted += stats.accepted
            row.residual_proposals += stats.residual_proposals
            if decode:
                row.images.append(result.images[0])
            if on_image:
                on_image(setting)
    floor = None
    if judge is not None and decode:
        for row in rows.values():
            row.quality = judge.score(np.stack(row.images), labels[: len(row.images)])
        floor = {**judge.noise_floor(images), "feature_dim": judge.feature_dim}
    ar_median = float(np.median(rows[settings[0]].latencies))
    return {"results": [rows[s].summary(ar_median) for s in settings], "fd_noise_floor": floor,
            "images_per_setting": images, "seed": seed, "sampling": dict(pipe.sampling_defaults),
            "image_plan": "image i: class i mod 10, seed + i; settings in a fresh random order per image",
            "speedup": "median latency of ar / median latency of the setting, same run (generation only, "
                       "the tokenizer decode excluded)"}


HEADERS = ["setting", "tokens / target pass", "target passes / image", "acceptance", "residual proposals / image",
           "latency median (ms)", "speed-up vs ar", "class accuracy", "Fréchet distance ± sd"]


def _rows(payload: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in payload["results"]:
        q = r["quality"]
        fd = (f"{q['frechet_distance']:.1f} ± {q['frechet_distance_std']:.1f}"
              if q.get("frechet_distance") is not None and q.get("frechet_distance_std") is not None else "-")
        rows.append([r["label"], f"{r['tokens_per_target_pass']:.2f}", f"{r['target_passes_per_image']:.1f}",
                     "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}",
                     f"{r['residual_proposals_per_image']:.1f}", f"{1000 * r['latency_s']['median']:.0f}",
                     f"{r['speedup_vs_ar']:.2f}x", f"{q['class_accuracy']:.3f}" if "class_accuracy" in q else "-", fd])
    return rows


def _floor(payload: dict[str, Any]) -> list[str]:
    floor = payload.get("fd_noise_floor")
    if not floor or floor.get("frechet_distance") is None:
        return []
    return [f"Fréchet-distance noise floor (real vs real, {floor['images']} vs {floor['reference_images']} "
            f"images, {floor['feature_dim']}-d evaluator features): {floor['frechet_distance']:.1f} ± "
            f"{floor['frechet_distance_std'] or 0:.1f}; evaluator accuracy on real held-out digits: "
            f"{floor['real_class_accuracy']:.3f}"]


def format_text(payload: dict[str, Any]) -> str:
    """The run as the terminal table every `specrt bench` prints."""
    from specrt.bench.report import fixed_width

    return "\n".join([fixed_width(HEADERS, _rows(payload)), *_floor(payload)])


def format_table(payload: dict[str, Any]) -> str:
    """The run as a Markdown table (`--markdown`; what the README quotes)."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|" + "---:|" * (len(HEADERS) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(payload)]
    return "\n".join(lines + [("\n" + line) for line in _floor(payload)])


def run_command(bundle: Any, demo: Optional[str], methods: Optional[str], sweeps: Sequence[str], backend: str,
                device: str, images: int, seed: int, threads: int, json_path: Any, markdown_path: Any,
                demo_weights: Any, cache_dir: Any, progress: bool) -> None:
    """`specrt bench` for the continuous family (runtime/families names it): ar and cspd settings on
    a continuous bundle (the mar demo's, exported once), tables on stdout, JSON / Markdown on request."""
    import time

    import click
    from tqdm import tqdm

    from specrt.bench.device import device_name
    from specrt.errors import SpecrtError
    from specrt.export.mar.hooks import fidelity_judge
    from specrt.runtime.family_registry import open_bundle
    from specrt.runtime.threads import set_torch_threads

    if demo is not None and bundle is not None:
        raise SpecrtError("--demo picks an embedded demo: give it without a BUNDLE")
    if device.strip().lower() != "cpu":
        raise SpecrtError(f"--device {device} applies to --backend torch (and --profile-arch); a continuous model "
                          "is benchmarked on onnxruntime on the CPU")
    if backend != "ort" or threads != 1:
        raise SpecrtError("a continuous model is benchmarked on --backend ort with --threads 1 (its runners take one thread)")
    started = time.perf_counter()
    settings = build_settings(methods or "ar,cspd", sweeps or ([] if methods else DEFAULT_SWEEPS))
    say = (lambda msg: click.echo(msg, err=True)) if progress else None
    set_torch_threads(threads)  # torch runs the export and the evaluator
    path = bundle if bundle is not None else demo_bundle(demo_weights, cache_dir, say)
    pipe = open_bundle(path)
    judge = fidelity_judge() if bundle is None or pipe.source.endswith(":mar") else None
    bar = tqdm(total=images * len(settings), unit="img", disable=not progress, dynamic_ncols=True, leave=False)

    def tick(setting) -> None:
        bar.set_description(setting.label, refresh=False)
        bar.update()
    try:
        payload = run_continuous(pipe, settings, images, seed, judge, on_image=tick)
    finally:
        bar.close()
    payload.update(device=device_name(backend), backend=backend, threads=threads,
                   bundle=f"{pipe.source} (exported to {path})" if bundle is None else str(bundle),
                   wall_time_s=round(time.perf_counter() - started, 1))
    click.echo(f"device: {payload['device']}  backend: ort (1 thread)  bundle: {payload['bundle']}; {images} images "
               f"per setting, interleaved; speed-up = median latency of ar / setting (generation only)")
    click.echo(format_text(payload))
    click.echo(f"run time {payload['wall_time_s']:.0f} s")
    if json_path:
        from specrt.bench.report import write_json

        write_json(str(json_path), payload)
        click.echo(f"wrote {json_path}")
    if markdown_path:
        markdown_path.write_text(format_table(payload) + "\n", encoding="utf-8")
        click.echo(f"wrote {markdown_path}")


def demo_bundle(weights: Any = None, cache_dir: Any = None, progress: Optional[Callable[[str], None]] = None) -> Any:
    """The mar demo exported once to <cache>/bench/mar-v<format>-<digest>/ (onnxruntime runs it,
    as the discrete bench runs its demo: a bundle is what specrt deploys)."""
    from pathlib import Path

    from specrt.bench.models import cache_root, weights_digest
    from specrt.export.mar import hooks
    from specrt.export.mar.export import FORMAT_VERSION

    folder = Path(weights) if weights is not None else hooks.packaged_weights_dir()
    out = Path(cache_dir or cache_root() / "bench") / f"mar-v{FORMAT_VERSION}-{weights_digest(folder)}"
    if not (out / "manifest.json").is_file():
        if progress:
            progress(f"exporting the mar demo bundle once to {out} ...")
        hooks.export_bundle(out, weights)
    return out
