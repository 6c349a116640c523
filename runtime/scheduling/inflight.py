"""In-flight batches on the host loop: a slot is refilled between two target passes.

An InflightBatch holds a discrete pipeline's runners for as long as it has images (Pipeline.hold:
a direct generate call waits), allocated once for `slots` images with the group's
guidance matrix. Its rounds are the method's own (slot_rounds.py); an admitted request's condition
is prepared (a prompt through the text encoder or the model's recipe) and prefilled into its slot's
rows alone, and a finished image is decoded by the VQ decoder on its own, so its pixels are those
of generate([its condition], seed=its seed). Where the pipeline decodes with the device round, the
slots are that round's fixed buffers (round_slots.py: every method with a round refills in flight,
no re-capture). What has no step-wise form (the host loop's trees, an EAGLE head on the host loop)
gets None here and runs as whole calls (batches.WholeCalls).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Optional

import numpy as np

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
        start = time.perf_counter()
        if request.class_id is not None:
            conditions = self.pipeline.conditions(class_ids=[request.class_id])
        else:
            conditions = self.pipeline.conditions(prompts=[request.prompt], **request.prompt_options)
        self.rounds.admit(slot, conditions, request.seed)
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
            if self.rounds.done(slot):
                result = self._result(slot)
                report.finished[slot] = result
                report.tokens += result.stats.tokens
                report.target_forwards += result.stats.target_forwards
                report.accepted_lengths.update(result.stats.accepted_lengths)
        for slot in report.finished:
            self.release(slot)
        return report

    def _result(self, slot: int) -> GenerationResult:
        """The finished image in `slot` as generate gives one image."""
        request = self.occupied[slot]
        stream = np.asarray([self.rounds.tokens[slot]], dtype=np.int64)
        stats = Stats(tokens=int(stream.size), target_forwards=self._forwards[slot],
                      accepted_lengths=Counter(self._accepted[slot]))
        grids = self.pipeline.grids(stream)
        images = None
        if request.decode:
            with stats.timing("vq_decode"):
                images = to_uint8(self.pipeline.vq.decode(grids))
        stats.seconds["total"] = time.perf_counter() - self._started[slot]
        grammar = self.pipeline.grammar
        return GenerationResult(grids, images, stats, self.sampling, stream if grammar is not None else None)

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
