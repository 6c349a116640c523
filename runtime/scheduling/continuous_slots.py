"""In-flight batches of the continuous family (MAR-style models, ar and cspd) on the host loop.

Why: a generate call of a continuous model decodes its images to the end, so in a scheduler it ran
as whole calls (batches.WholeCalls) and a request arriving mid-call waited for the whole call. Here,
as InflightBatch does for discrete tokens, a batch keeps one ContinuousDecoding over `slots` images
for as long as it has images, its runners started once with the group's guidance (every slot's CFG
twin row included). A request enters a free slot between rounds: its class id goes into its rows and
its committed length to 0 (ContinuousRunner.admit: its old cache columns masked until its own commits
overwrite them), its random coordinates become its own seed at round 0 (ContinuousDecoding.reseed).
Its prefill — the class token at position 0 — is the window of its first round, run in its own rows
beside the other slots' windows. A finished image leaves at the end of its round; the images that
finish in one round are decoded by the tokenizer decoder in one call.

A round advances every occupied slot by one target pass, with the methods' own code over the
occupied slots (free ones sit it out: no window, nothing committed): ar's step (`target_alone`), or
one cspd draft-verify round (CSpD.draft_verify_round) in which a slot still in its token pre-filling
drafts nothing and takes the target's token from the same target pass, as its step alone would.

Sameness: every random number of an image is a counter uniform of its seed, its own round count and
the draw's coordinates (runtime/families/continuous/draws.py), and its rows attend only to its own
cache, so its tokens are those of generate([class], seed=its seed) up to float rounding: the batched
graphs sum over other shapes (more images, a wider masked cache), as in a generate call of several
images. Where the pipeline decodes with the device round (PyTorch on an accelerator, or loop "round"),
the slots are that round's fixed buffers instead (ContinuousRoundBatch over continuous_round_slots.py:
a slot refilled in place between rounds, no re-capture, one host read a round).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, NamedTuple, Optional

import numpy as np

from specrt.runtime.families.continuous.methods import (CSpD, ContinuousDecoding, ContinuousMethod, ContinuousStats,
                                                       target_alone)
from specrt.runtime.families.continuous.pipeline import ContinuousPipeline, ContinuousResult, to_pixels
from specrt.runtime.scheduling.batches import RoundReport, SlotBatch
from specrt.runtime.scheduling.continuous_round_slots import ContinuousRoundSlots
from specrt.runtime.scheduling.requests import Request


class FinishedImage(NamedTuple):
    """An image that finished in a round, before its pixels: its request, tokens [1, seq_len, C],
    counters and when it entered its slot."""

    request: Request
    tokens: np.ndarray
    stats: ContinuousStats
    started: float


class ContinuousBatch(SlotBatch):
    """What the continuous family's two slot batches share: the pipeline's lock held while the batch
    lives, and the images finishing in a round reported together (their pixels from one decoder call)."""

    def __init__(self, pipeline: ContinuousPipeline, sampling: dict[str, Any], slots: int):
        super().__init__(slots)
        self.pipeline, self.sampling = pipeline, sampling
        self.gains: dict[int, Counter] = {}  # tokens each target forward of the slot's image decided
        self.started: dict[int, float] = {}

    def _finished(self, slot: int) -> FinishedImage:
        raise NotImplementedError

    def _report(self, slots: list[int]) -> RoundReport:
        """The round's report over the images that finished in `slots` (finished_results), those slots released."""
        report = RoundReport()
        for slot, result in zip(slots, finished_results(self.pipeline, [self._finished(slot) for slot in slots],
                                                        self.sampling)):
            report.finished[slot] = result
            report.tokens += result.stats.tokens
            report.target_forwards += result.stats.target_forwards
            report.accepted_lengths.update(self.gains[slot])
        for slot in slots:
            self.release(slot)
        return report

    def close(self) -> None:
        self.pipeline.let_go()


class ContinuousSlots(ContinuousBatch):
    """One group's images on a continuous pipeline's host loop, entering and leaving between rounds.
    Holds the pipeline's lock while it has images (a direct generate call waits)."""

    def __init__(self, pipeline: ContinuousPipeline, method: ContinuousMethod, sampling: dict[str, Any], slots: int):
        super().__init__(pipeline, sampling, slots)
        self.method = method
        draft = pipeline.draft if method.needs_draft else None
        self.ctx = ContinuousDecoding(pipeline.target, draft, [0] * slots, **sampling)
        self.runners = [r for r in (pipeline.target, draft) if r is not None]
        for runner in self.runners:  # every slot free: class 0's rows at length 0, never stepped
            self.ctx.start(runner, np.zeros(slots, dtype=np.int64))
        spec = pipeline.target.spec
        self.total = spec.seq_len
        self.prefilled = method.prefilled(spec.seq_len)
        self.inputs = np.zeros((slots, spec.seq_len + 1, spec.token_dim), dtype=np.float32)  # [s, j + 1] = token j
        self.decided = np.zeros(slots, dtype=np.int64)
        self.drafted, self.accepted, self.proposals = (np.zeros(slots, dtype=np.int64) for _ in range(3))
        self.forwards = np.zeros(slots, dtype=np.int64)

    def _admit(self, slot: int, request: Request) -> None:
        for runner in self.runners:
            runner.admit(slot, request.class_id)
        self.ctx.reseed(slot, request.seed)
        self.inputs[slot] = 0.0
        for counter in (self.decided, self.drafted, self.accepted, self.proposals, self.forwards):
            counter[slot] = 0
        self.gains[slot], self.started[slot] = Counter(), time.perf_counter()

    def _release(self, slot: int) -> None:
        """A free slot keeps no cache columns: the other slots' masks stay as narrow as their own caches."""
        for runner in self.runners:
            runner.truncate(np.where(np.arange(self.slots) == slot, 0, runner.lengths))

    def round(self) -> RoundReport:
        live = np.array(sorted(self.occupied), dtype=np.int64)
        before = self.decided[live].copy()
        if not isinstance(self.method, CSpD):  # ar
            target_alone(self.ctx, self.inputs, self.decided, live, live)
        else:
            counts = self.method.draft_verify_round(self.ctx, self.inputs, self.decided, live, live,
                                                    pre_filling=before < self.prefilled)
            self.drafted[live] += counts.drafted
            self.accepted[live] += counts.accepted
            self.proposals[live] += counts.proposals
        for slot, start in zip(live.tolist(), before.tolist()):
            self.forwards[slot] += 1
            self.gains[slot][int(self.decided[slot]) - start] += 1
        finished = [slot for slot in live.tolist() if self.decided[slot] == self.total]
        return self._report(finished)

    def _finished(self, slot: int) -> FinishedImage:
        """The finished image in `slot`: its tokens and counters, as generate gives one image."""
        forwards = int(self.forwards[slot])
        stats = ContinuousStats(tokens=self.total, target_passes=forwards, target_forwards=forwards,
                                drafted=int(self.drafted[slot]), accepted=int(self.accepted[slot]),
                                residual_proposals=int(self.proposals[slot]))
        return FinishedImage(self.occupied[slot], self.inputs[slot:slot + 1, 1:].copy(), stats, self.started[slot])


class ContinuousRoundBatch(ContinuousBatch):
    """One group's images in a continuous pipeline's device round (its fixed buffers, as `slots`
    images: continuous_round_slots.py), entering and leaving between rounds. Holds the pipeline's
    lock while it has images (a direct generate call waits)."""

    def __init__(self, pipeline: ContinuousPipeline, rounds: ContinuousRoundSlots, sampling: dict[str, Any]):
        super().__init__(pipeline, sampling, rounds.slots)
        self.rounds = rounds
        self.seconds: dict[int, float] = {}  # time in the rounds the slot's image took part in

    def _admit(self, slot: int, request: Request) -> None:
        self.started[slot] = time.perf_counter()
        self.rounds.admit(slot, request.class_id, request.seed)
        self.gains[slot], self.seconds[slot] = Counter(), 0.0

    def _release(self, slot: int) -> None:
        self.rounds.release(slot)

    def round(self) -> RoundReport:
        before = {slot: self.rounds.length[slot] for slot in self.occupied}
        start = time.perf_counter()
        self.rounds.round()
        took = time.perf_counter() - start
        for slot, length in before.items():
            self.gains[slot][self.rounds.length[slot] - length] += 1
            self.seconds[slot] += took
        finished = [slot for slot in before if self.rounds.done(slot)]
        return self._report(finished)

    def _finished(self, slot: int) -> FinishedImage:
        """The finished image in `slot` as generate gives one image; its rounds are its target
        forwards and passes, and its host reads (one a round)."""
        rounds, drafted, accepted, proposals = (int(n) for n in self.rounds.counters[slot])
        stats = ContinuousStats(tokens=self.rounds.total, target_passes=rounds, target_forwards=rounds,
                                drafted=drafted, accepted=accepted, residual_proposals=proposals, host_syncs=rounds,
                                round_seconds=self.seconds[slot])
        return FinishedImage(self.occupied[slot], self.rounds.tokens[slot:slot + 1].copy(), stats, self.started[slot])


def finished_results(pipeline: ContinuousPipeline, images: list[FinishedImage],
                     sampling: dict[str, Any]) -> list[ContinuousResult]:
    """Each finished image's result as generate gives one image: its tokens, its pixels (those whose
    request decodes, through the tokenizer decoder in one call: a decoder pass over several images
    costs about one's on a GPU), its counters and its time."""
    decoded = [i for i, image in enumerate(images) if image.request.decode]
    pixels: dict[int, np.ndarray] = {}
    if decoded:
        batch = to_pixels(pipeline.decoder(np.concatenate([images[i].tokens for i in decoded])))
        pixels = {i: batch[k:k + 1] for k, i in enumerate(decoded)}
    now = time.perf_counter()
    return [ContinuousResult(image.tokens, pixels.get(i), image.stats, [now - image.started], dict(sampling))
            for i, image in enumerate(images)]


def continuous_batch(pipeline: Any, request: Request, slots: int) -> Optional[SlotBatch]:
    """The in-flight batch for `request`'s group on a continuous pipeline: the device round's slots
    where a call would decode with it, else the host loop's; None for another family's pipeline;
    SpecrtError for a group the model refuses."""
    if not isinstance(pipeline, ContinuousPipeline):
        return None
    method, sampling = pipeline.prepared(request.method, dict(request.params))
    pipeline.check_runs(method, request.decode)
    pipeline.hold()
    try:
        round_ = pipeline.device_round(method, sampling, slots)  # None: the host loop decodes
        if round_ is not None:
            return ContinuousRoundBatch(pipeline, ContinuousRoundSlots(round_, slots, pipeline.target.cuda_graphs),
                                        sampling)
        return ContinuousSlots(pipeline, method, sampling, slots)
    except BaseException:
        pipeline.let_go()
        raise
