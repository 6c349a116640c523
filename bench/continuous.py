"""`specrt bench --demo mar` (or a continuous BUNDLE): ar against cspd settings in one run.

Same plan as the discrete bench (bench/run.py): image i asks for class i mod 10 with seed + i
under every setting, the settings run in a fresh random order per call (so load drifts hit
them alike) after one untimed warm-up call each, speed-ups are median-latency ratios against ar
from the same run, and images are judged by the c2i demo's evaluator (class accuracy, Fréchet
distance against held-out real digits, with the real-vs-real floor at the same size). Latency is
the generation alone; the tokenizer decoder runs once per image for every setting alike and is
left out.
Per setting: tokens per target pass (accepted drafts + the one the target adds), target passes
per image, acceptance rate of drafted tokens, residual proposals per image, and where the time
goes: the host share (the time outside the model passes: the host loop's runner calls, the device
round as a whole) and, for the device round, its host reads per round. On the PyTorch backend
(`--backend torch`) `--loop host,round` runs every setting once per loop (rows `loop=host`,
`loop=round`, speed-ups against ar in the same loop) and `--batch 1,8` every setting at every batch
size (speed-ups against ar at the same batch).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt import validation
from specrt.bench.measure import keep_every_round
from specrt.bench.report import latency_summary, share_outside
from specrt.bench.settings import _parse_value
from specrt.errors import SpecrtError
from specrt.runtime.families.continuous.methods import CONTINUOUS_METHODS, make_continuous_method

DEFAULT_SWEEPS = ("cspd:draft_len=2,4,8",)
SAMPLING_SWEEP_KEYS = ("cfg_scale", "temperature", "cfg_schedule")


@dataclass(frozen=True)
class ContinuousSetting:
    method: str
    params: tuple[tuple[str, Any], ...] = ()
    loop: str = ""  # the decoding loop when a run compares several (runtime.rounds.LOOPS); "" = the pipeline's own

    @property
    def label(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        return (f"{self.method}({inner})" if inner else self.method) + (f" loop={self.loop}" if self.loop else "")


@dataclass
class ContinuousRow:
    setting: ContinuousSetting
    batch: int = 1  # images per generate call; latencies are per image (call time / images)
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    residual_proposals: int = 0
    call_seconds: float = 0.0    # generation time of every call, summed
    model_seconds: float = 0.0   # of it inside model passes: the host loop's runner calls, the device round whole
    graph_runs: int = 0          # target passes (graph runs or device rounds; a batch's step counts once)
    host_syncs: Optional[int] = None  # host reads of device results, where the loop counts them (the device round)
    images: list[np.ndarray] = field(default_factory=list)
    quality: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.setting.label + (f" batch={self.batch}" if self.batch > 1 else "")

    def summary(self, ar_median: Optional[float]) -> dict[str, Any]:
        n = len(self.latencies)
        latency = latency_summary(self.latencies)
        extra = {"loop": self.setting.loop} if self.setting.loop else {}
        return {"method": self.setting.method, "params": dict(self.setting.params), "label": self.label, **extra,
                "batch": self.batch, "images": n, "tokens_per_target_pass": self.tokens / self.target_passes,
                "target_passes_per_image": self.target_passes / n,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
                "residual_proposals_per_image": self.residual_proposals / n, "latency_s": latency,
                "speedup_vs_ar": ar_median / latency["median"] if ar_median else None,
                # outside the model passes: on the host loop its drawing, verification, cache upkeep and
                # orchestration; on the device round its setup and the reads of its results (the round counts whole)
                "host_share": share_outside(self.call_seconds, self.model_seconds),
                "host_syncs_per_round": self.host_syncs / self.graph_runs if self.host_syncs is not None else None,
                "quality": self.quality}


def build_settings(methods: str = "ar,cspd", sweeps: Sequence[str] = (),
                   loops: Sequence[str] = ()) -> list[ContinuousSetting]:
    """ar first, then each method at its defaults or at every value of its --sweep METHOD:KEY=V1,V2
    (';' between keys crosses them); each setting is checked by building its method. With several
    `loops`, every setting once per loop, next to each other (one loop is the pipeline's own and
    labels nothing)."""
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
    if len(loops) > 1:
        settings = [ContinuousSetting(s.method, s.params, loop) for s in settings for loop in loops]
    return settings


def run_continuous(pipe: Any, settings: Sequence[ContinuousSetting], images: int, seed: int = 0,
                   judge: Any = None, conditions: Optional[Sequence[int]] = None,
                   on_image: Optional[Callable[[ContinuousSetting], None]] = None,
                   batches: Sequence[int] = (1,)) -> dict[str, Any]:
    """Measure every setting at every batch size on `images` images (interleaved, after an untimed
    warm-up call each) and judge them; the JSON payload. A batch of b asks for images i..i+b-1 in one
    call, so an image is the same in every row (its class and seed do not depend on the batch)."""
    rows = {(s, b): ContinuousRow(s, b) for b in batches for s in settings}
    labels = np.asarray(conditions if conditions is not None else [i % pipe.num_classes for i in range(images)])
    order_rng = np.random.default_rng(seed)
    decode = pipe.decoder is not None  # a bundle without a tokenizer decoder is timed, not judged
    own_loop = pipe.loop
    keep_every_round(pipe, len(settings))  # a batch's settings alternate; batches run one after the other
    try:
        for batch in batches:
            _warm_up(pipe, settings, batch, int(labels[0]), own_loop)
            for first in range(0, images, batch):
                group = list(range(first, min(first + batch, images)))
                for index in order_rng.permutation(len(settings)):
                    setting = settings[index]
                    pipe.loop = setting.loop or own_loop
                    _measure_call(pipe, rows[setting, batch], labels[group], [seed + i for i in group], decode)
                    if on_image:
                        for _ in group:
                            on_image(setting)
    finally:
        pipe.loop = own_loop
    floor = None
    if judge is not None and decode:
        for row in rows.values():
            row.quality = judge.score(np.stack(row.images), labels[: len(row.images)])
        floor = {**judge.noise_floor(images), "feature_dim": judge.feature_dim}
    results = []
    for (setting, batch), row in rows.items():  # against ar in the same loop at the same batch
        ar = rows.get((ContinuousSetting("ar", (), setting.loop), batch))
        results.append(row.summary(float(np.median(ar.latencies)) if ar is not None else None))
    return {"results": results, "fd_noise_floor": floor,
            "images_per_setting": images, "batches": list(batches), "seed": seed,
            "sampling": dict(pipe.sampling_defaults),
            "image_plan": "image i: class i mod 10, seed + i; settings in a fresh random order per call of "
                          "`batch` images",
            "speedup": "median latency of ar / median latency of the setting, same run, same loop and batch "
                       "(generation only, the tokenizer decode excluded; latency per image = call time / images)"}


def _warm_up(pipe: Any, settings: Sequence[ContinuousSetting], batch: int, condition: int, own_loop: str) -> None:
    """One untimed call per setting at this batch size before its timed ones (as the discrete bench):
    first-touch allocations, and the device round's first run and CUDA-graph capture, which later
    calls of its shape replay. A setting the loop cannot run is named in the one-line error."""
    from specrt.bench.measure import WARMUP_SEED

    for setting in settings:
        pipe.loop = setting.loop or own_loop
        try:
            pipe.generate([condition] * batch, method=setting.method, seed=WARMUP_SEED, decode=False,
                          **dict(setting.params))
        except SpecrtError as exc:
            raise SpecrtError(f"setting {setting.label}: {exc}") from None


def _measure_call(pipe: Any, row: ContinuousRow, class_ids: np.ndarray, seeds: list[int], decode: bool) -> None:
    """One generate call of row's setting, its time and counters added to the row. The model time is
    the runners' (the host loop's model calls) plus the device round's (it runs whole on the device)."""
    setting = row.setting
    runners = [r for r in (pipe.target, pipe.draft) if r is not None]
    before = sum(r.forward_seconds for r in runners)
    result = pipe.generate([int(c) for c in class_ids], method=setting.method, seed=seeds, decode=decode,
                           **dict(setting.params))
    stats, call = result.stats, result.seconds[0]  # one pass: every image of the call shares its time
    row.latencies += [call / len(seeds)] * len(seeds)
    row.call_seconds += call
    row.model_seconds += stats.round_seconds + sum(r.forward_seconds for r in runners) - before
    row.tokens += stats.tokens
    row.target_passes += stats.target_forwards  # per image: a step over a batch of 8 counts 8
    row.graph_runs += stats.target_passes
    row.drafted += stats.drafted
    row.accepted += stats.accepted
    row.residual_proposals += stats.residual_proposals
    if stats.host_syncs is not None:
        row.host_syncs = (row.host_syncs or 0) + stats.host_syncs
    if decode:
        row.images.extend(result.images)


HEADERS = ["setting", "tokens / target pass", "target passes / image", "acceptance", "residual proposals / image",
           "latency median (ms)", "speed-up vs ar", "host %", "syncs/round", "class accuracy",
           "Fréchet distance ± sd"]


def _rows(payload: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in payload["results"]:
        q = r["quality"]
        fd = (f"{q['frechet_distance']:.1f} ± {q['frechet_distance_std']:.1f}"
              if q.get("frechet_distance") is not None and q.get("frechet_distance_std") is not None else "-")
        rows.append([r["label"], f"{r['tokens_per_target_pass']:.2f}", f"{r['target_passes_per_image']:.1f}",
                     "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}",
                     f"{r['residual_proposals_per_image']:.1f}", f"{1000 * r['latency_s']['median']:.0f}",
                     "-" if r["speedup_vs_ar"] is None else f"{r['speedup_vs_ar']:.2f}x",
                     "-" if r.get("host_share") is None else f"{100 * r['host_share']:.1f}",
                     "-" if r.get("host_syncs_per_round") is None else f"{r['host_syncs_per_round']:.2f}",
                     f"{q['class_accuracy']:.3f}" if "class_accuracy" in q else "-", fd])
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
                demo_weights: Any, cache_dir: Any, progress: bool, loops: Sequence[str] = ("auto",),
                batches: Sequence[int] = (1,)) -> None:
    """`specrt bench` for the continuous family (runtime/families names it): ar and cspd settings on
    a continuous bundle (the mar demo's, exported once) on onnxruntime, or on the demo's PyTorch
    modules (`--backend torch`, on `device`, every setting once per loop of `loops`), at every batch
    size of `batches`; tables on stdout, JSON / Markdown on request."""
    import time

    import click
    from tqdm import tqdm

    from specrt.bench.device import device_name
    from specrt.bench.models import refuse_torch_bundle
    from specrt.export.mar import hooks
    from specrt.runtime.family_registry import open_bundle
    from specrt.runtime.threads import set_torch_threads

    if demo is not None and bundle is not None:
        raise SpecrtError("--demo picks an embedded demo: give it without a BUNDLE")
    refuse_torch_bundle(bundle, backend)  # the torch backend runs the demo's modules
    if backend not in ("ort", "torch"):
        raise SpecrtError(f"a continuous model is benchmarked on --backend ort or torch, not --backend {backend}")
    if backend == "ort" and threads != 1:
        raise SpecrtError("a continuous model is benchmarked on --backend ort with --threads 1 (its runners take one thread)")
    started = time.perf_counter()
    settings = build_settings(methods or "ar,cspd", sweeps or ([] if methods else DEFAULT_SWEEPS), loops)
    if device.strip().lower() != "cpu" and backend != "torch":
        raise SpecrtError(f"--device {device} applies to --backend torch (and --profile-arch); "
                          f"--backend {backend} picks its device itself")
    device = validation.torch_device(device)  # a CPU-only torch and --device cuda: one line, before loading
    say = (lambda msg: click.echo(msg, err=True)) if progress else None
    set_torch_threads(threads)  # torch runs the export and the evaluator (and the models on --backend torch)
    if backend == "torch":
        path, pipe = None, hooks.torch_pipeline(demo_weights, threads, device)
    else:
        path = bundle if bundle is not None else demo_bundle(demo_weights, cache_dir, say)
        pipe = open_bundle(path)
    if len(loops) == 1:  # one loop: the pipeline's own (several: each setting sets its own)
        pipe.loop = loops[0]
    if max(batches) > pipe.max_images:
        raise SpecrtError(f"--batch {max(batches)} exceeds the {pipe.max_images} images this model decodes per call")
    judge = hooks.fidelity_judge() if bundle is None or pipe.source.endswith(":mar") else None
    bar = tqdm(total=images * len(settings) * len(batches), unit="img", disable=not progress, dynamic_ncols=True,
               leave=False)

    def tick(setting) -> None:
        bar.set_description(setting.label, refresh=False)
        bar.update()
    try:
        payload = run_continuous(pipe, settings, images, seed, judge, on_image=tick, batches=batches)
    finally:
        bar.close()
    where = device_name("torch-cuda" if device.startswith("cuda") else backend)
    source = (pipe.source if path is None else f"{pipe.source} (exported to {path})") if bundle is None else str(bundle)
    payload.update(device=where, backend=backend, threads=threads, bundle=source, loop=list(loops),
                   wall_time_s=round(time.perf_counter() - started, 1))
    runs_on = f"torch on {device}" if backend == "torch" else "ort"
    within = ("; ar in the same loop" if len(loops) > 1 else "") + (", at the same batch" if len(batches) > 1 else "")
    click.echo(f"device: {where}  backend: {runs_on} ({threads} thread(s))  bundle: {source}; {images} images "
               f"per setting, interleaved; speed-up = median latency of ar / setting (generation only{within})")
    click.echo(format_text(payload))
    click.echo("host % = time outside the model passes / generation time (the device round counts whole); "
               "syncs/round = host reads of device results per target pass (the device round's; - where not counted)")
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
