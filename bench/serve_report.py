"""`specrt bench --serve`'s results as a table, a JSON file and a plot of latency against offered load.

Files are written whole or not at all (a temporary file in the same folder, renamed), readable by
everyone as any file the user makes, like the other bench outputs (specrt/atomic_file.py).
"""
from __future__ import annotations

import io
import json
import math
from typing import Any

from specrt.atomic_file import write_bytes


def _ms(seconds: float) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{1000 * seconds:.0f}"


def _interval(bounds: Any) -> str:
    """'412-455' (ms); an open side (too few answers to bound it) is left blank: '412-'."""
    if not bounds:
        return "-"
    low, high = (_ms(b) for b in bounds)
    return "-" if low == high == "-" else f"{'' if low == '-' else low}-{'' if high == '-' else high}"


def table(results: dict[str, Any]) -> str:
    """One line per mode and offered rate: counts, throughput, latency percentiles (ms) with the
    p99's 95% confidence bounds (serve_load.percentile_interval), the slowest
    refusal (ms), answers with the same tokens as alone, the server's memory growth."""
    headers = ["mode", "load", "offered/s", "sent", "ok", "refused", "errors", "images/s", "p50 ms", "p95 ms",
               "p99 ms", "p99 95% CI", "refusal max ms", "same tokens", "memory growth"]
    rows = []
    for r in results["rates"]:
        memory = r.get("memory") or {}
        rows.append([r["mode"], f"{r['fraction']:g}x", f"{r['offered_per_s']:.2f}", r["sent"], r["ok"], r["refused"],
                     r["errors"], f"{r['throughput_per_s']:.2f}", _ms(r["p50_s"]), _ms(r["p95_s"]), _ms(r["p99_s"]),
                     _interval(r.get("p99_interval_s")), _ms(r["refused_max_s"]), f"{r['same_tokens']}/{r['ok']}",
                     f"{100 * memory['growth']:+.1f}%" if "growth" in memory else "-"])
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]

    def line(cells: list) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    saturated = ", ".join(f"{mode} {value:.2f}" for mode, value in results["saturated_per_s"].items())
    head = [f"saturated throughput (closed loop, images/s): {saturated}; load = offered / "
            f"{results['reference_mode']}'s saturated",
            f"pool answered alone: the modes {'agree' if results['alone_agree'] else 'DISAGREE'}"]
    return "\n".join(head + [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def write_json(path: str, results: dict[str, Any]) -> None:
    def clean(value: Any) -> Any:  # NaN is not JSON
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    write_bytes(path, (json.dumps(clean(results), indent=2) + "\n").encode())


def write_plot(path: str, results: dict[str, Any], title: str) -> None:
    """p50 and p99 latency (log scale) against offered load, one colour per mode; throughput beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(11, 4.4))
    for mode in results["modes"]:
        rows = [r for r in results["rates"] if r["mode"] == mode]
        loads = [r["fraction"] for r in rows]
        for key, style in (("p50_s", "--"), ("p99_s", "-")):
            latency.plot(loads, [r[key] for r in rows], style, marker="o", label=f"{mode} {key[:3]}")
        throughput.plot(loads, [r["throughput_per_s"] for r in rows], marker="o", label=mode)
    reference = results["reference_mode"]
    for ax in (latency, throughput):
        ax.set_xlabel(f"offered load (x {reference}'s saturated throughput)")
        ax.grid(alpha=0.3)
        ax.legend()
    latency.set_yscale("log")
    latency.set_ylabel("latency of answered requests (s)")
    throughput.set_ylabel("images answered per second")
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_bytes(path, buffer.getvalue())
