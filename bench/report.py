"""Turn measured results into the three things users read: a table, a JSON file, a plot.

The JSON file (`specrt bench --json`) is a contract readers may rely on within specrt 0.1:
one object with `device`, `backend`, `bundle`, `settings` and `results`; each result carries
`method`, `params`, `label`, `images`, `mean_accepted_length`, `target_forwards_per_image`,
`latency_s` {median, p90, ...}, `speedup_vs_ar`, `breakdown_s` and `quality`. Keys added later
within 0.1.0 (dates as in docs/changelog.md) are absent from files written before them:
`predicted_speedup_vs_ar` (the cost model on the run's own graph timings: ar's graph seconds per
image over the setting's), `mean_speedup_vs_ar` and `measured_over_predicted` (their ratio) since
2026-11-24; `host_syncs_per_round` and, in a run comparing decoding loops (`--loop host,round`),
`loop` since 2026-11-27.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from specrt.atomic_file import atomic_path, write_text
from specrt.bench.cost_model import graph_seconds, run_predicted_speedup

BREAKDOWN_KEYS = ("target_forward", "draft_forward", "verify_sample", "cache", "vq_decode")


@dataclass
class MethodResult:
    """Aggregated measurements of one setting over all benchmark images."""

    method: str
    params: dict[str, Any]
    label: str
    images: int
    mean_accepted_length: float
    target_forwards_per_image: float
    draft_forwards_per_image: float
    latency_s: dict[str, float]
    speedup_vs_ar: float | None
    breakdown_s: dict[str, float]
    accepted_length_histogram: dict[str, int] = field(default_factory=dict)
    host_bytes_per_forward: float | None = None  # read back from the device per model call; None: not metered
    # transfers per model call that waited for the device (its draws, verification reads, index
    # copies): on a GPU each is a synchronisation; None: not metered
    host_syncs_per_forward: float | None = None
    # the same transfers per target call: per round (the host loop calls the target once a round; the
    # device round reads once a round, its target_calls are rounds + 1)
    host_syncs_per_round: float | None = None
    quality: dict[str, Any] = field(default_factory=dict)
    theory: dict[str, Any] = field(default_factory=dict)
    batch: int = 1  # images per Pipeline.generate call; latency_s is per image (call time / images)
    images_per_s: float | None = None  # images / total time inside generate calls
    target_calls_per_image: float | None = None  # target graph runs / images: a batch runs until its slowest image
    draft_calls_per_image: float | None = None  # draft graph runs / images: a draft chain runs L passes in one
    tokens: list | None = None  # `specrt bench --tokens`: [grid][grid] per image, in image-plan order
    # the cost model on this run's graph timings (cost_model.run_predicted_speedup), and the measured
    # speed-up on mean latencies beside it (the breakdown's own statistic), ar at the same batch
    predicted_speedup_vs_ar: float | None = None
    mean_speedup_vs_ar: float | None = None
    measured_over_predicted: float | None = None
    loop: str | None = None  # the decoding loop (runtime.rounds.LOOPS) when a run compares several; None: one


def latency_summary(latencies: list[float]) -> dict[str, float]:
    """Median and 90th percentile (and mean, for the breakdown) of per-image latencies, in seconds."""
    values = np.asarray(latencies, dtype=np.float64)
    return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)), "mean": float(values.mean())}


def mean_latency(latency_s: dict[str, float]) -> float:
    """The mean per-image latency (the median in results written before the mean was kept)."""
    return latency_s.get("mean", latency_s["median"])


def attach_speedups(results: list[MethodResult]) -> None:
    """Speed-up of every setting against `ar` at the same batch size (and, in a run comparing loops, in
    the same loop) from the same run (median latency ratio), and beside it the cost model's prediction
    from the run's graph timings with the measured speed-up it compares to: mean latencies, the
    statistic the graph times are (their ratio is then the host's cost alone, see run_predicted_speedup)."""
    for result in results:
        reference = next((r for r in results if r.method == "ar" and r.batch == result.batch
                          and r.loop == result.loop), None)
        result.speedup_vs_ar = result.predicted_speedup_vs_ar = None
        result.mean_speedup_vs_ar = result.measured_over_predicted = None
        if reference is None:
            continue
        result.speedup_vs_ar = reference.latency_s["median"] / result.latency_s["median"]
        result.mean_speedup_vs_ar = mean_latency(reference.latency_s) / mean_latency(result.latency_s)
        result.predicted_speedup_vs_ar = run_predicted_speedup(*_graph_breakdowns(results, result, reference))
        if result.predicted_speedup_vs_ar:
            result.measured_over_predicted = result.mean_speedup_vs_ar / result.predicted_speedup_vs_ar


def _graph_breakdowns(results: list[MethodResult], result: MethodResult,
                      reference: MethodResult) -> tuple[dict[str, float], dict[str, float]]:
    """The breakdowns whose graph time predicts `result`'s speed-up over `reference` (ar). The host
    loop times its model calls apart from its host work, so its own breakdowns. The device round runs
    model passes and verification as one device function, its whole time counted as the target's, so
    its own breakdowns would predict what it measured; its prediction is read from the same setting and
    ar on the host loop in the same run (`--loop host,round`): the speed-up of its model passes with
    host work free, which the round's measured one is held to. Without host-loop twins: its own."""
    if result.loop == "round":
        same = result.label.replace(" loop=round", "")
        twin = next((r for r in results if r.loop == "host" and r.label.replace(" loop=host", "") == same), None)
        ar = next((r for r in results if r.loop == "host" and r.method == "ar" and r.batch == result.batch), None)
        if twin is not None and ar is not None:
            return twin.breakdown_s, ar.breakdown_s
    return result.breakdown_s, reference.breakdown_s


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_fd(quality: dict[str, Any]) -> str:
    """'146.2 ± 8.1': the Fréchet distance with its bootstrap spread, when there is one."""
    fd, std = quality.get("frechet_distance"), quality.get("frechet_distance_std")
    if fd is None:
        return "-"
    return f"{fd:.1f} ± {std:.1f}" if std is not None else f"{fd:.1f}"


def format_table(results: list[MethodResult]) -> str:
    """A fixed-width table: one row per setting, speed first, then fidelity."""
    batched = any(r.batch != 1 for r in results)
    headers = ["setting", "acc.len", "tgt fwd/img", "drf fwd/img", "drf calls/img", "lat med ms", "lat p90 ms",
               *(["img/s"] if batched else []), "speed-up", "class acc", "FD ± boot. sd", "TV bound"]
    rows = []
    for r in results:
        rows.append([
            r.label, _fmt(r.mean_accepted_length), _fmt(r.target_forwards_per_image, 1),
            _fmt(r.draft_forwards_per_image, 1), _fmt(r.draft_calls_per_image, 1), _fmt(1000 * r.latency_s["median"], 1),
            _fmt(1000 * r.latency_s["p90"], 1), *([_fmt(r.images_per_s, 1)] if batched else []),
            _speedup(r.speedup_vs_ar),
            _fmt(r.quality.get("class_accuracy"), 3), format_fd(r.quality),
            _fmt(r.theory.get("tv_bound"), 3),
        ])
    return fixed_width(headers, rows)


def fixed_width(headers: list[str], rows: list[list[Any]]) -> str:
    """The terminal's table: the first column left-aligned, the others right-aligned, a rule under
    the headers (every `specrt bench` table reads alike)."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_prompt_following(results: list[MethodResult], real: dict[str, Any] | None = None) -> str:
    """Text-to-image runs: per setting, the share of images whose digit / each attribute / all
    of them the evaluator reads as the prompt asked, with the real-image figures and, per
    setting, `all` as a share of the real one (the t2i demo's acceptance reads ≥ 0.8 for ar)."""
    keys = list(next(r.quality["prompt_following"] for r in results if "prompt_following" in r.quality))
    headers = ["setting", *keys, "all / real"]
    rows = []
    if real:
        rows.append(["real held-out", *(_fmt(real.get(k), 3) for k in keys), "1.00"])
    for r in results:
        following = r.quality.get("prompt_following", {})
        ratio = following.get("all") / real["all"] if real and real.get("all") and following.get("all") is not None else None
        rows.append([r.label, *(_fmt(following.get(k), 3) for k in keys), _fmt(ratio)])
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def share_outside(total: float, inside: float) -> float:
    """Share of `total` seconds spent outside the `inside` seconds of model passes (0 for no time)."""
    return max(total - inside, 0.0) / total if total else 0.0


def host_share(result: MethodResult) -> float:
    """Share of the mean latency spent outside the model graphs (target, draft, VQ decode): the
    verification/sampling, cache maintenance and orchestration the runtime adds (Stats.overhead_share)."""
    return share_outside(mean_latency(result.latency_s), graph_seconds(result.breakdown_s))


def format_breakdown(results: list[MethodResult]) -> str:
    """Where each setting's time goes: mean per image, in milliseconds; `other` is the rest of the
    mean latency (Python orchestration of the method between model calls); `host %` is everything
    but the graphs (host_share); `read B/fwd` the bytes read back from the device per model call and
    `syncs/round` the transfers per round (target call) that waited for the device (device backends
    only; on the host loop a round's draws, verification reads and index copies, on the device round
    one read of its finished flags, plus two a call). Then the speed-up against ar on these means,
    the cost model's from the same run's graph timings (`pred.`, host work free; a device-round row's
    from its host-loop twin, _graph_breakdowns) and their ratio: below 1 where the setting loses more
    of its time to the host than ar does (attach_speedups)."""
    headers = (["setting"] + [k for k in BREAKDOWN_KEYS]
               + ["other", "total", "host %", "read B/fwd", "syncs/round", "speed-up", "pred.", "meas/pred"])
    rows = []
    for r in results:
        parts = [r.breakdown_s.get(k, 0.0) for k in BREAKDOWN_KEYS]
        total = mean_latency(r.latency_s)
        other = max(total - sum(parts), 0.0)
        rows.append([r.label] + [f"{1000 * p:.1f}" for p in parts]
                    + [f"{1000 * other:.1f}", f"{1000 * total:.1f}", f"{100 * host_share(r):.1f}",
                       _fmt(r.host_bytes_per_forward, 0), _fmt(r.host_syncs_per_round, 2),
                       _speedup(r.mean_speedup_vs_ar),
                       _speedup(r.predicted_speedup_vs_ar), _fmt(r.measured_over_predicted)])
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def to_json_object(results: list[MethodResult], *, device: str, backend: str, bundle: str,
                   settings: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's JSON object (see module docstring)."""
    return {
        "device": device,
        "backend": backend,
        "bundle": bundle,
        "settings": settings,
        "results": [{k: v for k, v in asdict(r).items() if k not in ("tokens", "loop") or v is not None}
                    for r in results],
    }


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Write the benchmark JSON atomically."""
    write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def _point_label(result: MethodResult) -> str:
    """'delta=2.5' for a swept point (the label's parameter part), Greek where the paper uses it."""
    inner = result.label[len(result.method) + 1:result.label.rfind(")")] if result.params else ""
    return inner.replace("delta=", "δ=").replace("lambda=", "λ=").replace("nu=", "ν=")


def write_plot(path: str, results: list[MethodResult], title: str, fd_floor: float | None = None) -> None:
    """Speed–quality trade-off like the Cool-SD paper's Figure 3: one curve per method family.

    Left: speed-up against `ar` over Fréchet distance; right: mean accepted length over
    Fréchet distance. Points of one family (a sweep) are joined in sweep order; a dotted
    vertical line marks the real-vs-real Fréchet distance at the same sample size (the
    floor); horizontal bars are each distance's bootstrap spread. Without fidelity numbers
    (a bundle with no evaluator) the plot is speed-up over accepted length.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families: dict[str, list[MethodResult]] = {}
    for r in results:  # a run comparing loops: one curve per method and loop
        families.setdefault(r.method + (f" loop={r.loop}" if r.loop else ""), []).append(r)
    has_fd = any(r.quality.get("frechet_distance") is not None for r in results)
    if has_fd:
        panels = (("frechet_distance", "speedup", "speed-up vs ar (wall clock, same run)"),
                  ("frechet_distance", "accepted", "mean accepted length (tokens / target forward)"))
    else:
        panels = (("accepted", "speedup", "speed-up vs ar (wall clock, same run)"),)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)

    def value(r: MethodResult, key: str):
        if key == "speedup":
            return r.speedup_vs_ar
        if key == "accepted":
            return r.mean_accepted_length
        return r.quality.get(key)

    for ax, (xkey, ykey, ylabel) in zip(axes[0], panels):
        for method, members in families.items():
            pts = [(value(m, xkey), value(m, ykey), m) for m in members]
            pts = [p for p in pts if p[0] is not None and p[1] is not None]
            if not pts:
                continue
            ar = members[0].method == "ar"
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="*" if ar else "o",
                            markersize=13 if ar else 6, label=method,
                            color="black" if ar and not members[0].loop else None)
            spread = [m.quality.get("frechet_distance_std") for _, _, m in pts]
            if xkey == "frechet_distance" and all(v is not None for v in spread):  # bootstrap sd of each FD
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], xerr=spread, fmt="none",
                            ecolor=line.get_color(), alpha=0.35, capsize=2, lw=1)
            if len(pts) > 1:
                for x, y, m in pts:
                    ax.annotate(_point_label(m), (x, y), textcoords="offset points", xytext=(5, 3), fontsize=8)
        if xkey == "frechet_distance" and fd_floor is not None:
            ax.axvline(fd_floor, color="gray", lw=1.0, ls=":", label="real vs real (noise floor)")
        if ykey == "speedup":
            ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xlabel("Fréchet distance to held-out real images (lower is better)" if xkey == "frechet_distance"
                      else "mean accepted length (tokens / target forward)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        with atomic_path(path) as partial:
            fig.savefig(partial, dpi=110, format="png")
    finally:
        plt.close(fig)


def format_markdown(payload: dict[str, Any]) -> str:
    """The run as a Markdown table (for the README), with its device, backend and noise floor."""
    settings = payload["settings"]
    lines = ["| setting | accepted length | target fwd / image | latency median (ms) | p90 (ms) | speed-up vs ar "
             "| predicted (graphs only) | measured / predicted "
             "| class accuracy | Fréchet distance ± bootstrap sd | TV bound / round |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in payload["results"]:
        q, tv = r.get("quality", {}), r.get("theory", {}).get("tv_bound")
        lines.append(f"| {r['label']} | {r['mean_accepted_length']:.2f} | {r['target_forwards_per_image']:.1f} "
                     f"| {1000 * r['latency_s']['median']:.1f} | {1000 * r['latency_s']['p90']:.1f} "
                     f"| {_speedup(r['speedup_vs_ar'])} | {_speedup(r.get('predicted_speedup_vs_ar'))} "
                     f"| {_fmt(r.get('measured_over_predicted'))} | {_fmt(q.get('class_accuracy'), 3)} "
                     f"| {format_fd(q)} | {_fmt(tv, 3)} |")
    floor = settings.get("fd_noise_floor") or {}
    notes = [f"{payload['device']}, {payload['backend']} backend, {settings.get('threads')} thread(s); "
             f"{settings['images_per_setting']} images per setting, interleaved in random order.",
             "Predicted: the cost model on this run's own graph timings (ar's target + draft + VQ-decode time "
             "per image over the setting's: its speed-up if host work cost nothing); measured / predicted "
             "compares it with the speed-up on mean latencies (the table's speed-up is of medians)."]
    if floor.get("frechet_distance") is not None:
        notes.append(f"Fréchet-distance noise floor (real vs real, {floor['images']} vs {floor['reference_images']} "
                     f"images): {format_fd(floor)}; evaluator accuracy on real held-out digits: "
                     f"{_fmt(floor.get('real_class_accuracy'), 3)}.")
    text = "\n".join(lines) + "\n\n" + " ".join(notes) + "\n"
    following = [(r["label"], r.get("quality", {}).get("prompt_following")) for r in payload["results"]]
    if any(f for _, f in following):
        real = floor.get("real_prompt_following") or {}
        keys = list(next(f for _, f in following if f))
        rows = ([("real held-out", real)] if real else []) + following
        text += ("\n| prompt following | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys) + "\n"
                 + "".join(f"| {label} | " + " | ".join(_fmt((f or {}).get(k), 3) for k in keys) + " |\n"
                           for label, f in rows))
    return text
