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
so requests of different methods or parameters cannot share it: each group has a batch of its own.
Up to `groups` batches are open at once, each on its own runners over the one model
(Pipeline.sibling: weights and sessions shared, KV buffers not) and each holding up to `slots`
images (its buffers' size) — as a dynamic batcher runs a call of up to its batch size per group.
The worker runs, round after round, the busy batch holding the longest-waiting image (the earliest
submitted): turns go oldest first, as a queue is served, not round-robin, whose equal shares make
every image of a burst wait for every other batch's rounds and lengthen the slowest requests.
Between rounds, waiting requests enter oldest first: into their group's batch, or a batch opened
for their group while fewer than `groups` are open (or in place of one with no image). So a mixed load of a few groups is served
as a single-group load is — a request joins its group's batch at the next round whatever else
runs — and no group's batch drains while another waits.

More groups than batches: a request whose group has no batch waits while the open batches keep
admitting — until it has waited longer than `max_group_wait` seconds (by default one image's time:
the recent mean from admission to last token, so the default fits a 60 ms demo image and a GPT-XL
image of seconds alike); from then on only requests older than it enter, the open batches run
their images to their end, and the first one empty is closed for its group. Its wait is so bounded
by about two images' time — what a dynamic batcher's call in progress costs it. A pipeline whose
runners cannot share their model (TensorRT engines) has one batch at a time
by this same rule; where one more batch's buffers do not fit in memory (an out-of-memory error as it
opens, beside open ones), the batches open then are the most from then on.

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
from dataclasses import dataclass, field
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
DEFAULT_GROUPS = 4  # groups' batches open at once (each holds KV buffers for `slots` images)
MAX_GROUPS = 16
MAX_GROUP_WAIT = 3600.0
IMAGE_TIME_WEIGHT = 0.2  # the newest image's share of the recent mean image time


class Scheduler:
    """Decodes submitted requests on `pipeline` (any family's) in batches of `slots` slots, one per
    request group, in its own thread.

    `max_queue`: waiting requests beyond which submit raises QueueFull. `groups`: batches of
    different groups open at once (module docstring), each holding KV buffers for `slots` images
    (memory grows with it: 1 keeps one batch's); `max_group_wait`: seconds a request of a group
    with no batch may wait before the open batches stop admitting newer requests; None: one
    image's time, as measured on this scheduler's recent images.
    `inflight=False` runs each batch as one whole generate call (the dynamic batcher's way), the
    baseline in-flight batching is measured against. Do not call the pipeline's generate directly
    while the scheduler decodes: such calls wait for its first batch (the pipeline's lock)."""

    def __init__(self, pipeline: Any, *, slots: int = DEFAULT_SLOTS, max_queue: int = 64, groups: int = DEFAULT_GROUPS,
                 max_group_wait: Optional[float] = None, inflight: bool = True):
        self.pipeline = pipeline
        self.family = pipeline_family(pipeline)
        # a bundle's graphs take at most its max_images images in one call (export --max-batch)
        self.slots = validation.count("slots", slots, high=min(MAX_SLOTS, getattr(pipeline, "max_images", MAX_SLOTS)))
        self.max_queue = validation.count("max_queue", max_queue, high=MAX_QUEUE)
        self.groups = validation.count("groups", groups, high=MAX_GROUPS)
        self.max_group_wait = (None if max_group_wait is None
                               else validation.number("max_group_wait", max_group_wait, low=0.0, high=MAX_GROUP_WAIT))
        self._image_seconds: Optional[float] = None  # recent mean admission-to-finish time (the default wait)
        self.inflight = validation.flag("inflight", inflight)
        self._cond = threading.Condition(threading.RLock())  # future callbacks re-enter it from the worker
        self._waiting: deque[Ticket] = deque()
        # the waiting queue is swept only when one of its requests may have ended (a future done:
        # a cancel) or a deadline is due, not every round: a long queue costs nothing between
        self._queue_changed = False
        self._next_deadline: Optional[float] = None  # the earliest deadline of a waiting request
        self._open: list[OpenBatch] = []  # the groups' open batches (whose rounds run: _oldest)
        self._pipelines: list[Any] = [pipeline]  # the pipeline and its siblings made so far (one per open batch)
        self._shares_model = callable(getattr(pipeline, "sibling", None))  # until a sibling() says otherwise
        self._memory_batches = MAX_GROUPS  # batches whose buffers fit together (lowered when one more did not)
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
            if request.deadline is not None:
                self._next_deadline = min(request.deadline, self._next_deadline or request.deadline)
            self._stats.submitted += 1
            ticket.future.add_done_callback(self._wake)  # a cancel wakes the worker to free the slot
            self._cond.notify_all()
        return ticket

    def stats(self) -> SchedulerStats:
        """A snapshot of the counters and gauges (SchedulerStats)."""
        with self._cond:
            snapshot = self._stats.copy()
            snapshot.queued, snapshot.running = len(self._waiting), self._occupied()
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
                for ticket in [t for batch in self._open for t in batch.running.values()]:
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
            self._queue_changed = True
            self._cond.notify_all()

    def _occupied(self) -> int:
        return sum(len(batch.running) for batch in self._open)

    def _work(self) -> None:
        while True:
            with self._cond:
                self._sweep()
                if self._closing and not self._waiting and not self._occupied():
                    break
                if not self._occupied() and not self._waiting:
                    self._close_batches(list(self._open))
                    self._cond.wait()  # nothing waits or runs: a submit or close() wakes the worker
                    continue
                admissions = self._admissions()
            self._admit(admissions)
            with self._cond:
                busy = [batch for batch in self._open if batch.running or batch.leaving]
            if not busy:
                continue
            batch = min(busy, key=self._oldest)  # the batch holding the longest-waiting image runs next
            try:
                self._round(batch)
            except Exception as exc:  # a bug, not a request's mistake: fail what it runs, log, keep serving
                LOG.exception("a scheduler round failed")
                with self._cond:
                    for ticket in list(batch.running.values()):
                        self._fail(ticket, exc, "failed")
                    batch.running.clear()
                    self._close_batches([batch])
        with self._cond:
            self._close_batches(list(self._open))

    @staticmethod
    def _oldest(batch: "OpenBatch") -> float:
        """When the longest-waiting image in `batch` was submitted (-inf for a batch with only slots
        to release: its round is free)."""
        return min((ticket.submitted for ticket in batch.running.values()), default=float("-inf"))

    def _sweep(self) -> None:
        """Waiting requests that were cancelled, expired or closed out leave the queue; running ones
        that were cancelled or expired leave their batches' slots (released before its next round)."""
        now = time.monotonic()
        if self._queue_changed or self._closing or (self._next_deadline is not None and now >= self._next_deadline):
            self._sweep_waiting(now)
        for batch in self._open:
            for slot, ticket in list(batch.running.items()):
                if ticket.future.done():
                    self._stats.cancelled += ticket.future.cancelled()
                elif self._cancel_running:
                    self._fail(ticket, RequestCancelled("the scheduler closed and cancelled this request"), "cancelled")
                elif ticket.request.deadline is not None and now >= ticket.request.deadline:
                    self._fail(ticket, DeadlineExceeded("the request's deadline passed before its image was finished"),
                               "expired")
                else:
                    continue
                batch.leaving.append(slot)
                del batch.running[slot]

    def _sweep_waiting(self, now: float) -> None:
        """The waiting requests that were cancelled, expired or closed out leave the queue."""
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
        deadlines = [t.request.deadline for t in kept if t.request.deadline is not None]
        self._next_deadline = min(deadlines) if deadlines else None
        self._queue_changed = False  # after the futures this sweep ended, whose callbacks set it

    def _batches_allowed(self) -> int:
        """Batches that may be open at once: `groups`, or 1 where the pipeline cannot make siblings,
        or as many as fitted in memory when one more did not."""
        return min(self.groups, self._memory_batches) if self._shares_model else 1

    def _admissions(self) -> dict[tuple, list[Ticket]]:
        """The waiting requests that enter a batch before the next round, by group (they leave the
        queue), by the rules of the module docstring. A group with no open batch gets one (a new one,
        or in place of an empty one: that one is closed here, and the group's batch is opened by
        _admit)."""
        limit = self.max_group_wait if self.max_group_wait is not None else self._image_seconds
        now = time.monotonic()
        room = {batch.group: self.slots - len(batch.running) for batch in self._open}
        empty = [batch for batch in self._open if not batch.running and not batch.leaving]
        openable = self._batches_allowed() - len(self._open)
        admitted: dict[tuple, list[Ticket]] = {}
        for ticket in self._waiting:
            if openable <= 0 and not empty and not any(room.values()):  # every batch full, none to open
                break
            group = ticket.request.group
            if group not in room:
                spare = [batch for batch in empty if batch.group not in admitted]
                if openable <= 0 and not spare:  # no batch for it yet: the open ones go on admitting until
                    if limit is not None and now - ticket.submitted > limit:  # it has waited an image's time
                        break
                    continue
                if openable > 0:
                    openable -= 1
                else:
                    self._close_batches([spare[0]])
                    empty.remove(spare[0])
                    del room[spare[0].group]
                room[group] = self.slots
            if room[group] > 0:
                admitted.setdefault(group, []).append(ticket)
                room[group] -= 1
        for tickets in admitted.values():
            for ticket in tickets:
                self._waiting.remove(ticket)
        return admitted

    def _admit(self, admissions: dict[tuple, list[Ticket]]) -> None:
        """Outside the lock: open the batches new groups need, and admit each group's requests
        into free slots of its batch (their conditions prepared now). A failure that is not a
        request's mistake (those fail their own ticket) fails its group's requests only."""
        for group, tickets in admissions.items():
            try:
                self._admit_group(group, tickets)
            except Exception as exc:  # a bug: the group's requests end with it, the others are served
                LOG.exception("a scheduler admission failed")
                with self._cond:
                    for ticket in tickets:
                        self._fail(ticket, exc, "failed")

    def _admit_group(self, group: tuple, tickets: list[Ticket]) -> None:
        """`group`'s admitted requests into free slots of its batch (opened when it has none)."""
        batch = next((b for b in self._open if b.group == group), None)
        if batch is None:
            batch = self._open_batch(group, tickets)
            if batch is None:
                return
        batch.release_leaving()  # a freed slot is released before another request takes it
        entering = []
        for ticket in tickets:
            if ticket.future.done():  # cancelled on its way in
                self._stats.cancelled += ticket.future.cancelled()
                continue
            entering.append(ticket)
        slots = batch.batch.free()[:len(entering)]
        refused = batch.batch.admit_all([(slot, ticket.request) for slot, ticket in zip(slots, entering)])
        with self._cond:
            now = time.monotonic()
            for slot, ticket in zip(slots, entering):
                if slot in refused:
                    self._fail(ticket, refused[slot], "failed")
                    continue
                ticket.admitted = now
                batch.running[slot] = ticket

    def _open_batch(self, group: tuple, tickets: list[Ticket]) -> Optional["OpenBatch"]:
        """A batch for `group` on a pipeline no open batch uses (a sibling made when none is free), or
        None: when the model refuses the group (its requests fail with the model's error), or when no
        further batch can open — the runners cannot share their model, or its buffers do not fit
        (its requests go back to the queue's front)."""
        in_use = {id(batch.pipeline) for batch in self._open}
        pipeline = next((p for p in self._pipelines if id(p) not in in_use), None)
        if pipeline is None:
            pipeline = self.pipeline.sibling()
            if pipeline is None:  # its runners cannot share the model: one batch at a time from now on
                with self._cond:
                    self._shares_model = False
                    self._waiting.extendleft(reversed(tickets))
                return None
            self._pipelines.append(pipeline)
        try:
            slots = open_batch(pipeline, tickets[0].request, self.slots, self.inflight)
        except SpecrtError as exc:
            with self._cond:
                for ticket in tickets:
                    self._fail(ticket, exc, "failed")
            return None
        except Exception as exc:
            if not self._open or not out_of_memory(exc):  # the first batch not fitting is the model's error
                raise
            # one more batch's buffers do not fit beside the open ones: as many batches as are open
            # from now on, the sibling's buffers dropped, the tickets back at the queue's front
            LOG.warning("another group's batch does not fit in memory (%s): %d batches from now on",
                        str(exc).splitlines()[0][:200], len(self._open))
            if pipeline is not self.pipeline:
                self._pipelines.remove(pipeline)
            with self._cond:
                self._memory_batches = len(self._open)
                self._waiting.extendleft(reversed(tickets))
            return None
        batch = OpenBatch(group, slots, pipeline)
        with self._cond:
            self._open.append(batch)
        return batch

    def _round(self, batch: "OpenBatch") -> None:
        """Outside the lock: free `batch`'s leaving slots, run one round of it, deliver what finished."""
        batch.release_leaving()
        if not batch.running:
            return
        report = batch.batch.round()
        with self._cond:
            self._stats.rounds += 1
            self._stats.slot_rounds += len(batch.running)
            self._deliver(batch, report)

    def _deliver(self, batch: "OpenBatch", report: RoundReport) -> None:
        now = time.monotonic()
        for slot, value in report.finished.items():
            ticket = batch.running.pop(slot, None)
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

    def _close_batches(self, batches: list["OpenBatch"]) -> None:
        """These batches end (their images have left): what they held on their pipelines is given back."""
        for batch in batches:
            batch.batch.close()
            self._open.remove(batch)


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that did not fit: numpy's MemoryError, torch's
    OutOfMemoryError (CUDA), onnxruntime's "Failed to allocate memory" (its own exception type)."""
    text = str(error).lower()
    return (isinstance(error, MemoryError) or "outofmemory" in type(error).__name__.lower()
            or "out of memory" in text or "failed to allocate memory" in text)


@dataclass(eq=False)
class OpenBatch:
    """One group's batch: its slots on one of the scheduler's pipelines, the tickets in them, and
    the slots whose requests left between rounds (released before the batch's next round)."""

    group: tuple
    batch: SlotBatch
    pipeline: Any
    running: dict[int, Ticket] = field(default_factory=dict)
    leaving: list[int] = field(default_factory=list)

    def release_leaving(self) -> None:
        """Free the slots whose requests left (cancelled, expired) in the batch, before its next
        admission or round."""
        for slot in self.leaving:
            self.batch.release(slot)
        self.leaving.clear()
