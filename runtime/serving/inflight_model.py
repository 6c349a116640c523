"""The Triton model of in-flight serving: every request handed to a Scheduler, answered when its image is done.

Why a model of our own instead of PyTriton's: with PyTriton the inference callable runs in the
serving process and its errors reach clients as HTTP 500 / gRPC INTERNAL; a Python-backend model
runs in Triton's stub process, where `pb_utils` offers what in-flight serving needs —
- response senders: `execute` hands each request to the scheduler and returns at once (the model
  stays non-decoupled, so plain HTTP and gRPC inference work; Triton refuses decoupled models over
  both), and the one response is sent when the image is done, so requests keep arriving while
  images decode;
- error codes: a full queue is refused at once with TritonError UNAVAILABLE, which Triton turns
  into HTTP 503 and gRPC UNAVAILABLE ("the queue is full ...");
- request cancellation: `request.is_cancelled()` is polled (CANCEL_POLL_S) and a cancelled request
  leaves its slot at the scheduler's next round (Triton reports cancellation for gRPC clients that
  cancel or time out; its HTTP front end, 2.51 as PyTriton 0.7.0 bundles it, does not read a
  connection while its request runs, so a client that disconnects is not reported and its request
  runs to its end or its deadline: an HTTP request's own `timeout` or `request_timeout_s`);
- custom metrics on Triton's metrics port (scheduler_metrics.py).

Rows: a request's rows are decoded by protocol.decode_request as in dynamic batching; each row is
one scheduler request, and the request is answered once every row has ended. A row the model
refuses (its condition, method, parameters) or whose deadline passed gets its one-line `error`,
as in dynamic batching. Request-level outcomes are Triton errors: UNAVAILABLE for a full queue
and for a server shutting down, CANCELLED for a request its client cancelled.

Deadlines: Triton's own request timeout (the `timeout` of a KServe v2 request, microseconds;
tritonclient's `infer(..., timeout=...)`) or the model's `request_timeout_s`, whichever is
sooner; past it the row ends with "the request's deadline passed ..." at the next round.

Shutdown: when the serving process creates the `drain_file` (pytriton_server.running does so
before it stops Triton), the scheduler stops admitting (new requests: UNAVAILABLE "the server is
shutting down"), waiting requests are refused the same way, running images get `drain_s` seconds
to finish and then end with UNAVAILABLE "the server shut down before this image was finished";
the model then creates `drain_file` + ".done". Every request is answered exactly once
(`Pending.answer` guards it).
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import threading
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.runtime.scheduling import DeadlineExceeded, QueueFull, Request, RequestCancelled, Scheduler, SchedulerClosed
from specrt.runtime.scheduling.scheduler import DEFAULT_GROUPS, DEFAULT_SLOTS
from specrt.runtime.serving.inflight_repo import open_pipeline, parameters_of
from specrt.runtime.serving.protocol import INPUTS, ImageRequest, ImageResult, decode_request, encode_response, png_bytes

LOG = logging.getLogger("specrt.serve")
CANCEL_POLL_S = 0.2  # how often outstanding requests are asked whether their client cancelled them
METRICS_PERIOD_S = 1.0  # how often the scheduler's stats are copied into Triton's metrics
SHUTTING_DOWN = "the server is shutting down: it admits no new request; retry on another replica"
SHUT_DOWN_RUNNING = "the server shut down before this image was finished"
CANCELLED = "the client cancelled the request"


@dataclass
class Pending:
    """One Triton request in flight: its rows' results as they end, answered once."""

    request: Any  # pb_utils.InferenceRequest
    sender: Any   # its response sender
    received: float  # time.monotonic() when execute took it
    rows: list  # ImageRequest or the SpecrtError that ruled the row out
    results: list[Optional[ImageResult]]
    tickets: list = field(default_factory=list)
    answered: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """True once, for whoever answers this request first."""
        with self.lock:
            if self.answered:
                return False
            self.answered = True
            return True


def scheduler_options(parameters: dict[str, str], max_images: Optional[int]) -> dict[str, Any]:
    """The Scheduler's keyword arguments from the model's parameters (InflightConfig's, as strings;
    empty: the default). No --slots: 8, or fewer where the model decodes fewer images together (its
    export's --max-batch); more than that is refused with the flag that fixes it."""
    slots = int(parameters.get("slots") or min(DEFAULT_SLOTS, max_images or DEFAULT_SLOTS))
    if max_images and slots > max_images:
        raise SpecrtError(f"--slots {slots}: this model decodes at most {max_images} images together "
                          f"(a bundle's `specrt export --max-batch`)")
    wait = parameters.get("max_group_wait_s")
    return {"slots": slots, "max_queue": int(parameters.get("max_queue") or 64),
            "groups": int(parameters.get("groups") or DEFAULT_GROUPS),
            "max_group_wait": float(wait) if wait else None}


class TritonPythonModel:
    """In-flight serving as a Triton Python-backend model (one instance; the scheduler owns the slots)."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.pb = importlib.import_module("triton_python_backend_utils")  # exists inside the stub only
        parameters = parameters_of(json.loads(args["model_config"]))
        pipeline = open_pipeline(json.loads(parameters["pipeline"]))
        from specrt.runtime.family_registry import pipeline_family

        self.family = pipeline_family(pipeline)
        self.token_shape = tuple(self.family.token_shape(pipeline))
        self.decodes = self.family.has_decoder(pipeline)
        self.request_timeout_s = float(parameters["request_timeout_s"]) if parameters.get("request_timeout_s") else None
        self.drain_s = float(parameters.get("drain_s") or 10.0)
        self.drain_file = parameters.get("drain_file") or None
        self.scheduler = Scheduler(pipeline, **scheduler_options(parameters, getattr(pipeline, "max_images", None)))
        from specrt.runtime.serving.scheduler_metrics import SchedulerMetrics

        self.metrics = SchedulerMetrics(self.pb, args.get("model_name", "specrt"), self.scheduler.slots)
        self._outstanding: dict[int, Pending] = {}
        self._lock = threading.Lock()
        self._ended: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._draining = False
        self._threads = [threading.Thread(target=self._respond, name="specrt-respond", daemon=True),
                         threading.Thread(target=self._watch, name="specrt-watch", daemon=True)]
        for thread in self._threads:
            thread.start()

    # ---- requests in ---------------------------------------------------------------------------------

    def execute(self, requests: list) -> None:
        for request in requests:
            self._take(request)
        return None  # every request is answered through its response sender

    def _take(self, request: Any) -> None:
        now = time.monotonic()
        inputs = {}
        for spec in INPUTS:
            tensor = self.pb.get_input_tensor_by_name(request, spec.name)
            if tensor is not None:
                inputs[spec.name] = tensor.as_numpy()
        rows = decode_request(inputs)
        pending = Pending(request, request.get_response_sender(), now, rows, [None] * len(rows))
        deadline = self._deadline(request, now)
        for index, row in enumerate(rows):
            if isinstance(row, SpecrtError):
                pending.results[index] = ImageResult(error=str(row))
                continue
            try:
                ticket = self.scheduler.submit(self._scheduler_request(row, deadline))
            except QueueFull as exc:  # "the queue is full (N requests waiting): retry later"
                self._refuse(pending, str(exc))
                return
            except SchedulerClosed:
                self._refuse(pending, SHUTTING_DOWN)
                return
            except SpecrtError as exc:  # the model refuses this row: its own error, the others are served
                pending.results[index] = ImageResult(error=str(exc))
                continue
            pending.tickets.append((index, ticket))
        if not pending.tickets:
            self._answer(pending)
            return
        with self._lock:
            self._outstanding[id(pending)] = pending
        for index, ticket in pending.tickets:
            ticket.future.add_done_callback(lambda future, p=pending, i=index: self._ended.put((p, i, future)))

    def _deadline(self, request: Any, now: float) -> Optional[float]:
        """The sooner of the request's own Triton timeout (microseconds; 0: none) and request_timeout_s."""
        limits = [self.request_timeout_s] if self.request_timeout_s else []
        try:
            if request.timeout():
                limits.append(request.timeout() / 1e6)
        except AttributeError:  # a stub without InferenceRequest.timeout
            pass
        return now + min(limits) if limits else None

    def _scheduler_request(self, row: ImageRequest, deadline: Optional[float]) -> Request:
        return Request(class_id=row.class_id, prompt=row.prompt, method=row.method, params=dict(row.params),
                       seed=row.seed, decode=self.decodes and not row.tokens_only,
                       negative_prompt=row.negative_prompt, prompt_suffix=row.prompt_suffix, deadline=deadline)

    # ---- answers out -------------------------------------------------------------------------------

    def _refuse(self, pending: Pending, message: str, code: str = "UNAVAILABLE") -> None:
        """Answer the whole request with a Triton error (its admitted rows are cancelled)."""
        if not pending.claim():
            return
        for _, ticket in pending.tickets:
            ticket.cancel()
        error = self.pb.TritonError(message, getattr(self.pb.TritonError, code))
        self._send(pending, self.pb.InferenceResponse(error=error))

    def _answer(self, pending: Pending) -> None:
        if not pending.claim():
            return
        outputs = encode_response(pending.results, self.token_shape, self.family.token_dtype)
        tensors = [self.pb.Tensor(name, array) for name, array in outputs.items()]
        self._send(pending, self.pb.InferenceResponse(output_tensors=tensors))
        self.metrics.observe_latency(time.monotonic() - pending.received)

    def _send(self, pending: Pending, response: Any) -> None:
        with self._lock:
            self._outstanding.pop(id(pending), None)
        try:
            pending.sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # the client went away or Triton is stopping: nobody to answer
            LOG.warning("a response could not be sent", exc_info=True)

    def _respond(self) -> None:
        """Turns ended rows into answers, off the scheduler's thread (PNG encoding, IPC)."""
        while True:
            item = self._ended.get()
            if item is None:
                return
            pending, index, future = item
            try:
                self._row_ended(pending, index, future)
            except Exception:  # a bug: answer the request rather than leave it hanging
                LOG.exception("answering a request failed")
                self._refuse(pending, "internal error while answering the request", "INTERNAL")

    def _row_ended(self, pending: Pending, index: int, future: Future) -> None:
        if pending.answered:
            return
        try:
            result = future.result()
        except CancelledError:
            self._refuse(pending, CANCELLED, "CANCELLED")
            return
        except (SchedulerClosed, RequestCancelled) as exc:
            self._refuse(pending, SHUTTING_DOWN if isinstance(exc, SchedulerClosed) else SHUT_DOWN_RUNNING)
            return
        except DeadlineExceeded as exc:
            pending.results[index] = ImageResult(error=str(exc))
        except SpecrtError as exc:
            pending.results[index] = ImageResult(error=str(exc))
        except Exception as exc:  # a bug in decoding this row: its error, the server keeps serving
            pending.results[index] = ImageResult(error=f"internal error: {type(exc).__name__}: "
                                                       f"{(str(exc).splitlines() or [''])[0]}")
        else:
            pending.results[index] = self._image(result, pending, pending.rows[index])
        if all(result is not None for result in pending.results):
            self._answer(pending)

    def _image(self, result: Any, pending: Pending, row: ImageRequest) -> ImageResult:
        """A finished image's row: its tokens, PNG and stats (the family's numbers for this image,
        server_seconds from the request's arrival to now)."""
        stats = {"method": row.method, **self.family.serving_stats(result),
                 "server_seconds": round(time.monotonic() - pending.received, 6)}
        png = b"" if getattr(result, "images", None) is None else png_bytes(result.images[0])
        return ImageResult(tokens=result.tokens[0].reshape(self.token_shape), png=png, stats=stats)

    # ---- the watch: cancellations, metrics, draining ------------------------------------------------

    def _watch(self) -> None:
        next_metrics = 0.0
        parent = os.getppid()
        while not self._stop.wait(CANCEL_POLL_S):
            if os.getppid() != parent:  # Triton is gone: nobody can be answered, stop decoding for no one
                LOG.error("the Triton server exited; this model process stops")
                os._exit(1)
            with self._lock:
                outstanding = list(self._outstanding.values())
            for pending in outstanding:
                with pending.lock:  # never ask about a request once answered: Triton may have released it
                    if pending.answered:
                        continue
                    try:
                        cancelled = pending.request.is_cancelled()
                    except Exception:  # a stub without cancellation
                        cancelled = False
                if cancelled:
                    for _, ticket in pending.tickets:
                        ticket.cancel()  # its slot is freed at the next round; _row_ended answers CANCELLED
            now = time.monotonic()
            if now >= next_metrics:
                self.metrics.update(self.scheduler.stats(), now)
                next_metrics = now + METRICS_PERIOD_S
            if self.drain_file and not self._draining and os.path.exists(self.drain_file):
                self._draining = True
                threading.Thread(target=self._drain, name="specrt-drain", daemon=True).start()

    def _drain(self) -> None:
        """Stop admitting, let running images finish within drain_s, answer everything, say so."""
        self.scheduler.close(timeout=self.drain_s)
        self._flush()
        with open(f"{self.drain_file}.done", "w"):
            pass

    def _flush(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until every request taken has been answered."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if not self._outstanding:
                    return
            time.sleep(0.02)

    def finalize(self) -> None:
        self.scheduler.close(timeout=0.0, cancel_running=True)
        self._flush()
        self._stop.set()
        self._ended.put(None)
        for thread in self._threads:
            thread.join(timeout=5.0)
