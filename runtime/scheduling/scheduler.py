"""The scheduler: a bounded queue in front of a fixed number of slots, one worker thread decoding.

Why: a generate call decodes its batch to the end, so a request that arrives during it waits for
a whole image, and the call's batch drains as its images finish. Here images enter and leave
between rounds (in-flight batching, as vLLM and TensorRT-LLM schedule sequences): a slot holds one
image from its prefill to its last token (its whole KV budget: nothing is evicted mid-image), a
finished image leaves at the end of its round and a waiting request takes the slot before the
next, so the batch stays full while the queue is not empty.

The grouping rule. Requests share rounds only when their Request.group is equal — the same method,
method parameters, sampling keys, decoding and unconditional-row options; the condition (class id,
prompt) and the seed may differ. A round is one method's round function on one guidance matrix,
so requests of different methods or parameters cannot share it; they wait in their own group. The
scheduler runs one group's batch at a time:
- when no batch runs, it opens one for the group of the oldest waiting request;
- between rounds the running batch admits its own group's waiting requests, oldest first, into
  free slots — until a request of another group has waited longer than `max_group_wait` seconds
  (by default one image's time: the recent mean from admission to last token, so the default fits
  a 60 ms demo image and a GPT-XL image of seconds alike); from then on only its own requests
  older than that one enter, then it runs its images to their end, and the next batch is the group
  of the oldest waiting request. So a single-group
  load keeps every slot busy, and a mixed load is served oldest-first with each group's wait
  bounded by about two images' time (the wait, then the running images' last tokens) — what a
  dynamic batcher's call in progress costs it, where a fixed wait of seconds would cost more.

Faults and back-pressure: submit refuses a request at once with QueueFull when `max_queue`
requests wait; a request past its deadline ends with DeadlineExceeded at the next round (waiting
or running); a cancelled ticket's slot is freed at the next round; close() admits nothing more,
ends waiting requests with SchedulerClosed, and lets running ones finish (or ends them with
RequestCancelled) within its timeout. Every future is resolved once: a result is delivered only
to the ticket whose request made it, and never after the ticket was cancelled or failed.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import InvalidStateError
from typing import Any, Optional

from specrt import validation
from specrt.errors import SpecrtError
from specrt.runtime.family_registry import pipeline_family
from specrt.runtime.scheduling.batches import RoundReport, SlotBatch, open_batch
from specrt.runtime.scheduling.requests import (DeadlineExceeded, QueueFull, Request, RequestCancelled,
                                                SchedulerClosed, Ticket)
from specrt.runtime.scheduling.stats import SchedulerStats

LOG = logging.getLogger("specrt.scheduler")
MAX_SLOTS = 256
MAX_QUEUE = 100_000
DEFAULT_SLOTS = 8  # images decoding together when the caller names no number
MAX_GROUP_WAIT = 3600.0
IMAGE_TIME_WEIGHT = 0.2  # the newest image's share of the recent mean image time


class Scheduler:
    """Decodes submitted requests in `slots` slots on `pipeline` (any family's), in its own thread.

    `max_queue`: waiting requests beyond which submit raises QueueFull. `max_group_wait`: seconds a
    request of another group may wait before the running batch stops admitting (module docstring);
    None: one image's time, as measured on this scheduler's recent images.
    `inflight=False` runs each batch as one whole generate call (the dynamic batcher's way), the
    baseline in-flight batching is measured against. Do not call the pipeline's generate directly
    while the scheduler decodes: such calls wait for the running batch (the pipeline's lock)."""

    def __init__(self, pipeline: Any, *, slots: int = DEFAULT_SLOTS, max_queue: int = 64,
                 max_group_wait: Optional[float] = None, inflight: bool = True):
        self.pipeline = pipeline
        self.family = pipeline_family(pipeline)
        # a bundle's graphs take at most its max_images images in one call (export --max-batch)
        self.slots = validation.count("slots", slots, high=min(MAX_SLOTS, getattr(pipeline, "max_images", MAX_SLOTS)))
        self.max_queue = validation.count("max_queue", max_queue, high=MAX_QUEUE)
        self.max_group_wait = (None if max_group_wait is None
                               else validation.number("max_group_wait", max_group_wait, low=0.0, high=MAX_GROUP_WAIT))
        self._image_seconds: Optional[float] = None  # recent mean admission-to-finish time (the default wait)
        self.inflight = validation.flag("inflight", inflight)
        self._cond = threading.Condition(threading.RLock())  # future callbacks re-enter it from the worker
        self._waiting: deque[Ticket] = deque()
        self._running: dict[int, Ticket] = {}
        self._batch: Optional[SlotBatch] = None
        self._group: Optional[tuple] = None
        self._closing = self._cancel_running = False
        self._stats = SchedulerStats(self.slots)
        self._thread = threading.Thread(target=self._work, name="specrt-scheduler", daemon=True)
        self._thread.start()

    # ---- the caller's side -----------------------------------------------------------------------

    def submit(self, request: Request) -> Ticket:
        """Queue `request`; its Ticket resolves when its image is done. Raises at once: QueueFull
        when max_queue requests wait, SchedulerClosed after close(), SpecrtError for a request the
        model refuses (its condition, method or parameters), checked before it is queued."""
        if not isinstance(request, Request):
            raise SpecrtError(f"submit takes a Request, got {type(request).__name__}")
        self._check(request)
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the scheduler is closed: it admits no new request")
            if len(self._waiting) >= self.max_queue:
                self._stats.refused += 1
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting): retry later")
            ticket = Ticket(request, time.monotonic())
            self._waiting.append(ticket)
            self._stats.submitted += 1
            ticket.future.add_done_callback(self._wake)  # a cancel wakes the worker to free the slot
            self._cond.notify_all()
        return ticket

    def stats(self) -> SchedulerStats:
        """A snapshot of the counters and gauges (SchedulerStats)."""
        with self._cond:
            snapshot = self._stats.copy()
            snapshot.queued, snapshot.running = len(self._waiting), len(self._running)
            return snapshot

    def close(self, timeout: float = 30.0, cancel_running: bool = False) -> None:
        """Admit nothing more; waiting requests end with SchedulerClosed; running ones finish, or
        end with RequestCancelled at the next round when `cancel_running`. Returns within about
        `timeout` seconds: what still runs then ends with RequestCancelled (a round in progress
        finishes in the background and its images are dropped)."""
        timeout = validation.number("timeout", timeout, low=0.0)
        with self._cond:
            self._closing = True
            self._cancel_running = self._cancel_running or validation.flag("cancel_running", cancel_running)
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                self._cancel_running = True
                for ticket in list(self._running.values()):
                    self._fail(ticket, RequestCancelled("the scheduler closed before this image was finished"),
                               "cancelled")

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(cancel_running=exc[0] is not None)

    def _check(self, request: Request) -> None:
        """What generate would refuse for this request, found before it is queued."""
        self.family.check_submitted(self.pipeline, request.method, dict(request.params), class_id=request.class_id,
                                    prompt=request.prompt, prompt_options=request.prompt_options)

    # ---- the worker --------------------------------------------------------------------------------

    def _wake(self, _: Any = None) -> None:
        with self._cond:
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                leaving = self._sweep()
                if self._closing and not self._waiting and not self._running:
                    break
                if not self._running and not self._waiting:
                    if self._batch is not None:
                        self._end_batch()
                    self._cond.wait(self._idle_timeout())
                    continue
                admitted = self._admissions(leaving)
            try:
                self._round(leaving, admitted)
            except Exception as exc:  # a bug, not a request's mistake: fail what runs, log, keep serving
                LOG.exception("a scheduler round failed")
                with self._cond:
                    for ticket in list(self._running.values()):
                        self._fail(ticket, exc, "failed")
                    self._running.clear()
                    self._end_batch()
        with self._cond:
            if self._batch is not None:
                self._end_batch()

    def _sweep(self) -> list[int]:
        """Waiting requests that were cancelled, expired or closed out leave the queue; the slots
        of running ones that were cancelled or expired are returned (released before the round)."""
        now = time.monotonic()
        kept: deque[Ticket] = deque()
        for ticket in self._waiting:
            if ticket.future.done():
                self._stats.cancelled += ticket.future.cancelled()
            elif self._closing:
                self._fail(ticket, SchedulerClosed("the scheduler closed before this request got a slot"), "closed")
            elif ticket.request.deadline is not None and now >= ticket.request.deadline:
                self._fail(ticket, DeadlineExceeded("the request's deadline passed while it waited for a slot"),
                           "expired")
            else:
                kept.append(ticket)
        self._waiting = kept
        leaving = []
        for slot, ticket in list(self._running.items()):
            if ticket.future.done():
                self._stats.cancelled += ticket.future.cancelled()
            elif self._cancel_running:
                self._fail(ticket, RequestCancelled("the scheduler closed and cancelled this request"), "cancelled")
            elif ticket.request.deadline is not None and now >= ticket.request.deadline:
                self._fail(ticket, DeadlineExceeded("the request's deadline passed before its image was finished"),
                           "expired")
            else:
                continue
            leaving.append(slot)
            del self._running[slot]
        return leaving

    def _idle_timeout(self) -> Optional[float]:
        deadlines = [t.request.deadline for t in self._waiting if t.request.deadline is not None]
        return max(min(deadlines) - time.monotonic(), 0.0) if deadlines else None

    def _admissions(self, leaving: list[int]) -> list[Ticket]:
        """The waiting requests that enter the running batch (or the one to open) before this round,
        by the grouping rule (module docstring); they leave the queue."""
        if not self._running:
            self._group = self._waiting[0].request.group if self._waiting else None
        if self._group is None:
            return []
        limit = self.max_group_wait if self.max_group_wait is not None else self._image_seconds
        other = min((t.submitted for t in self._waiting if t.request.group != self._group), default=None)
        # another group waited long enough: only requests older than it still enter, then this batch drains
        cutoff = other if other is not None and limit is not None and time.monotonic() - other > limit else None
        free = self.slots - len(self._running)
        admitted = [t for t in self._waiting
                    if t.request.group == self._group and (cutoff is None or t.submitted <= cutoff)][:free]
        for ticket in admitted:
            self._waiting.remove(ticket)
        return admitted

    def _round(self, leaving: list[int], admitted: list[Ticket]) -> None:
        """Outside the lock: free the leaving slots, admit, run one round, deliver what finished."""
        batch = self._batch
        for slot in leaving:
            batch.release(slot)
        if admitted and (batch is None or batch.occupied == {} and self._batch_group != self._group):
            if batch is not None:
                with self._cond:
                    self._end_batch()
            try:
                batch = self._batch = open_batch(self.pipeline, admitted[0].request, self.slots, self.inflight)
                self._batch_group = self._group
            except SpecrtError as exc:
                with self._cond:
                    for ticket in admitted:
                        self._fail(ticket, exc, "failed")
                return
        for ticket in admitted:
            if ticket.future.done():  # cancelled on its way in
                self._stats.cancelled += ticket.future.cancelled()
                continue
            slot = batch.free()[0]
            try:
                batch.admit(slot, ticket.request)
            except SpecrtError as exc:
                batch.release(slot)
                with self._cond:
                    self._fail(ticket, exc, "failed")
                continue
            with self._cond:
                ticket.admitted = time.monotonic()
                self._running[slot] = ticket
        if not self._running:
            return
        report = batch.round()
        with self._cond:
            self._stats.rounds += 1
            self._stats.slot_rounds += len(self._running)
            self._deliver(report)

    def _deliver(self, report: RoundReport) -> None:
        now = time.monotonic()
        for slot, value in report.finished.items():
            ticket = self._running.pop(slot, None)
            if ticket is None:  # released this round (cancelled, expired): nobody waits for it
                continue
            if isinstance(value, BaseException):
                self._fail(ticket, value, "failed")
                continue
            try:
                ticket.future.set_result(value)
            except InvalidStateError:  # cancelled or failed meanwhile (close's timeout): never answered twice
                self._stats.cancelled += ticket.future.cancelled()
                continue
            self._stats.completed += 1
            self._stats.record_latency(now - ticket.submitted)
            self._record_image_time(now - ticket.admitted)
        self._stats.tokens += report.tokens
        self._stats.target_forwards += report.target_forwards
        self._stats.accepted_lengths.update(report.accepted_lengths)

    def _record_image_time(self, seconds: float) -> None:
        """Fold one image's admission-to-finish time into the recent mean (the default group wait)."""
        last = self._image_seconds
        self._image_seconds = seconds if last is None else last + IMAGE_TIME_WEIGHT * (seconds - last)

    def _fail(self, ticket: Ticket, error: BaseException, how: str) -> None:
        """End `ticket` with `error`, counted under `how` (nothing when it has already ended)."""
        try:
            ticket.future.set_exception(error)
        except InvalidStateError:
            return
        setattr(self._stats, how, getattr(self._stats, how) + 1)

    def _end_batch(self) -> None:
        if self._batch is not None:
            self._batch.close()
        self._batch = None
        self._batch_group = None

    _batch_group: Optional[tuple] = None
