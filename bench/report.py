"""Turn measured results into the three things users read: a table, a JSON file, a plot.

The JSON layout is a contract (issue 7): one object with `device`, `backend`, `bundle`,
`settings` and `results`, each result carrying `method`, `params`, `mean_accepted_length`,
`target_forwards_per_image`, `latency_s` {median, p90}, `speedup_vs_ar`, `breakdown_s` and
`quality`.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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
    quality: dict[str, Any] = field(default_factory=dict)
    theory: dict[str, Any] = field(default_factory=dict)


def latency_summary(latencies: list[float]) -> dict[str, float]:
    """Median and 90th percentile of per-image latencies, in seconds."""
    values = np.asarray(latencies, dtype=np.float64)
    return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90))}


def attach_speedups(results: list[MethodResult]) -> None:
    """Speed-up of every setting against `ar` from the same run (median latency ratio)."""
    reference = next((r for r in results if r.method == "ar"), None)
    for result in results:
        if reference is None:
            result.speedup_vs_ar = None
        else:
            result.speedup_vs_ar = reference.latency_s["median"] / result.latency_s["median"]


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_table(results: list[MethodResult]) -> str:
    """A fixed-width table: one row per setting, speed first, then fidelity."""
    headers = ["setting", "acc.len", "tgt fwd/img", "drf fwd/img", "lat med s", "lat p90 s", "speed-up",
               "class acc", "FD", "TV bound"]
    rows = []
    for r in results:
        rows.append([
            r.label, _fmt(r.mean_accepted_length), _fmt(r.target_forwards_per_image, 1),
            _fmt(r.draft_forwards_per_image, 1), _fmt(r.latency_s["median"], 3), _fmt(r.latency_s["p90"], 3),
            _fmt(r.speedup_vs_ar) + ("x" if r.speedup_vs_ar is not None else ""),
            _fmt(r.quality.get("class_accuracy"), 3), _fmt(r.quality.get("frechet_distance"), 1),
            _fmt(r.theory.get("tv_bound"), 3),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]
    return "\n".join(out)


def format_breakdown(results: list[MethodResult]) -> str:
    """Where each setting's time goes, per image, in milliseconds."""
    headers = ["setting"] + [k for k in BREAKDOWN_KEYS] + ["other"]
    rows = []
    for r in results:
        parts = [r.breakdown_s.get(k, 0.0) for k in BREAKDOWN_KEYS]
        other = max(r.latency_s["median"] - sum(parts), 0.0)
        rows.append([r.label] + [f"{1000 * p:.1f}" for p in parts] + [f"{1000 * other:.1f}"])
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _atomic_write(path: str, data: bytes) -> None:
    """Write through a temporary file in the same folder, then rename: never a half file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def to_json_object(results: list[MethodResult], *, device: str, backend: str, bundle: str,
                   settings: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's JSON object (see module docstring)."""
    return {
        "device": device,
        "backend": backend,
        "bundle": bundle,
        "settings": settings,
        "results": [asdict(r) for r in results],
    }


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Write the benchmark JSON atomically."""
    _atomic_write(path, (json.dumps(payload, indent=2, sort_keys=False) + "\n").encode())


def write_plot(path: str, results: list[MethodResult], title: str) -> None:
    """Speed–quality trade-off like the Cool-SD paper's Figure 3: one curve per method family.

    Left: speed-up against `ar` over Fréchet distance; right: mean accepted length over
    Fréchet distance. Points of one family (a sweep) are joined in sweep order.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    families: dict[str, list[MethodResult]] = {}
    for r in results:
        families.setdefault(r.method, []).append(r)
    for ax, key, ylabel in ((axes[0], "speedup", "speed-up vs ar (wall clock)"),
                            (axes[1], "accepted", "mean accepted length (tokens / target forward)")):
        for method, members in families.items():
            pts = [(m.quality.get("frechet_distance"), m.speedup_vs_ar if key == "speedup" else m.mean_accepted_length, m)
                   for m in members]
            pts = [p for p in pts if p[0] is not None and p[1] is not None]
            if not pts:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            marker = "*" if method == "ar" else "o"
            ax.plot(xs, ys, marker=marker, markersize=11 if method == "ar" else 6, label=method)
            if len(pts) > 1:
                for x, y, m in pts:
                    short = ",".join(f"{v}" for v in m.params.values())
                    ax.annotate(short, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("Fréchet distance to held-out real images (lower is better)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].axhline(1.0, color="gray", lw=0.8, ls="--")
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, ".tmp-" + os.path.basename(path))
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, path)
