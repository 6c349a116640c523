"""`specrt bench --serve`: the flags checked and mapped onto specrt.bench.serve_bench.run_serve_bench.

Every count and duration a user types is bounded (a load run must end); the servers listen on
127.0.0.1 only, and --serve-url must name a 127.0.0.1 / localhost server.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import click

from specrt import validation
from specrt.commands.serve import MAX_QUEUE, MAX_SLOTS
from specrt.errors import SpecrtError
from specrt.runtime.scheduling.scheduler import MAX_GROUPS

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


@dataclass(frozen=True)
class InProcess:
    """--in-process and where its pipeline runs (bench's --backend, --device, --demo)."""

    on: bool = False
    backend: str = "ort"
    device: Optional[str] = None
    demo: Optional[str] = None


def in_process_pipeline(bundle: Optional[Path], where: InProcess, threads: Optional[int]) -> Any:
    """The pipeline --in-process measures: BUNDLE (or the demo bundle) on --backend, or with
    --backend torch the embedded demo's PyTorch modules on --device."""
    from specrt.commands._generate_flags import ModelFlags, RunFlags
    from specrt.commands.generate import build_pipeline

    if where.backend == "torch":
        if bundle is not None:
            raise SpecrtError("--in-process --backend torch runs the embedded demo (--demo); drop BUNDLE or the backend")
        return build_pipeline(None, ModelFlags(demo=where.demo), run=RunFlags(backend="torch", device=where.device,
                                                                             threads=threads))
    return build_pipeline(bundle, ModelFlags(), run=RunFlags(backend=where.backend, threads=threads))


def run(bundle: Optional[Path], url: Optional[str], loads: str, rate_seconds: float, overload_seconds: float,
        saturation_seconds: float, slots: int, groups: Optional[int], max_queue: int, methods: Optional[str], seed: int,
        threads: Optional[int], json_path: Optional[Path], plot_path: Optional[Path],
        markdown_path: Optional[Path], demo_weights: Optional[Path], cache_dir: Optional[Path],
        where: InProcess = InProcess()) -> None:
    from specrt.bench.serve_bench import ServeBenchConfig, run_serve_bench
    from specrt.atomic_file import write_bytes
    from specrt.bench.serve_report import table, write_json, write_plot
    from specrt.runtime.machine import cpu_name

    if where.on and url is not None:
        raise SpecrtError("--in-process measures this process's scheduler; --serve-url a running server: give one")
    config = ServeBenchConfig(  # every flag checked before minutes of exporting or measuring
        bundle=bundle, url=None if url is None else check_url(url), fractions=parse_loads(loads),
        rate_s=validation.number("--rate-seconds", rate_seconds, low=1.0, high=MAX_SECONDS),
        overload_s=validation.number("--overload-seconds", overload_seconds, low=1.0, high=MAX_SECONDS),
        saturation_s=validation.number("--saturation-seconds", saturation_seconds, low=1.0, high=MAX_SECONDS),
        slots=validation.count("--slots", slots, high=MAX_SLOTS),
        groups=None if groups is None else validation.count("--groups", groups, high=MAX_GROUPS),
        max_queue=validation.count("--max-queue", max_queue, high=MAX_QUEUE),
        methods=parse_methods(methods), seed=validation.seed(seed, "--seed"), threads=threads)
    if bundle is None and url is None and not (where.on and where.backend == "torch"):
        from specrt.bench.models import demo_bundle

        click.echo("specrt bench --serve: exporting the demo bundle (cached) ...", err=True)
        config = replace(config, bundle=demo_bundle(demo_weights, cache_dir=cache_dir))

    def say(message: str) -> None:
        click.echo(f"specrt bench --serve: {message}", err=True)

    if where.on:
        from specrt.bench.scheduler_bench import run_scheduler_bench

        say("opening the pipeline ...")
        results = run_scheduler_bench(in_process_pipeline(config.bundle, where, threads), config, say=say)
    else:
        results = run_serve_bench(config, say=say)
    results["machine"] = device_name(where) if where.on else cpu_name()
    text = table(results)
    click.echo(text)
    if json_path:
        write_json(str(json_path), results)
    if markdown_path:
        write_bytes(markdown_path, (f"```\n{text}\n```\n").encode())
    if plot_path:
        what = "the runtime's scheduler (in process)" if where.on else "specrt serve"
        write_plot(str(plot_path), results, f"{what} under open-loop load, {results['machine']}")


def device_name(where: InProcess) -> str:
    """The device the in-process pipeline decodes on, in words (a GPU's name, else the CPU's)."""
    from specrt.runtime.machine import cpu_name

    if where.backend == "torch" and where.device and where.device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(where.device))
    return cpu_name()
