"""The slots a scheduler fills: one group's requests decoding together on a pipeline, a round at a time.

A SlotBatch has a fixed number of slots. The scheduler admits a request into a free slot, runs
rounds, and takes finished images out after each; a cancelled or expired request is released from
its slot between rounds. Three kinds:

- InflightBatch (runtime/scheduling/inflight.py): the host loop's own rounds (one target pass for
  every occupied slot), or the device round's over its fixed buffers (round_slots.py), so a request
  enters or leaves between two passes and the batch stays full.
- WholeCalls (here): one generate call over the requests admitted before it, as a dynamic batcher
  runs them; the fallback for what has no step-wise form yet (the host loop's trees and EAGLE
  drafters). Its "round" is a whole call: requests enter only between calls.
- ContinuousSlots and ContinuousRoundBatch (runtime/scheduling/continuous_slots.py): InflightBatch's
  forms for the continuous family's ar and cspd, on the host loop and in the device round's fixed
  buffers (continuous_round_slots.py).

Either way an image is the one its request gives alone: every random number a counter uniform of
its own seed and the draw's coordinates (runtime/counter_random.py).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.scheduling.requests import Request


@dataclass
class RoundReport:
    """What one round did: finished[slot] is that slot's result (it has left its slot) or the
    exception its request ends with; the tokens, target forwards and accepted lengths of the
    images finished in it (what metrics count)."""

    finished: dict[int, Any] = field(default_factory=dict)
    tokens: int = 0
    target_forwards: int = 0
    accepted_lengths: Counter = field(default_factory=Counter)


class SlotBatch(ABC):
    """A fixed number of slots decoding requests of one group (Request.group) on one pipeline."""

    def __init__(self, slots: int):
        self.slots = slots
        self.occupied: dict[int, Request] = {}

    def free(self) -> list[int]:
        return [slot for slot in range(self.slots) if slot not in self.occupied]

    def admit(self, slot: int, request: Request) -> None:
        """Take `request` into the free `slot` (its conditioning prepared now, where the batch can)."""
        if slot in self.occupied:
            raise ValueError(f"slot {slot} is occupied")
        self.occupied[slot] = request
        self._admit(slot, request)

    def admit_all(self, entries: Sequence[tuple[int, Request]]) -> dict[int, SpecrtError]:
        """Take each (free slot, request) in; the errors of those the model refused, by slot (their
        slots left free). One by one here; together where the batch can (InflightBatch: one prefill
        for the requests admitted between two rounds)."""
        refused: dict[int, SpecrtError] = {}
        for slot, request in entries:
            try:
                self.admit(slot, request)
            except SpecrtError as exc:
                self.release(slot)
                refused[slot] = exc
        return refused

    def release(self, slot: int) -> None:
        """The request in `slot` leaves before it finished (cancelled, expired); the slot is free."""
        self.occupied.pop(slot, None)
        self._release(slot)

    @abstractmethod
    def _admit(self, slot: int, request: Request) -> None: ...

    def _release(self, slot: int) -> None:
        pass

    @abstractmethod
    def round(self) -> RoundReport:
        """Advance every occupied slot by one round; finished images leave their slots."""

    def close(self) -> None:
        """The batch ends (no slot occupied): what it held on the pipeline is given back."""


def one_image(result: Any, index: int, count: int) -> Any:
    """Image `index` of a generate result over `count` images, in the same result type: every
    per-image field (arrays and lists with `count` entries) narrowed to that image; the rest
    (stats, sampling) shared."""
    narrowed = {}
    for item in fields(result):
        value = getattr(result, item.name)
        if isinstance(value, np.ndarray) and value.ndim and len(value) == count:
            narrowed[item.name] = value[index:index + 1]
        elif isinstance(value, list) and len(value) == count:
            narrowed[item.name] = value[index:index + 1]
    return replace(result, **narrowed)


def generate_call(pipeline: Any, requests: list[Request]) -> Any:
    """One generate call for requests of one group, each image with its own condition and seed."""
    first = requests[0]
    condition: dict[str, Any] = ({"class_ids": [r.class_id for r in requests]} if first.class_id is not None
                                 else {"prompts": [r.prompt for r in requests]})
    return pipeline.generate(**condition, method=first.method, seed=[r.seed for r in requests], decode=first.decode,
                             **first.prompt_options, **first.params)


class WholeCalls(SlotBatch):
    """Each round is one generate call over every occupied slot (the dynamic batcher's way)."""

    def __init__(self, pipeline: Any, slots: int):
        super().__init__(slots)
        self.pipeline = pipeline

    def _admit(self, slot: int, request: Request) -> None:
        pass

    def round(self) -> RoundReport:
        slots = sorted(self.occupied)
        requests = [self.occupied[slot] for slot in slots]
        report = RoundReport()
        if not requests:
            return report
        start = time.perf_counter()
        try:
            result = generate_call(self.pipeline, requests)
        except SpecrtError as exc:
            report.finished = dict.fromkeys(slots, exc)
        else:
            stats = result.stats
            seconds = getattr(stats, "seconds", None)  # the continuous family's counters keep no timings
            if seconds is not None:
                seconds.setdefault("total", time.perf_counter() - start)
            report.finished = {slot: one_image(result, i, len(slots)) for i, slot in enumerate(slots)}
            report.tokens = int(getattr(stats, "tokens", 0))
            report.target_forwards = int(getattr(stats, "target_forwards", 0))
            report.accepted_lengths.update(getattr(stats, "accepted_lengths", Counter()))
        self.occupied.clear()
        return report


def open_batch(pipeline: Any, request: Request, slots: int, inflight: bool = True) -> SlotBatch:
    """The batch for `request`'s group: in-flight rounds where the pipeline's loop (host or device
    round) has a step-wise form for its method (runtime/scheduling/inflight.py; the continuous
    family's, continuous_slots.py), else whole calls."""
    if inflight:
        from specrt.runtime.scheduling.continuous_slots import continuous_batch
        from specrt.runtime.scheduling.inflight import inflight_batch

        for step_wise in (inflight_batch, continuous_batch):
            batch: Optional[SlotBatch] = step_wise(pipeline, request, slots)
            if batch is not None:
                return batch
    return WholeCalls(pipeline, slots)
