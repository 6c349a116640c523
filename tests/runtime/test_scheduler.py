"""The scheduler (runtime/scheduling) on the demo bundle: in-flight images equal the same requests
run alone, slots refill, and the refusals (queue full, deadline, cancel, close) each end a request
once, with its own error, and never with another request's image."""
from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import CancelledError

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.runtime.decoding import Decoding
from specrt.runtime.scheduling import (DeadlineExceeded, QueueFull, Request, RequestCancelled, Scheduler,
                                       SchedulerClosed)
from specrt.runtime.scheduling.inflight import InflightBatch

# (method, params): every host-loop method with a step-wise form, with parameters that make rounds ragged
METHODS = [("ar", {}), ("sd", {}), ("cool-sd", {"relaxation_budget": 2.0}), ("lantern", {"tvd_budget": 0.2}),
           ("sjd", {"window": 4}), ("sjd-pac", {"window": 8})]


@pytest.fixture(scope="module")
def alone(ort_pipe):
    """Tokens of a request run alone (generate of its one image), computed once per request."""
    cache: dict = {}

    def tokens(request: Request) -> np.ndarray:
        key = (request.class_id, request.seed, request.method, request.group)
        if key not in cache:
            cache[key] = ort_pipe.generate([request.class_id], method=request.method, seed=request.seed,
                                           decode=False, **request.params).tokens[0]
        return cache[key]
    return tokens


def wait_for(condition, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.002)


def mixed_load(count: int = 3) -> list[Request]:
    """`count` requests of every method, interleaved, each with its own class and seed."""
    return [Request(class_id=(3 * m + i) % 10, seed=1000 + 10 * m + i, method=method, params=params, decode=False)
            for i in range(count) for m, (method, params) in enumerate(METHODS)]


def flips(scheduler: Scheduler, requests: list[Request], alone) -> int:
    """How many of these requests, submitted at once, come back with tokens other than alone."""
    tickets = [scheduler.submit(r) for r in requests]
    return sum(not np.array_equal(t.result(timeout=120).tokens[0], alone(r)) for t, r in zip(tickets, requests))


def test_mixed_load_gives_each_request_its_image_alone(ort_pipe, alone):
    """Six methods' requests interleaved in two slots: each group runs in-flight (more requests than
    slots, so images enter mid-batch beside others), and every image equals its request alone. A
    float tie at a CDF boundary may flip a token between batch shapes: allowed once in 18."""
    requests = mixed_load()
    with Scheduler(ort_pipe, slots=2, max_queue=len(requests)) as scheduler:
        changed = flips(scheduler, requests, alone)
        stats = scheduler.stats()
    assert changed <= 1
    assert stats.completed == len(requests) and stats.failed == 0
    assert stats.rounds > 3 * len(requests)  # round by round, not a generate call per group
    assert 0 < stats.mean_accepted_length and sum(stats.accepted_lengths.values()) == stats.target_forwards


def test_draws_keyed_by_slot_are_caught(ort_pipe, alone, monkeypatch):
    """The planted bug: a slot's draws keyed by its batch position as well as its seed. The
    comparison above must see it (the control for that test)."""
    reseed = Decoding.reseed
    monkeypatch.setattr(Decoding, "reseed", lambda self, position, seed: reseed(self, position, seed + position))
    requests = [Request(class_id=c, seed=50 + c, method="sd", decode=False) for c in range(4)]
    with Scheduler(ort_pipe, slots=4, max_queue=4) as scheduler:
        assert flips(scheduler, requests, alone) >= 2


def test_slots_refill_while_requests_wait(ort_pipe, monkeypatch):
    """Whenever a request waits, every slot holds an image in the round that runs."""
    seen: list[tuple[int, int]] = []
    scheduler = Scheduler(ort_pipe, slots=2, max_queue=8)
    rounds = InflightBatch.round

    def watched(self):
        seen.append((len(self.occupied), len(scheduler._waiting)))
        return rounds(self)
    monkeypatch.setattr(InflightBatch, "round", watched)
    with scheduler:
        with scheduler._cond:  # all queued before the worker admits one: none arrives between admission and round
            tickets = [scheduler.submit(Request(class_id=c, seed=c, method="sd", decode=False)) for c in range(6)]
        for ticket in tickets:
            ticket.result(timeout=60)
        stats = scheduler.stats()
    assert len(seen) == stats.rounds > 0
    assert all(occupied == 2 for occupied, waiting in seen if waiting)
    assert stats.slot_rounds == sum(occupied for occupied, _ in seen)


def test_queue_full_refuses_at_once(ort_pipe):
    """With the worker held up, submits beyond max_queue waiting requests raise QueueFull at once."""
    with Scheduler(ort_pipe, slots=1, max_queue=2) as scheduler:
        accepted = []
        ort_pipe.hold()  # the worker cannot open a batch: requests stay queued
        try:
            with pytest.raises(QueueFull, match="queue is full") as refused:
                for c in range(4):
                    start = time.monotonic()
                    accepted.append(scheduler.submit(Request(class_id=c, method="sd", decode=False)))
            assert time.monotonic() - start < 0.05
        finally:
            ort_pipe.let_go()
        assert isinstance(refused.value, SpecrtError)
        assert 2 <= len(accepted) <= 3
        assert all(t.result(timeout=60).tokens.shape == (1, 8, 8) for t in accepted)
        assert scheduler.stats().refused == 1


def test_cancel_frees_the_slot(ort_pipe, alone):
    """A running request cancelled leaves its slot at the next round: the waiting one gets it, long
    before the cancelled image would have finished."""
    with Scheduler(ort_pipe, slots=1, max_queue=4) as scheduler:
        first = scheduler.submit(Request(class_id=1, seed=7, decode=False))
        second = scheduler.submit(Request(class_id=2, seed=8, decode=False))
        wait_for(lambda: scheduler.stats().rounds >= 2)
        assert first.cancel()
        result = second.result(timeout=60)
        stats = scheduler.stats()
    assert first.future.cancelled()
    with pytest.raises(CancelledError):
        first.result()
    np.testing.assert_array_equal(result.tokens[0], alone(Request(class_id=2, seed=8, decode=False)))
    assert stats.cancelled == 1 and stats.completed == 1
    assert stats.rounds < 2 * 63  # the cancelled image's remaining rounds were not run


def test_deadlines_end_requests_with_their_error(ort_pipe):
    """A deadline passed while waiting or while running ends the request with DeadlineExceeded;
    the request without one completes."""
    with Scheduler(ort_pipe, slots=1, max_queue=4) as scheduler:
        running = scheduler.submit(Request(class_id=1, decode=False, deadline=time.monotonic() + 0.01))  # < one image's 64 steps
        waiting = scheduler.submit(Request(class_id=2, decode=False, deadline=time.monotonic() + 0.01))
        free = scheduler.submit(Request(class_id=3, decode=False))
        for ticket in (running, waiting):
            with pytest.raises(DeadlineExceeded, match="deadline passed"):
                ticket.result(timeout=60)
        assert free.result(timeout=60).tokens.shape == (1, 8, 8)
        assert scheduler.stats().expired == 2


def test_close_cancels_or_finishes_with_clear_errors(ort_pipe):
    """close(cancel_running=True): the running request ends with RequestCancelled, the waiting one
    with SchedulerClosed, and submit refuses; close() without it lets the running image finish."""
    scheduler = Scheduler(ort_pipe, slots=1, max_queue=4)
    running, waiting = (scheduler.submit(Request(class_id=c, decode=False)) for c in (1, 2))
    wait_for(lambda: scheduler.stats().rounds >= 1)
    scheduler.close(timeout=30, cancel_running=True)
    with pytest.raises(RequestCancelled):
        running.result(timeout=1)
    with pytest.raises(SchedulerClosed):
        waiting.result(timeout=1)
    with pytest.raises(SchedulerClosed):
        scheduler.submit(Request(class_id=3))

    scheduler = Scheduler(ort_pipe, slots=1, max_queue=4)
    running, waiting = (scheduler.submit(Request(class_id=c, decode=False)) for c in (1, 2))
    wait_for(lambda: scheduler.stats().rounds >= 1)
    scheduler.close(timeout=30)
    assert running.result(timeout=1).tokens.shape == (1, 8, 8)
    with pytest.raises(SchedulerClosed):
        waiting.result(timeout=1)


def test_bad_requests_are_refused_at_submit(ort_pipe):
    with Scheduler(ort_pipe, slots=1, max_queue=2) as scheduler:
        for bad in (Request(class_id=99), Request(class_id=1, method="nope"), Request(prompt="a cat"),
                    Request(class_id=1, method="sd", params={"draft_len": 0})):
            with pytest.raises(SpecrtError):
                scheduler.submit(bad)
        assert scheduler.stats().submitted == 0
    with pytest.raises(SpecrtError):
        Request(class_id=1, prompt="both")


def test_whole_calls_and_awaiting(ort_pipe, alone):
    """inflight=False decodes each batch as one generate call (the same images); `await ticket`
    works, and cancelling the awaiting task cancels the request."""
    requests = [Request(class_id=c, seed=c, method="sd", decode=False) for c in range(3)]
    with Scheduler(ort_pipe, slots=3, max_queue=3, inflight=False) as scheduler:
        with scheduler._cond:  # the worker admits nothing until all three wait: one call, however busy the CPU
            tickets = [scheduler.submit(r) for r in requests]
        for ticket, request in zip(tickets, requests):
            np.testing.assert_array_equal(ticket.result(timeout=120).tokens[0], alone(request))
        assert scheduler.stats().rounds == 1

    async def main(scheduler: Scheduler) -> tuple:
        done = await scheduler.submit(requests[0])
        task = asyncio.ensure_future(scheduler.submit(Request(class_id=5, decode=False)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return done

    with Scheduler(ort_pipe, slots=1, max_queue=2) as scheduler:
        result = asyncio.run(main(scheduler))
        wait_for(lambda: scheduler.stats().cancelled == 1)
    np.testing.assert_array_equal(result.tokens[0], alone(requests[0]))


def test_stress_every_request_ends_once_with_its_own_image(ort_pipe, alone):
    """Two clients submit 30 requests (4 distinct images) with random cancels and deadlines into a
    small queue: each ticket ends exactly once; every image delivered is its own request's; the
    counters add up."""
    pool = [Request(class_id=c, seed=s, method="sd", decode=False) for c, s in ((1, 1), (2, 2), (3, 3), (1, 4))]
    ended: dict[int, int] = {}
    tickets, refused = [], []
    lock = threading.Lock()

    def client(seed: int, scheduler: Scheduler) -> None:
        rng = random.Random(seed)
        for _ in range(15):
            base = rng.choice(pool)
            deadline = time.monotonic() + rng.uniform(0.0, 0.3) if rng.random() < 0.2 else None
            request = Request(class_id=base.class_id, seed=base.seed, method="sd", decode=False, deadline=deadline)
            try:
                ticket = scheduler.submit(request)
            except QueueFull:
                refused.append(request)
                time.sleep(0.02)
                continue
            ticket.future.add_done_callback(lambda f, k=id(ticket): ended.__setitem__(k, ended.get(k, 0) + 1))
            with lock:
                tickets.append(ticket)
            if rng.random() < 0.2:
                time.sleep(rng.uniform(0.0, 0.05))
                ticket.cancel()

    with Scheduler(ort_pipe, slots=3, max_queue=6) as scheduler:
        clients = [threading.Thread(target=client, args=(seed, scheduler)) for seed in (0, 1)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(timeout=120)
        for ticket in tickets:
            try:
                result = ticket.result(timeout=120)
            except (CancelledError, DeadlineExceeded):
                continue
            np.testing.assert_array_equal(result.tokens[0], alone(ticket.request))
        wait_for(lambda: scheduler.stats().queued == 0 and scheduler.stats().running == 0)
        stats = scheduler.stats()
    assert all(ticket.done() for ticket in tickets)
    assert sorted(ended.values()) == [1] * len(tickets)
    assert stats.submitted == len(tickets) and stats.refused == len(refused)
    assert stats.completed + stats.cancelled + stats.expired == stats.submitted
    assert stats.completed >= len(tickets) // 2
