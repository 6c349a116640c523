"""`specrt bench --serve`: the flags checked and mapped onto specrt.bench.serve_bench.run_serve_bench.

Every count and duration a user types is bounded (a load run must end); the servers listen on
127.0.0.1 only, and --serve-url must name a 127.0.0.1 / localhost server.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from specrt import validation
from specrt.errors import SpecrtError

MAX_LOAD = 10.0         # offered load, in saturated throughputs
MAX_SECONDS = 1800.0    # one rate's duration
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def parse_loads(text: str) -> tuple[float, ...]:
    """'0.25,0.5,1.5' -> increasing fractions in (0, MAX_LOAD]."""
    try:
        loads = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SpecrtError(f"--loads {text!r}: give fractions of the saturated throughput, e.g. 0.25,0.5,1.5") from None
    if not loads or any(not 0 < load <= MAX_LOAD for load in loads):
        raise SpecrtError(f"--loads {text!r}: each fraction must be in (0, {MAX_LOAD:g}]")
    return tuple(sorted(set(loads)))


def parse_methods(text: Optional[str]) -> tuple[tuple[str, dict], ...]:
    """--methods for --serve: 'sjd' or 'ar,sjd' or a JSON list of [method, {params}] pairs (default sjd)."""
    if not text:
        return (("sjd", {}),)
    if text.lstrip().startswith("["):
        try:
            pairs = json.loads(text)
            return tuple((str(method), dict(params)) for method, params in pairs)
        except (ValueError, TypeError) as exc:
            raise SpecrtError(f"--methods {text!r}: a JSON list of [method, {{params}}] pairs ({exc})") from None
    return tuple((name.strip(), {}) for name in text.split(",") if name.strip())


def check_url(url: str) -> str:
    host = url.rsplit(":", 1)[0]
    if host not in LOCAL_HOSTS or ":" not in url:
        raise SpecrtError(f"--serve-url {url!r}: give the gRPC address of a server on this machine, "
                          f"127.0.0.1:PORT (the load generator talks to 127.0.0.1 only)")
    return url


def run(bundle: Optional[Path], url: Optional[str], loads: str, rate_seconds: float, overload_seconds: float,
        saturation_seconds: float, slots: int, max_queue: int, methods: Optional[str], seed: int,
        threads: Optional[int], json_path: Optional[Path], plot_path: Optional[Path],
        markdown_path: Optional[Path], demo_weights: Optional[Path], cache_dir: Optional[Path]) -> None:
    from specrt.bench.serve_bench import ServeBenchConfig, run_serve_bench
    from specrt.atomic_file import write_bytes
    from specrt.bench.serve_report import table, write_json, write_plot
    from specrt.runtime.machine import cpu_name

    if bundle is None and url is None:
        from specrt.bench.models import demo_bundle

        click.echo("specrt bench --serve: exporting the demo bundle (cached) ...", err=True)
        bundle = demo_bundle(demo_weights, cache_dir=cache_dir)
    config = ServeBenchConfig(
        bundle=bundle, url=None if url is None else check_url(url), fractions=parse_loads(loads),
        rate_s=validation.number("--rate-seconds", rate_seconds, low=1.0, high=MAX_SECONDS),
        overload_s=validation.number("--overload-seconds", overload_seconds, low=1.0, high=MAX_SECONDS),
        saturation_s=validation.number("--saturation-seconds", saturation_seconds, low=1.0, high=MAX_SECONDS),
        slots=validation.count("--slots", slots, high=256), max_queue=validation.count("--max-queue", max_queue,
                                                                                       high=4096),
        methods=parse_methods(methods), seed=validation.seed(seed, "--seed"), threads=threads)
    results = run_serve_bench(config, say=lambda message: click.echo(f"specrt bench --serve: {message}", err=True))
    results["machine"] = cpu_name()
    text = table(results)
    click.echo(text)
    if json_path:
        write_json(str(json_path), results)
    if markdown_path:
        write_bytes(markdown_path, (f"```\n{text}\n```\n").encode())
    if plot_path:
        write_plot(str(plot_path), results, f"specrt serve under open-loop load, {results['machine']}")
