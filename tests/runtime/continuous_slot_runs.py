"""Driving the continuous family's device-round slots (runtime/scheduling/continuous_round_slots.py)
in a test, as the scheduler drives them: one admission a round at most, so requests arrive at
different rounds, beside images under way and into slots that finished or cancelled images left."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from slot_runs import HostReads
from specrt.runtime.scheduling.continuous_slots import ContinuousRoundBatch, continuous_batch
from specrt.runtime.scheduling.requests import Request


@dataclass
class Run:
    """What a run gave: each request's result (by its position in the queue; a cancelled one has
    none), the slot each entered, the rounds at which each entered, and the host reads counted at
    each admission ("admit") and round ("round")."""

    results: dict[int, Any] = field(default_factory=dict)
    slot: dict[int, int] = field(default_factory=dict)
    entered: dict[int, int] = field(default_factory=dict)
    reads: dict[str, list[int]] = field(default_factory=lambda: {"admit": [], "round": []})


def open_round_batch(pipe: Any, request: Request, slots: int) -> ContinuousRoundBatch:
    batch = continuous_batch(pipe, request, slots)
    assert isinstance(batch, ContinuousRoundBatch), type(batch)
    return batch


def run_in_flight(batch: ContinuousRoundBatch, queue: list[Request], cancel_after: Optional[dict[int, int]] = None,
                  admitted: Optional[Callable[[ContinuousRoundBatch], None]] = None) -> Run:
    """Decode `queue` in `batch`: before each round the oldest waiting request enters the first free
    slot (one a round). `cancel_after[i]`: request i leaves its slot unfinished after that many of
    its rounds. `admitted(batch)` runs after every admission. The batch is closed at the end."""
    run, waiting, owner, taken = Run(), list(enumerate(queue)), {}, {}
    cancel_after = cancel_after or {}
    try:
        while waiting or batch.occupied:
            if waiting and batch.free():
                index, request = waiting.pop(0)
                slot = run.slot[index] = batch.free()[0]
                run.entered[index], owner[slot], taken[index] = batch.rounds.runs, index, 0
                with HostReads() as meter:
                    batch.admit(slot, request)
                run.reads["admit"].append(len(meter.seen))
                if admitted is not None:
                    admitted(batch)
            with HostReads() as meter:
                report = batch.round()
            run.reads["round"].append(len(meter.seen))
            for slot, result in report.finished.items():
                run.results[owner.pop(slot)] = result
            for slot, index in list(owner.items()):
                taken[index] += 1
                if cancel_after.get(index) == taken[index]:
                    del owner[slot]
                    batch.release(slot)
            assert batch.rounds.runs <= 10 * len(queue) * batch.rounds.total, "images stopped advancing"
    finally:
        batch.close()
    return run


def alone(pipe: Any, request: Request) -> Any:
    """The request's result from a generate call of its one image (the same loop as the pipeline's)."""
    return pipe.generate([request.class_id], method=request.method, seed=request.seed, decode=False,
                         **request.params)


def counters(stats: Any) -> tuple:
    return stats.tokens, stats.target_forwards, stats.drafted, stats.accepted, stats.residual_proposals


def farthest(results: dict[int, Any], pipe: Any, queue: list[Request]) -> dict[int, float]:
    """Each finished request's largest token difference from its request alone."""
    return {i: float(np.abs(result.tokens - alone(pipe, queue[i]).tokens).max()) for i, result in results.items()}
