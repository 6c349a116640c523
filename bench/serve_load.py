"""Load against a specrt Triton server: open-loop Poisson arrivals, closed-loop saturation, latency percentiles.

Open loop means requests are sent at their arrival times whether or not earlier ones were answered
(a Poisson process: exponential gaps from a seeded generator), so a server that falls behind sees
its queue grow, as it would in production, and latency measures it; a closed loop (N clients each
sending its next request when the last is answered) measures the most a server can do. Requests go
over gRPC (tritonclient's asyncio client, one connection), each drawn from a fixed pool of
(class, seed, method) so every answer can be compared with the same request answered alone.

Every request ends as one Outcome: "ok" (an image; its tokens are compared later), "refused" (the
server said UNAVAILABLE: a full queue or a server shutting down — HTTP 503 over HTTP) or "error"
(anything else, the row's own `error` included). Nothing here starts a server (serve_bench.py does).
"""
from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.serving.client import REFUSALS, request_inputs

REFUSED_STATUS = "StatusCode.UNAVAILABLE"  # with one of the server's refusal reasons; else the server is gone
# A continuous model's latents under load differ from alone in their last bits, as the images of one
# generate call of several do (the batched graphs sum over other shapes) and the drift rides along the
# image's later tokens: on the MAR demo (|x| < 5, float32 spacing 4.8e-7) at most 4.3e-5 over 40 cspd
# requests in 8 slots, in flight or in whole calls. 1e-4 is about 200 such spacings; a wrong draw
# moves a latent by the scale of its noise (order 1).
FLOAT_TOKENS_ATOL = 1e-4


def tokens_match(answer: np.ndarray, alone: np.ndarray) -> bool:
    """Whether an answer's tokens are its request's alone: VQ codes equal, float latents within
    FLOAT_TOKENS_ATOL."""
    if np.issubdtype(np.asarray(alone).dtype, np.floating):
        return answer.shape == alone.shape and bool(np.all(np.abs(answer - alone) <= FLOAT_TOKENS_ATOL))
    return np.array_equal(answer, alone)


@dataclass(frozen=True)
class LoadRequest:
    """One request of the pool: what a client sends."""

    class_id: int
    seed: int
    method: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.params)
        return f"class {self.class_id} seed {self.seed} {self.method}{f'({extra})' if extra else ''}"


def request_pool(classes: int, size: int, methods: Sequence[tuple[str, dict]], seed: int) -> list[LoadRequest]:
    """`size` requests cycling through the classes and methods, seeds seed, seed+1, ..."""
    return [LoadRequest(class_id=i % classes, seed=seed + i, method=methods[i % len(methods)][0],
                        params=tuple(sorted(methods[i % len(methods)][1].items())))
            for i in range(size)]


def poisson_arrivals(rate: float, duration_s: float, max_count: int, seed: int) -> np.ndarray:
    """Arrival times (seconds from the start) of a Poisson process of `rate` per second: exponential
    gaps drawn from numpy's generator seeded with `seed`, those before `duration_s`, at most `max_count`."""
    if rate <= 0 or duration_s <= 0 or max_count <= 0:
        return np.zeros(0)
    expected = rate * duration_s
    draws = int(expected + 10 * math.sqrt(expected) + 20)  # P(the draws end before duration_s) is negligible
    times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=draws))
    return times[times < duration_s][:max_count]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least q% of the values at or below it
    (NaN for no values) — a value that was measured, never an interpolation."""
    if not len(values):
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


@functools.lru_cache(maxsize=64)  # a run asks for the same few counts again and again
def percentile_ranks(count: int, q: float, confidence: float = 0.95) -> tuple[int, int]:
    """1-based ranks (low, high) of the order statistics that bound the q-th percentile of the
    distribution `count` latencies were drawn from with at least `confidence` (each tail at most
    (1 - confidence) / 2): the rank of a draw below the percentile is binomial(count, q/100),
    which needs no assumption about the latencies. 0 for a low rank below the first, count + 1
    for a high one past the last (too few latencies to bound that side).

    Why: p99 of a few hundred answers is one of the slowest few; two runs' p99 ratios differ by a
    tenth (0.59-0.74x at the same setting), and the interval says how much of that is the sample."""
    if count <= 0:
        return 0, 1
    p, tail = q / 100.0, (1.0 - confidence) / 2.0
    log_p, log_q = (math.log(p) if p > 0 else -math.inf), (math.log1p(-p) if p < 1 else -math.inf)

    def pmf(k: int) -> float:  # P(B = k), B ~ binomial(count, p), in log space (p^k underflows)
        if (k > 0 and log_p == -math.inf) or (k < count and log_q == -math.inf):
            return 0.0
        return math.exp(math.lgamma(count + 1) - math.lgamma(k + 1) - math.lgamma(count - k + 1)
                        + (k * log_p if k else 0.0) + ((count - k) * log_q if k < count else 0.0))

    cdf, below = 0.0, []
    for k in range(count + 1):
        cdf += pmf(k)
        below.append(cdf)  # below[k] = P(B <= k)
    # [X_(low), X_(high)] misses the percentile below when B < low, above when B >= high
    low = max((rank for rank in range(1, count + 1) if below[rank - 1] <= tail), default=0)
    high = min((rank for rank in range(1, count + 1) if 1.0 - below[rank - 1] <= tail), default=count + 1)
    return low, high


def percentile_interval(values: Sequence[float], q: float, confidence: float = 0.95) -> tuple[float, float]:
    """The order statistics bounding the q-th percentile with `confidence` (percentile_ranks): NaN on a
    side the values are too few to bound."""
    ordered = sorted(values)
    low, high = percentile_ranks(len(ordered), q, confidence)
    return (float(ordered[low - 1]) if 1 <= low <= len(ordered) else float("nan"),
            float(ordered[high - 1]) if 1 <= high <= len(ordered) else float("nan"))


@dataclass
class Outcome:
    """How one request ended: its pool index, when it was sent (seconds from the run's start), how
    long it took, and "ok" with its tokens, "refused" or "error" with the message."""

    pool_index: int
    sent_s: float
    latency_s: float
    kind: str
    tokens: Optional[np.ndarray] = None
    message: str = ""


class LoadClient:
    """One asyncio gRPC connection to a specrt model; `send` returns an Outcome, never raises."""

    def __init__(self, url: str, model: str = "specrt", timeout_s: float = 120.0):
        import tritonclient.grpc.aio as grpc_aio

        self._lib = grpc_aio
        self.client = grpc_aio.InferenceServerClient(url)
        self.model, self.timeout_s = model, timeout_s

    def _inputs(self, request: LoadRequest) -> list:
        return request_inputs(self._lib, {"class_id": request.class_id, "method": request.method, "seed": request.seed,
                                          "params": json.dumps(dict(request.params))})

    async def send(self, request: LoadRequest, pool_index: int, sent_s: float) -> Outcome:
        outputs = [self._lib.InferRequestedOutput(name) for name in ("tokens", "error")]
        start = time.perf_counter()
        try:
            result = await self.client.infer(self.model, self._inputs(request), outputs=outputs,
                                              client_timeout=self.timeout_s)
        except Exception as exc:  # tritonclient's InferenceServerException carries the gRPC status
            latency = time.perf_counter() - start
            status = str(getattr(exc, "status", lambda: "")())
            message = " ".join(str(exc).split())[:200]
            refused = status == REFUSED_STATUS and any(reason in message for reason in REFUSALS)
            return Outcome(pool_index, sent_s, latency, "refused" if refused else "error", message=message)
        latency = time.perf_counter() - start
        error = bytes(result.as_numpy("error")[0, 0]).decode()
        if error:
            return Outcome(pool_index, sent_s, latency, "error", message=error[:200])
        return Outcome(pool_index, sent_s, latency, "ok", tokens=np.array(result.as_numpy("tokens")[0]))

    async def close(self) -> None:
        await self.client.close()


async def open_loop(client: LoadClient, pool: Sequence[LoadRequest], arrivals: np.ndarray,
                    picks: np.ndarray) -> list[Outcome]:
    """Send pool[picks[i]] at arrivals[i] seconds from now (not waiting for answers); every Outcome."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for at, pick in zip(arrivals, picks):
        delay = start + float(at) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(client.send(pool[int(pick)], int(pick), loop.time() - start)))
    return list(await asyncio.gather(*tasks))


async def closed_loop(client: LoadClient, pool: Sequence[LoadRequest], concurrency: int, duration_s: float,
                      seed: int) -> tuple[list[Outcome], float]:
    """`concurrency` clients, each sending its next request as soon as the last is answered, for
    `duration_s`; every Outcome and the seconds until the last answer."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    rng = np.random.default_rng(seed)
    outcomes: list[Outcome] = []

    async def worker() -> None:
        while loop.time() - start < duration_s:
            pick = int(rng.integers(len(pool)))
            outcomes.append(await client.send(pool[pick], pick, loop.time() - start))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes, loop.time() - start


@dataclass
class RateSummary:
    """One mode at one offered rate: counts, throughput and latency percentiles of the images."""

    mode: str
    fraction: float       # of the reference saturated throughput
    offered_per_s: float
    seconds: float        # from the first send to the last answer
    sent: int
    ok: int
    refused: int
    errors: int
    throughput_per_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    p99_interval_s: tuple[float, float]  # 95% confidence bounds of the p99 (percentile_interval)
    refused_max_s: float  # the slowest refusal (NaN when none)
    same_tokens: int      # ok answers whose tokens are the same request's answer alone (tokens_match)
    error_messages: list[str] = field(default_factory=list)
    memory: Optional[dict] = None  # server RSS at the start and its most during the rate (bytes)


def summarise(mode: str, fraction: float, offered: float, outcomes: Sequence[Outcome],
              reference: dict[int, np.ndarray]) -> RateSummary:
    """The RateSummary of one rate's outcomes; `reference`: pool index -> tokens answered alone."""
    ok = [o for o in outcomes if o.kind == "ok"]
    refused = [o for o in outcomes if o.kind == "refused"]
    errors = [o for o in outcomes if o.kind == "error"]
    seconds = max((o.sent_s + o.latency_s for o in outcomes), default=0.0)
    latencies = [o.latency_s for o in ok]
    same = sum(1 for o in ok if o.pool_index in reference and tokens_match(o.tokens, reference[o.pool_index]))
    return RateSummary(mode=mode, fraction=fraction, offered_per_s=offered, seconds=seconds, sent=len(outcomes),
                       ok=len(ok), refused=len(refused), errors=len(errors),
                       throughput_per_s=len(ok) / seconds if seconds > 0 else 0.0,
                       p50_s=percentile(latencies, 50), p95_s=percentile(latencies, 95), p99_s=percentile(latencies, 99),
                       p99_interval_s=percentile_interval(latencies, 99),
                       refused_max_s=max((o.latency_s for o in refused), default=float("nan")), same_tokens=same,
                       error_messages=sorted({o.message for o in errors})[:5])
