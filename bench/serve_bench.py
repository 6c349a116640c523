"""`specrt bench --serve`: both batching modes of `specrt serve` under the same open-loop load, side by side.

The run, all on 127.0.0.1:
1. a server per mode (`specrt serve BUNDLE --batching MODE`, its own ports), both up for the whole
   run (or one running server at --serve-url, measured as it is);
2. every pool request answered alone by each server, one at a time: the reference an answer under
   load must equal (same tokens), and the two modes must agree;
3. each mode's saturated throughput: a closed loop of 2 x slots clients for `saturation_s`;
4. for each fraction of the reference mode's (dynamic's) saturated throughput: an open-loop Poisson
   run per mode, the modes alternating (which goes first alternates too, so drift in the machine's
   other load hits both), `rate_s` seconds each, `overload_s` for fractions above 1; the servers'
   memory (RSS of the process tree) is sampled through each rate;
5. the servers are stopped with SIGTERM.
Arrivals and request picks come from generators seeded by (seed, fraction index), the same for
both modes. Results: a table on stdout, JSON, a plot of latency against offered load.
"""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt.bench.serve_load import (LoadClient, LoadRequest, RateSummary, closed_loop, open_loop, poisson_arrivals,
                                     request_pool, summarise, tokens_match)
from specrt.errors import SpecrtError

MODES = ("inflight", "dynamic")
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
MEMORY_PERIOD_S = 1.0


@dataclass(frozen=True)
class ServeBenchConfig:
    """What `specrt bench --serve` measures (its flags)."""

    bundle: Optional[Path] = None  # None with url: a running server
    url: Optional[str] = None      # gRPC host:port of a running server (one mode, "server")
    modes: tuple[str, ...] = MODES
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5)
    rate_s: float = 30.0
    overload_s: float = 120.0
    saturation_s: float = 20.0
    slots: int = 8
    groups: Optional[int] = None  # the in-flight scheduler's; None: its default
    max_queue: int = 64
    methods: tuple[tuple[str, dict], ...] = (("sjd", {}),)
    classes: int = 10
    pool_size: int = 20
    seed: int = 0
    threads: Optional[int] = None
    max_requests: int = 5000  # per rate and mode
    timeout_s: float = 300.0


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 right now (held together while picked, so no two
    picks are the same port)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and every descendant (Linux /proc; 0 when it is gone)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                stack += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


class ServerProcess:
    """`specrt serve` in a child process on free 127.0.0.1 ports, stopped with SIGTERM."""

    def __init__(self, bundle: Path, mode: str, config: ServeBenchConfig, log_dir: Path):
        self.mode = mode
        http, grpc, metrics = free_ports(3)
        self.url, self.metrics_url = f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics"
        command = [sys.executable, "-m", "specrt.cli", "serve", str(bundle), "--batching", mode,
                   "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                   "--max-queue", str(config.max_queue), "--max-batch", str(config.slots),
                   "--triton-log", str(log_dir / f"triton-{mode}.log")]
        if mode == "inflight":
            command += ["--slots", str(config.slots)]
            if config.groups is not None:
                command += ["--groups", str(config.groups)]
        if config.threads:
            command += ["--threads", str(config.threads)]
        self.stderr = (log_dir / f"serve-{mode}.txt").open("w+")
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.stderr, text=True)

    def wait_ready(self) -> None:
        end = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < end:
            self.stderr.seek(0)
            text = self.stderr.read()
            if "specrt serve: ready:" in text:
                return
            if self.process.poll() is not None:
                raise SpecrtError(f"the {self.mode} server exited ({self.process.returncode}): "
                                  f"{text.strip().splitlines()[-1:] or ['no output']}")
            time.sleep(0.2)
        raise SpecrtError(f"the {self.mode} server was not ready in {READY_TIMEOUT_S:.0f} s")

    def rss(self) -> int:
        return tree_rss(self.process.pid)

    def stop(self) -> dict[str, Any]:
        """SIGTERM; how it ended (exit code, seconds)."""
        start = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()
        return {"exit_code": self.process.returncode, "stop_seconds": round(time.monotonic() - start, 2)}


class MemoryWatch:
    """Samples a server's RSS every MEMORY_PERIOD_S while a rate runs."""

    def __init__(self, rss: Optional[Callable[[], int]]):
        self.rss, self.samples = rss, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if rss else None

    def _run(self) -> None:
        while not self._stop.wait(MEMORY_PERIOD_S):
            self.samples.append(self.rss())

    def __enter__(self) -> "MemoryWatch":
        if self._thread:
            self.start_rss = self.rss()
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread:
            self._stop.set()
            self._thread.join()
            self.samples.append(self.rss())

    def report(self) -> Optional[dict]:
        if not self._thread or not self.start_rss:
            return None
        peak = max(self.samples, default=self.start_rss)
        return {"start_bytes": self.start_rss, "peak_bytes": peak, "end_bytes": self.samples[-1],
                "growth": round(peak / self.start_rss - 1.0, 4)}


Connect = Callable[[], Any]  # a new client with LoadClient's async send / close (one per phase)


async def _alone(connect: Connect, pool: Sequence[LoadRequest]) -> dict[int, np.ndarray]:
    client = connect()
    try:
        answers = {}
        for index, request in enumerate(pool):
            outcome = await client.send(request, index, 0.0)
            if outcome.kind != "ok":
                raise SpecrtError(f"{request.label} alone: {outcome.kind}: {outcome.message}")
            answers[index] = outcome.tokens
        return answers
    finally:
        await client.close()


async def _saturation(connect: Connect, mode: str, pool: Sequence[LoadRequest], config: ServeBenchConfig) -> float:
    client = connect()
    try:
        outcomes, seconds = await closed_loop(client, pool, 2 * config.slots, config.saturation_s, config.seed)
    finally:
        await client.close()
    ok = sum(o.kind == "ok" for o in outcomes)
    if not ok:
        raise SpecrtError(f"{mode}: no request was answered in {config.saturation_s:.0f} s of closed-loop load")
    return ok / seconds


async def _rate(connect: Connect, pool: Sequence[LoadRequest], rate: float, seconds: float, config: ServeBenchConfig,
                stream: int) -> list:
    arrivals = poisson_arrivals(rate, seconds, config.max_requests, seed=config.seed * 1000 + stream)
    picks = np.random.default_rng(config.seed * 1000 + stream + 500).integers(len(pool), size=len(arrivals))
    client = connect()
    try:
        return await open_loop(client, pool, arrivals, picks)
    finally:
        await client.close()


def measure_modes(connect: dict[str, Connect], rss: dict[str, Callable[[], int]], config: ServeBenchConfig,
                  say: Callable[[str], None]) -> dict[str, Any]:
    """Steps 2 to 4 (module docstring) against each mode's clients (`connect[mode]()` makes one;
    `rss[mode]` the memory to watch, where there is one); the JSON-ready results."""
    pool = request_pool(config.classes, config.pool_size, list(config.methods), config.seed)
    modes = list(connect)
    say(f"answering the {len(pool)} pool requests alone in each mode ...")
    alone = {mode: asyncio.run(_alone(connect[mode], pool)) for mode in modes}
    agree = all(tokens_match(alone[m][i], alone[modes[0]][i]) for m in modes for i in alone[m])
    saturated = {}
    for mode in modes:
        say(f"{mode}: closed loop, {2 * config.slots} clients, {config.saturation_s:.0f} s ...")
        saturated[mode] = asyncio.run(_saturation(connect[mode], mode, pool, config))
    reference_mode = "dynamic" if "dynamic" in saturated else modes[0]
    rows: list[RateSummary] = []
    for index, fraction in enumerate(config.fractions):
        rate = fraction * saturated[reference_mode]
        seconds = config.overload_s if fraction > 1.0 else config.rate_s
        order = modes if index % 2 == 0 else modes[::-1]
        for mode in order:
            say(f"{mode}: {rate:.2f} requests/s ({fraction:g} x {reference_mode}'s saturated) for {seconds:.0f} s")
            with MemoryWatch(rss.get(mode)) as memory:
                outcomes = asyncio.run(_rate(connect[mode], pool, rate, seconds, config, stream=index))
            row = summarise(mode, fraction, rate, outcomes, alone[mode])
            row.memory = memory.report()
            rows.append(row)
    return {"pool": [r.label for r in pool], "modes": modes, "alone_agree": agree, "saturated_per_s": saturated,
            "reference_mode": reference_mode, "rates": [asdict(r) for r in rows],
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}}


def run_serve_bench(config: ServeBenchConfig, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Measure (module docstring); the JSON-ready results."""
    servers: dict[str, ServerProcess] = {}
    stopped: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="specrt-serve-bench-") as logs:
        try:
            if config.url:
                urls = {"server": config.url}
            else:
                for mode in config.modes:
                    say(f"starting the {mode} server ...")
                    servers[mode] = ServerProcess(config.bundle, mode, config, Path(logs))
                urls = {}
                for mode, server in servers.items():
                    server.wait_ready()
                    urls[mode] = server.url
            connect = {mode: (lambda url=url: LoadClient(url, timeout_s=config.timeout_s)) for mode, url in urls.items()}
            results = measure_modes(connect, {mode: server.rss for mode, server in servers.items()}, config, say)
        finally:
            for mode, server in servers.items():
                stopped[mode] = server.stop()
    return {**results, "stopped": stopped}
