"""A method's host loop one round at a time over the occupied slots of a batch (in-flight batching).

A method's generate runs its batch from the prefill to the last token. These classes run the same
rounds — through the method's own round code where it has one (DraftThenVerify.chain_round,
JacobiDecoding.jacobi_round), the same calls in the same order where not — on a batch whose images
come and go: `admit` prefills a new image into a free slot (runner.admit: its rows alone;
Decoding.reseed: its own counter coordinates), `round` advances every occupied slot by one target
pass, `release` frees a slot.

The runners' batch follows occupancy: it holds the occupied slots' images only (`positions[p]`:
the slot at batch position p), so a round costs the rows of the images decoding — one request
runs as one image (two rows under CFG), not as `slots` of them. The runners are allocated once for
`slots` images (their buffers' room); an admit into a full batch grows it by one image
(runner.grow), a release shrinks it (runner.retain, the rows moved in place as generate drops
finished images). A batch never shrinks below one position: with its last request gone it keeps
a free position, a finished image as generate knows it (its tokens complete), which sits every
round out with no window until the next admit takes it. Because an image's every draw is keyed by
its own seed, token index and round count (runtime/counter_random.py), and its rows attend only to
its own cache, its tokens do not depend on what shares the batch or on its position in it.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.counter_random import NEXT
from specrt.runtime.decoding import Decoding
from specrt.runtime.methods.ar import Autoregressive
from specrt.runtime.methods.base import Method
from specrt.runtime.methods.jacobi import JacobiDecoding, Level, fresh_proposal
from specrt.runtime.methods.speculative import DraftThenVerify
from specrt.runtime.model_drafter import ModelDrafter
from specrt.runtime.drafting import make_drafter
from specrt.runtime.sampling import guidance_mix
from specrt.runtime.window import chains


class SlotRounds:
    """The state of up to `slots` images decoding with `method` in one Decoding context, round by
    round; the context's runners allocated for `slots` images and its batch about to follow occupancy."""

    def __init__(self, method: Method, ctx: Decoding, slots: int):
        self.method, self.ctx, self.slots = method, ctx, slots
        self.total = ctx.num_image_tokens
        # per slot, then one entry (index `slots`) that every free position reads: always complete
        self.tokens: list[list[int]] = [self._free() for _ in range(slots + 1)]
        self.positions: list[Optional[int]] = [None]  # the slot at each batch position (None: free)
        ctx.retain([0])
        for runner in self.runners():  # the free position sits at its condition's end, as a prefilled one
            runner.lengths[:] = runner.spec.cond_len

    def _free(self) -> list[int]:
        return [-1] * self.total  # complete: a free slot has no window

    def runners(self) -> list[Any]:
        return [r for r in (self.ctx.target, self.ctx.draft) if r is not None]

    def images(self) -> list[int]:
        """The tokens index of each batch position (a free position reads the complete spare)."""
        return [self.slots if slot is None else slot for slot in self.positions]

    def admit(self, slot: int, conditions: Conditions, seed: int) -> None:
        """A new image (one condition) in the free `slot`: admit_all of one."""
        self.admit_all([slot], conditions, [seed])

    def admit_all(self, slots: Sequence[int], conditions: Conditions, seeds: Sequence[int]) -> None:
        """New images in the free `slots` (`conditions` one per slot, in order), each at a free batch
        position or one the batch grows by: their counter coordinates, one prefill for all of them
        through every model the method runs (not one each: a prefill of eight images costs about
        what one does), their image token 0."""
        ctx = self.ctx
        positions = []
        for slot, seed in zip(slots, seeds, strict=True):
            if None not in self.positions:
                ctx.grow(guidance_mix(len(self.positions) + 1, ctx.sampling))
                self.positions.append(None)
            position = self.positions.index(None)
            self.positions[position] = slot
            ctx.reseed(position, seed)
            positions.append(position)
        try:
            first = ctx.admit(ctx.target, positions, conditions)
            if ctx.draft is not None:
                ctx.admit(ctx.draft, positions, conditions)
        except BaseException:  # the positions are free again: a refused admission leaves no image behind
            for position in positions:
                self.positions[position] = None
            raise
        for index, slot in enumerate(slots):
            self.tokens[slot] = [int(first.draws[index, 0])]

    def release(self, slot: int) -> None:
        """`slot` is free: its batch position sits rounds out until an admit takes it or the next
        round's compact() drops it. Not dropped here: under load a request enters the freed position
        before the next round, and shrinking then growing would move every KV row twice."""
        self.tokens[slot] = self._free()
        if slot in self.positions:  # not where its admission failed (admit_all freed its position)
            self.positions[self.positions.index(slot)] = None

    def compact(self) -> None:
        """Free positions leave the batch before a round (InflightBatch.round): every one where
        moving KV rows is a copy (retain_share 0), or once that share of the batch is free where a
        shrink costs more (CUDA graphs re-captured), as generate's finished images leave
        (methods/base.Batched); one position always stays."""
        free = self.positions.count(None)
        if not free or free < max(r.retain_share for r in self.runners()) * len(self.positions):
            return
        keep = [p for p, slot in enumerate(self.positions) if slot is not None] or [0]
        if len(keep) < len(self.positions):
            self.ctx.retain(keep)
            self.positions = [self.positions[p] for p in keep]

    def done(self, slot: int) -> bool:
        return len(self.tokens[slot]) == self.total

    def round(self) -> None:
        """One target pass for every occupied, unfinished slot."""
        raise NotImplementedError


class ArSlots(SlotRounds):
    """AR: each occupied slot feeds its last token (a window of one), token k drawn with its
    round's NEXT uniform at index k, as Autoregressive.generate draws it."""

    def round(self) -> None:
        ctx, target = self.ctx, self.ctx.target
        sequences = [self.tokens[i] for i in self.images()]
        active = [len(t) < self.total for t in sequences]
        ctx.start_round([len(t) if on else None for t, on in zip(sequences, active)])
        out = ctx.run(target, chains([[t[-1]] if on else None for t, on in zip(sequences, active)]),
                      ctx.uniforms(0, NEXT))
        target.commit([range(1) if on else None for on in active])
        draws = out.draws
        for position in np.flatnonzero(active).tolist():
            sequences[position].append(int(draws[position, 0]))


class ChainSlots(SlotRounds):
    """sd, cool-sd, lantern with an independent draft model drafting chains: the method's chain_round."""

    def __init__(self, method: DraftThenVerify, ctx: Decoding, slots: int):
        super().__init__(method, ctx, slots)
        self.rule = method.rule(ctx)

    def round(self) -> None:
        self.method.chain_round(self.ctx, self.tokens, self.images(), self.rule)


class JacobiSlots(SlotRounds):
    """sjd and sjd-pac: each occupied slot's Jacobi iteration (JacobiDecoding.jacobi_round, as
    generate's loop runs it), its proposal (levels) kept per slot."""

    def __init__(self, method: JacobiDecoding, ctx: Decoding, slots: int):
        super().__init__(method, ctx, slots)
        self.levels: list[list[Level]] = [[] for _ in range(slots + 1)]  # per slot, then the spare's
        self.uniform = fresh_proposal(ctx.target.spec.vocab_size, ctx.grammar)

    def admit_all(self, slots: Sequence[int], conditions: Conditions, seeds: Sequence[int]) -> None:
        super().admit_all(slots, conditions, seeds)
        for slot in slots:
            self.levels[slot] = []

    def release(self, slot: int) -> None:
        super().release(slot)
        self.levels[slot] = []

    def round(self) -> None:
        self.method.jacobi_round(self.ctx, self.tokens, self.levels, self.images(), self.uniform)


def slot_rounds(method: Method, ctx: Decoding, slots: int) -> Optional[SlotRounds]:
    """The step-wise form of `method` on this context, or None where its host loop has none yet
    (trees, an EAGLE head or another drafter the chain loop does not drive)."""
    if not all(r.admits for r in (ctx.target, ctx.draft) if r is not None):
        return None
    if isinstance(method, Autoregressive):
        return ArSlots(method, ctx, slots)
    if isinstance(method, DraftThenVerify):
        if method.tree != "chain" or type(make_drafter(ctx)) is not ModelDrafter:
            return None
        return ChainSlots(method, ctx, slots)
    if isinstance(method, JacobiDecoding):
        return JacobiSlots(method, ctx, slots)
    return None
