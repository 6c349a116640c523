"""`specrt bench --serve --in-process`: the runtime's Scheduler under the same load, without Triton.

Why: `specrt bench --serve` measures two Triton servers, so its figures mix the scheduler with the
server (gRPC, the Python backend's stub process, a load generator sharing the machine) and need
PyTriton where they run — a GPU machine without it cannot measure in-flight batching at all. Here
both modes run in this process on one pipeline (any backend and device): "inflight" is
Scheduler(inflight=True), images entering and leaving between rounds; "dynamic" is
Scheduler(inflight=False), each batch one whole generate call over the requests that waited for it,
as Triton's dynamic batcher with no queue delay makes them. The load, the phases and the results
are serve_bench's (measure_modes): the same pool, alone answers, closed-loop saturation, open-loop
Poisson rates, percentiles, tokens compared with alone, this process's memory.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

from specrt.bench.serve_bench import MODES, ServeBenchConfig, measure_modes
from specrt.bench.serve_load import LoadRequest, Outcome
from specrt.errors import SpecrtError
from specrt.runtime.scheduling import QueueFull, Request, Scheduler

MESSAGE_CHARS = 200


class SchedulerClient:
    """LoadClient's interface over a Scheduler in this process: `send` submits and awaits, never raises."""

    def __init__(self, scheduler: Scheduler, timeout_s: float):
        self.scheduler, self.timeout_s = scheduler, timeout_s

    async def send(self, request: LoadRequest, pool_index: int, sent_s: float) -> Outcome:
        start = time.perf_counter()
        try:
            ticket = self.scheduler.submit(Request(class_id=request.class_id, seed=request.seed, method=request.method,
                                                   params=dict(request.params)))
            result = await asyncio.wait_for(asyncio.wrap_future(ticket.future), self.timeout_s)
        except QueueFull as exc:
            return Outcome(pool_index, sent_s, time.perf_counter() - start, "refused", message=str(exc))
        except (SpecrtError, asyncio.TimeoutError) as exc:
            message = str(exc) or f"no answer in {self.timeout_s:g} s"
            return Outcome(pool_index, sent_s, time.perf_counter() - start, "error", message=message[:MESSAGE_CHARS])
        return Outcome(pool_index, sent_s, time.perf_counter() - start, "ok", tokens=result.tokens[0])

    async def close(self) -> None:
        pass


def process_rss() -> int:
    """Resident bytes of this process (Linux /proc; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_scheduler_bench(pipeline: Any, config: ServeBenchConfig,
                        say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Measure both modes on `pipeline` (module docstring); the JSON-ready results, as run_serve_bench's."""
    groups = {} if config.groups is None else {"groups": config.groups}
    schedulers = {mode: Scheduler(pipeline, slots=config.slots, max_queue=config.max_queue,
                                  inflight=mode == "inflight", **groups) for mode in MODES}
    try:
        connect = {mode: (lambda s=scheduler: SchedulerClient(s, config.timeout_s))
                   for mode, scheduler in schedulers.items()}
        results = measure_modes(connect, {mode: process_rss for mode in MODES}, config, say)
    finally:
        stopped = {}
        for mode, scheduler in schedulers.items():
            start = time.monotonic()
            scheduler.close(timeout=config.timeout_s, cancel_running=True)
            stopped[mode] = {"stop_seconds": round(time.monotonic() - start, 2)}
    return {**results, "stopped": stopped, "in_process": True}
