"""A method's host loop one round at a time over a fixed batch of slots (in-flight batching).

A method's generate runs its batch from the prefill to the last token. These classes run the same
rounds — through the method's own round code where it has one (DraftThenVerify.chain_round), the
same calls in the same order where not — on a batch whose images come and go: `admit` prefills a
new image into a free slot (runner.admit: its rows alone; Decoding.reseed: its own counter
coordinates), `round` advances every occupied slot by one target pass, `release` frees a slot.

A free slot is a finished image as generate knows it: its tokens complete (FREE), so it sits every
round out with no window, as finished images ride along in a generate call. Because an image's
every draw is keyed by its own seed, token index and round count (runtime/counter_random.py), and
its rows attend only to its own cache, its tokens do not depend on what shares the batch.
"""
from __future__ import annotations

from typing import Any, Optional

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
from specrt.runtime.window import chains


class SlotRounds:
    """The state of `slots` images decoding with `method` in one Decoding context, round by round."""

    def __init__(self, method: Method, ctx: Decoding, slots: int):
        self.method, self.ctx, self.slots = method, ctx, slots
        self.total = ctx.num_image_tokens
        self.tokens: list[list[int]] = [self._free() for _ in range(slots)]
        for runner in self.runners():  # a slot never filled sits at its condition's end, as a prefilled one
            runner.lengths[:] = runner.spec.cond_len

    def _free(self) -> list[int]:
        return [-1] * self.total  # complete: a free slot has no window

    def runners(self) -> list[Any]:
        return [r for r in (self.ctx.target, self.ctx.draft) if r is not None]

    def admit(self, slot: int, conditions: Conditions, seed: int) -> None:
        """A new image in the free `slot`: its counter coordinates, its prefill (every model the
        method runs), its image token 0."""
        self.ctx.reseed(slot, seed)
        first = self.ctx.admit(self.ctx.target, slot, conditions)
        if self.ctx.draft is not None:
            self.ctx.admit(self.ctx.draft, slot, conditions)
        self.tokens[slot] = [int(first.draws[0, 0])]

    def release(self, slot: int) -> None:
        self.tokens[slot] = self._free()

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
        active = [len(t) < self.total for t in self.tokens]
        ctx.start_round([len(t) if on else None for t, on in zip(self.tokens, active)])
        out = ctx.run(target, chains([[t[-1]] if on else None for t, on in zip(self.tokens, active)]),
                      ctx.uniforms(0, NEXT))
        target.commit([range(1) if on else None for on in active])
        draws = out.draws
        for slot in np.flatnonzero(active).tolist():
            self.tokens[slot].append(int(draws[slot, 0]))


class ChainSlots(SlotRounds):
    """sd, cool-sd, lantern with an independent draft model drafting chains: the method's chain_round."""

    def __init__(self, method: DraftThenVerify, ctx: Decoding, slots: int):
        super().__init__(method, ctx, slots)
        self.rule = method.rule(ctx)

    def round(self) -> None:
        self.method.chain_round(self.ctx, self.tokens, list(range(self.slots)), self.rule)


class JacobiSlots(SlotRounds):
    """sjd and sjd-pac: each occupied slot's Jacobi iteration (JacobiDecoding.jacobi_round, as
    generate's loop runs it), its proposal (levels) kept per slot."""

    def __init__(self, method: JacobiDecoding, ctx: Decoding, slots: int):
        super().__init__(method, ctx, slots)
        self.levels: list[list[Level]] = [[] for _ in range(slots)]
        self.uniform = fresh_proposal(ctx.target.spec.vocab_size, ctx.grammar)

    def admit(self, slot: int, conditions: Conditions, seed: int) -> None:
        super().admit(slot, conditions, seed)
        self.levels[slot] = []

    def release(self, slot: int) -> None:
        super().release(slot)
        self.levels[slot] = []

    def round(self) -> None:
        self.method.jacobi_round(self.ctx, self.tokens, self.levels, list(range(self.slots)), self.uniform)


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
