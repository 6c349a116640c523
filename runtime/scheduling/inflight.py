"""In-flight batches on the host loop: a slot is refilled between two target passes.

An InflightBatch holds a discrete pipeline's runners for as long as it has images (Pipeline.hold:
a direct generate call waits), allocated once for `slots` images with the group's
guidance matrix. Its rounds are the method's own (slot_rounds.py); an admitted request's condition
is prepared on its own (a prompt through the text encoder or the model's recipe), and the requests
admitted between two rounds are prefilled together into their slots' rows (the other images' rows
untouched); the images finished in a round are decoded by the VQ decoder together. A prefill or a
decode of several images costs little more than one of one, and every row of either depends on its
own image alone, so an image's tokens and pixels are those of generate([its condition],
seed=its seed). Where the pipeline decodes with the device round, the slots are that round's fixed
buffers (round_slots.py: every method with a round refills in flight, no re-capture). What has no
step-wise form (the host loop's trees, an EAGLE head on the host loop) gets None here and runs as
whole calls (batches.WholeCalls).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.conditions import Conditions
from specrt.runtime.decoding import Decoding
from specrt.runtime.pipeline import GenerationResult, Pipeline, to_uint8
from specrt.runtime.sampling import guidance_mix
from specrt.runtime.scheduling.batches import RoundReport, SlotBatch
from specrt.runtime.scheduling.requests import Request
from specrt.runtime.scheduling.round_slots import round_slots
from specrt.runtime.scheduling.slot_rounds import SlotRounds, slot_rounds
from specrt.runtime.stats import Stats


class InflightBatch(SlotBatch):
    """One group's images on a discrete pipeline's host loop, entering and leaving between rounds."""

    def __init__(self, pipeline: Pipeline, rounds: SlotRounds, sampling: Any):
        super().__init__(rounds.slots)
        self.pipeline, self.rounds, self.sampling = pipeline, rounds, sampling
        self._forwards: dict[int, int] = {}
        self._accepted: dict[int, Counter] = {}
        self._started: dict[int, float] = {}

    def _admit(self, slot: int, request: Request) -> None:
        self._enter([(slot, request, self._conditions(request))], time.perf_counter())

    def admit_all(self, entries: Sequence[tuple[int, Request]]) -> dict[int, SpecrtError]:
        """Every request's condition prepared on its own, once (a refused one fails alone), then one
        admission of them all (SlotRounds.admit_all: one prefill); should the model refuse that, one
        at a time with the same conditions, so only the request at fault is refused."""
        start = time.perf_counter()
        refused: dict[int, SpecrtError] = {}
        ready: list[tuple[int, Request, Conditions]] = []
        for slot, request in entries:
            if slot in self.occupied:
                raise ValueError(f"slot {slot} is occupied")
            try:
                ready.append((slot, request, self._conditions(request)))
            except SpecrtError as exc:
                refused[slot] = exc
        if len(ready) > 1:
            try:
                self._enter(ready, start)
                return refused
            except SpecrtError:
                pass
        for entry in ready:
            try:
                self._enter([entry], start)
            except SpecrtError as exc:
                refused[entry[0]] = exc
        return refused

    def _conditions(self, request: Request) -> Conditions:
        """The request's one image's condition (a prompt through the text encoder or the model's recipe)."""
        if request.class_id is not None:
            return self.pipeline.conditions(class_ids=[request.class_id])
        return self.pipeline.conditions(prompts=[request.prompt], **request.prompt_options)

    def _enter(self, ready: list[tuple[int, Request, Conditions]], start: float) -> None:
        """These (slot, request, condition)s into their free slots with one admission (one prefill),
        and their images' counters (the prefill is each one's first forward); a refusal raises and
        leaves every one of the slots free."""
        self.rounds.admit_all([slot for slot, _, _ in ready], Conditions.concatenated([c for _, _, c in ready]),
                              [request.seed for _, request, _ in ready])
        for slot, request, _ in ready:
            self.occupied[slot] = request
            self._forwards[slot], self._accepted[slot], self._started[slot] = 1, Counter({1: 1}), start

    def _release(self, slot: int) -> None:
        self.rounds.release(slot)

    def round(self) -> RoundReport:
        before = {slot: len(self.rounds.tokens[slot]) for slot in self.occupied}
        self.rounds.compact()
        self.rounds.round()
        report = RoundReport()
        for slot, length in before.items():
            self._forwards[slot] += 1
            self._accepted[slot][len(self.rounds.tokens[slot]) - length] += 1
        finished = [slot for slot in before if self.rounds.done(slot)]
        for slot, result in zip(finished, self._results(finished)):
            report.finished[slot] = result
            report.tokens += result.stats.tokens
            report.target_forwards += result.stats.target_forwards
            report.accepted_lengths.update(result.stats.accepted_lengths)
        for slot in report.finished:
            self.release(slot)
        return report

    def _results(self, slots: list[int]) -> list[GenerationResult]:
        """The images finished in `slots`, each as generate gives one image; those whose request
        asks for pixels decoded by the VQ decoder together (one call, each its share of the time)."""
        if not slots:
            return []
        streams = np.asarray([self.rounds.tokens[slot] for slot in slots], dtype=np.int64)
        grids = self.pipeline.grids(streams)
        decoded = [i for i, slot in enumerate(slots) if self.occupied[slot].decode]
        images: dict[int, np.ndarray] = {}
        decode_seconds = 0.0
        if decoded:
            start = time.perf_counter()
            pixels = to_uint8(self.pipeline.vq.decode(grids[decoded]))
            decode_seconds = (time.perf_counter() - start) / len(decoded)
            images = {i: pixels[k:k + 1] for k, i in enumerate(decoded)}
        grammar, now = self.pipeline.grammar, time.perf_counter()
        results = []
        for i, slot in enumerate(slots):
            stats = Stats(tokens=int(streams[i].size), target_forwards=self._forwards[slot],
                          accepted_lengths=Counter(self._accepted[slot]))
            if i in images:
                stats.seconds["vq_decode"] = decode_seconds
            stats.seconds["total"] = now - self._started[slot]
            results.append(GenerationResult(grids[i:i + 1], images.get(i), stats, self.sampling,
                                            streams[i:i + 1] if grammar is not None else None))
        return results

    def close(self) -> None:
        self.pipeline.let_go()


def inflight_batch(pipeline: Any, request: Request, slots: int) -> Optional[InflightBatch]:
    """The in-flight batch for `request`'s group on `pipeline`, or None where its method (with
    these parameters, on this loop) has no step-wise form; SpecrtError for a group the model refuses."""
    if not isinstance(pipeline, Pipeline):
        return None
    pipeline.hold()
    try:
        decoder, sampling = pipeline.prepared(request.method, dict(request.params))
        mix = guidance_mix(slots, sampling)
        rounds = round_slots(pipeline, decoder, sampling, mix, slots)  # the device round's fixed buffers, or None
        if rounds is None:
            draft = pipeline.draft if decoder.needs_draft else None
            for runner in (pipeline.target, draft):
                if runner is not None:
                    runner.allocate(mix)
                    runner.reset_counters()
            ctx = Decoding(pipeline.target, draft, sampling, [0] * slots, Stats(), pipeline.grammar)
            rounds = slot_rounds(decoder, ctx, slots)
    except BaseException:
        pipeline.let_go()
        raise
    if rounds is None:
        pipeline.let_go()
        return None
    return InflightBatch(pipeline, rounds, sampling)
