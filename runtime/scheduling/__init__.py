"""In-flight batching without a server: submit image requests, get futures, cancel them.

    from specrt.runtime.scheduling import Request, Scheduler

    with Scheduler(pipeline, slots=8, max_queue=64) as scheduler:     # one worker thread
        ticket = scheduler.submit(Request(class_id=207, method="sjd", params={"window": 16}, seed=3,
                                          deadline=time.monotonic() + 30))
        result = ticket.result()        # or `await ticket`; ticket.cancel() frees its slot
        result.images[0], result.tokens[0], result.stats   # generate([207], method="sjd", seed=3, window=16)'s
        scheduler.stats()               # SchedulerStats: queue depth, occupancy, tokens, latencies

The API (names as the code has them):
- Scheduler(pipeline, *, slots, max_queue, groups=4, max_group_wait=None, inflight=True): any family's pipeline
  (Pipeline.from_bundle / from_torch / an embedded demo's). `.submit(Request) -> Ticket` raises at
  once QueueFull when max_queue requests wait, SchedulerClosed after close, SpecrtError for a request
  the model refuses; `.close(timeout=30.0, cancel_running=False)`; `.stats() -> SchedulerStats`;
  a context manager (closes on exit).
- Request(class_id | prompt, method="ar", params={...method parameters and sampling keys...}, seed=0,
  decode=True, negative_prompt=None, prompt_suffix=None, deadline=None): `deadline` is a
  time.monotonic() instant. (Named Request, not ImageRequest: runtime/serving/protocol.py's
  ImageRequest is a wire row; Request is what the scheduler takes.)
- Ticket: `.future` (concurrent.futures.Future -> the result type of the pipeline's generate, for
  this one image), `.result(timeout)`, `.cancel()`, `.done()`, `await ticket`.
- Errors, all SpecrtError subclasses: QueueFull, DeadlineExceeded, RequestCancelled, SchedulerClosed.
- SchedulerStats: queued, running, slots, submitted, refused, completed, failed, cancelled, expired,
  closed, rounds, slot_rounds, tokens, target_forwards, accepted_lengths, latency_buckets /
  latency_counts (cumulative) / latency_sum, and mean_accepted_length, occupancy.

The grouping rule and the fault semantics are scheduler.py's docstring; which batches run round by
round (in-flight) and which as whole calls is batches.py's.
"""
from specrt.runtime.scheduling.requests import (DeadlineExceeded, QueueFull, Request, RequestCancelled,
                                                SchedulerClosed, Ticket)
from specrt.runtime.scheduling.scheduler import Scheduler
from specrt.runtime.scheduling.stats import LATENCY_BUCKETS, SchedulerStats

__all__ = ["DeadlineExceeded", "LATENCY_BUCKETS", "QueueFull", "Request", "RequestCancelled", "Scheduler",
           "SchedulerClosed", "SchedulerStats", "Ticket"]
