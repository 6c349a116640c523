"""The measurement loop: every setting generates the same images, interleaved image by image.

Image i asks for class i mod num_classes (c2i) or prompt i mod len(prompts) (t2i; each
prompt is encoded once, before timing, so the text encoder is charged to no method) with
seed base_seed + i, for every setting and batch size. At batch size b the images go to Pipeline.generate b at a time (image plan
order, each with its own seed, so the tokens are the batch-1 run's). The settings run in a
fresh random order for each block of images (one image at batch 1; the largest batch size
otherwise), so slow phases of a shared machine (other processes, thermal changes) fall on
all settings alike instead of on whichever method happened to run during them. Each setting
runs one untimed warm-up call per batch size first (session start-up, first-touch
allocations). Latency per image is the wall-clock time around one Pipeline.generate call
divided by its images (its CFG pairs and VQ decode included): at batch 1 the image's
latency, at batch b the amortised cost an image pays (1 / images per second).
"""
from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from specrt.bench.report import MethodResult, latency_summary
from specrt.bench.settings import Setting
from specrt.errors import SpecrtError
from specrt.runtime.methods import METHODS
from specrt.runtime.pipeline import Pipeline

WARMUP_SEED = 1_000_003
THEORY_IMAGES = 24  # images per relaxed setting in the untimed Theorem-2 pass
# runtime Stats.seconds keys -> the benchmark's breakdown keys (report.BREAKDOWN_KEYS)
BREAKDOWN_FROM_STATS = {"target_forward": "target_forward", "draft_forward": "draft_forward",
                        "verification": "verify_sample", "cache": "cache", "vq_decode": "vq_decode"}


@dataclass
class SettingRecords:
    """Everything measured for one setting, one entry per image."""

    setting: Setting
    batch: int = 1
    latencies: list[float] = field(default_factory=list)  # per image, one entry per generate call
    call_seconds: float = 0.0
    tokens: int = 0
    target_forwards: int = 0
    target_calls: int = 0
    draft_forwards: int = 0
    draft_calls: int = 0
    host_numbers: Optional[int] = None  # read back from the device, when the backend meters it
    host_syncs: Optional[int] = None  # transfers that waited for the device, when the backend meters them
    seconds: Counter = field(default_factory=Counter)
    histogram: Counter = field(default_factory=Counter)
    theorem2_lengths: list[float] = field(default_factory=list)
    theorem2_tv: list[float] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    token_maps: list[np.ndarray] = field(default_factory=list)  # [grid, grid] per image

    def add(self, seconds: float, result) -> None:
        stats = result.stats
        self.latencies.append(seconds / len(result.tokens))
        self.call_seconds += seconds
        self.tokens += stats.tokens
        self.target_forwards += stats.target_forwards
        self.target_calls += stats.target_calls
        self.draft_forwards += stats.draft_forwards
        self.draft_calls += stats.draft_calls
        if stats.host_numbers is not None:
            self.host_numbers = (self.host_numbers or 0) + stats.host_numbers
        if stats.host_syncs is not None:
            self.host_syncs = (self.host_syncs or 0) + stats.host_syncs
        for key, value in stats.seconds.items():
            self.seconds[key] += value
        self.histogram.update(stats.accepted_lengths)
        self.theorem2_lengths += stats.theorem2_accepted_length
        self.theorem2_tv += stats.theorem2_tv_bound
        self.images.extend(result.images)
        self.token_maps.extend(result.tokens)

    @property
    def image_count(self) -> int:
        return len(self.token_maps)


def image_plan(count: int, num_classes: int, base_seed: int,
               prompts: Optional[Sequence[str]] = None) -> list[tuple[Union[int, str], int]]:
    """(condition, seed) of each benchmark image: classes cycle so every class is equally used,
    or, for a text-to-image model, the prompts do."""
    cycle: Sequence[Union[int, str]] = list(prompts) if prompts else range(num_classes)
    return [(cycle[i % len(cycle)], base_seed + i) for i in range(count)]


class ConditionFeeds:
    """Pipeline.generate's condition keyword for any group of a plan's conditions: class ids as
    they are; prompts through the pipeline's text encoder once each, here, outside every timing."""

    def __init__(self, pipe: Pipeline, plan: Sequence[tuple[Union[int, str], int]]):
        prompts = list(dict.fromkeys(c for c, _ in plan if isinstance(c, str)))
        self.rows = {p: i for i, p in enumerate(prompts)}
        self.captions = pipe.conditions(prompts=prompts) if prompts else None

    def __call__(self, conditions: Sequence[Union[int, str]]) -> dict:
        if self.captions is None:
            return {"class_ids": list(conditions)}
        chosen = self.captions.take([self.rows[c] for c in conditions])
        return {"prompts" if chosen.is_prompt else "captions": chosen}  # token prompts: a unified model's


def timed_params(setting: Setting) -> dict:
    """The setting's parameters with Theorem-2 bookkeeping off (unless asked for): it is
    instrumentation, and timing it would charge the relaxed methods for work a deployment skips."""
    params = dict(setting.params)
    if "theorem2" in METHODS[setting.method].PARAMS:
        params.setdefault("theorem2", False)
    return params


def has_theory(setting: Setting) -> bool:
    """Whether the runtime can estimate Theorem 2 for this setting (relaxed draft-and-verify methods,
    drafting chains: the estimates follow one drafted path)."""
    return "theorem2" in METHODS[setting.method].PARAMS and setting.params.get("tree", "chain") == "chain"


def pipeline_for(pipe: Pipeline, setting: Setting, drafts: Optional[dict[str, Pipeline]],
                 loop: Optional[str] = None) -> Pipeline:
    """The pipeline a setting runs on: the one with its draft kind when a run compares drafts, set
    to decode with `loop`, or else the setting's loop when a run compares loops (`--loop host,round`;
    no loop: the pipeline's own)."""
    chosen = (drafts or {}).get(setting.draft, pipe)
    if loop or setting.loop:
        chosen.loop = loop or setting.loop
    return chosen


def keep_every_round(pipe: Any, rounds: int) -> None:
    """Let `pipe` keep `rounds` device rounds: a run that alternates settings would otherwise drop a
    round (its buffers and captured CUDA graph) before the setting comes back, and time its planning
    and capture again on every call (runtime/rounds kept_round)."""
    pipe.keep_rounds = max(pipe.keep_rounds, rounds)


def run_settings(pipe: Pipeline, settings: Sequence[Setting], images: int, seed: int = 0,
                 on_image: Optional[Callable[[Setting], None]] = None,
                 batches: Sequence[int] = (1,), drafts: Optional[dict[str, Pipeline]] = None,
                 prompts: Optional[Sequence[str]] = None) -> tuple[list[SettingRecords], np.ndarray]:
    """Generate `images` images with every setting at every batch size, interleaved; returns
    records (batch-major: every setting at batches[0], then at batches[1], ...) and each image's
    condition (class ids, or the prompts of a t2i model).
    `drafts` maps a setting's draft kind to the pipeline holding that draft (`--drafts`)."""
    plan = image_plan(images, pipe.target.spec.num_classes, seed, prompts)
    feeds = ConditionFeeds(pipe, plan)
    records = [SettingRecords(s, batch) for batch in batches for s in settings]
    for pipeline in {id(p): p for p in (pipe, *(drafts or {}).values())}.values():
        keep_every_round(pipeline, len(records))
    params = [timed_params(r.setting) for r in records]
    for record, kwargs in zip(records, params):  # warm-up, untimed
        try:
            pipeline_for(pipe, record.setting, drafts).generate(
                **feeds([plan[0][0]] * record.batch), method=record.setting.method, seed=WARMUP_SEED, **kwargs)
        except SpecrtError as exc:  # e.g. `loop=round` for a setting without a device round: name the row
            raise SpecrtError(f"setting {record.setting.label}: {exc}") from None
    order_rng = np.random.default_rng(seed + 7919)
    block = max(batches)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside one method's timing would bias it; collect between blocks instead
    try:
        for first in range(0, len(plan), block):
            chunk = plan[first:first + block]
            for index in order_rng.permutation(len(records)):
                record = records[index]
                for start in range(0, len(chunk), record.batch):
                    group = chunk[start:start + record.batch]
                    began = time.perf_counter()
                    result = pipeline_for(pipe, record.setting, drafts).generate(
                        **feeds([c for c, _ in group]), method=record.setting.method, seed=[s for _, s in group],
                        **params[index])
                    record.add(time.perf_counter() - began, result)
                    if on_image:
                        for _ in group:
                            on_image(record.setting)
            gc.collect()
    finally:
        if gc_was_enabled:
            gc.enable()
    return records, np.array([c for c, _ in plan])


def theory_pass(pipe: Pipeline, settings: Sequence[Setting], images: int = THEORY_IMAGES, seed: int = 0,
                on_image: Optional[Callable[[Setting], None]] = None,
                drafts: Optional[dict[str, Pipeline]] = None,
                prompts: Optional[Sequence[str]] = None) -> dict[Setting, SettingRecords]:
    """Untimed re-run of the first images of each relaxed setting with Theorem-2 estimates on.

    The estimates consume no random numbers, so these are the same images as the timed run's
    host loop: the estimates are the host loop's (the device round has none), so every setting,
    a round-loop one too, runs them there (the round draws the same counter uniforms: the same images).
    """
    plan = image_plan(images, pipe.target.spec.num_classes, seed, prompts)
    feeds = ConditionFeeds(pipe, plan)
    out = {}
    pipes = [pipe, *(drafts or {}).values()]
    loops = [p.loop for p in pipes]
    try:
        for setting in settings:
            if not has_theory(setting):
                continue
            record = out[setting] = SettingRecords(setting)
            params = {**setting.params, "theorem2": setting.params.get("theorem2", True)}
            for condition, image_seed in plan:
                result = pipeline_for(pipe, setting, drafts, "host").generate(
                    **feeds([condition]), method=setting.method, seed=image_seed, **params)
                record.add(float("nan"), result)  # untimed
                if on_image:
                    on_image(setting)
    finally:
        for chosen, loop in zip(pipes, loops):
            chosen.loop = loop
    return out


def _theory(record: Optional[SettingRecords], method: str) -> dict:
    """Cool-SD Theorem 2 (Eq. 7, Eq. 8-9) estimates averaged over rounds; 0 TV for lossless methods."""
    if METHODS[method].lossless:
        return {"lossless": True, "tv_bound": 0.0}
    if record is None or not record.theorem2_lengths:
        return {"lossless": False}
    tv = np.asarray(record.theorem2_tv, dtype=np.float64)
    finite = bool(np.isfinite(tv).all())  # LANTERN's Eq.-6 rounds give NaN: then there is no bound
    return {
        "lossless": False,
        "expected_accepted_length": float(np.mean(record.theorem2_lengths)),
        "tv_bound": float(np.mean(tv)) if finite else None,
        "rounds": len(tv),
        "images": record.image_count,
        "note": "TV bound per verification round (Eq. 8-9), one-sample estimates along the drafted path"
                + ("" if finite else "; not computable: LANTERN's Eq. 6 resampling depends on the rejected token"),
    }


def summarise(record: SettingRecords, theory: Optional[SettingRecords] = None) -> MethodResult:
    """One setting's records (and its Theorem-2 pass) -> its MethodResult (speed-up and quality attached later)."""
    count = record.image_count
    breakdown = {name: record.seconds[key] / count for key, name in BREAKDOWN_FROM_STATS.items()}
    calls = record.target_forwards + record.draft_forwards
    read_per_call = 4 * record.host_numbers / calls if record.host_numbers is not None and calls else None
    syncs_per_call = record.host_syncs / calls if record.host_syncs is not None and calls else None
    syncs_per_round = (record.host_syncs / record.target_calls if record.host_syncs is not None and record.target_calls
                       else None)
    return MethodResult(
        method=record.setting.method,
        params=dict(record.setting.params),
        label=record.setting.label if record.batch == 1 else f"{record.setting.label} batch={record.batch}",
        images=count,
        batch=record.batch,
        images_per_s=count / record.call_seconds if record.call_seconds else None,
        mean_accepted_length=record.tokens / record.target_forwards if record.target_forwards else 0.0,
        target_forwards_per_image=record.target_forwards / count,
        target_calls_per_image=record.target_calls / count,
        draft_forwards_per_image=record.draft_forwards / count,
        draft_calls_per_image=record.draft_calls / count,
        latency_s=latency_summary(record.latencies),
        speedup_vs_ar=None,
        breakdown_s=breakdown,
        accepted_length_histogram={str(k): int(v) for k, v in sorted(record.histogram.items())},
        host_bytes_per_forward=read_per_call,
        host_syncs_per_forward=syncs_per_call,
        host_syncs_per_round=syncs_per_round,
        loop=record.setting.loop or None,
        theory=_theory(theory, record.setting.method),
    )
