"""The device round one round at a time over a fixed batch of slots (in-flight batching on the GPU path).

A device round (runtime/rounds) decodes a generate call's images in buffers of fixed shape — the
round's state, its models' KV buffers, its windows — and on CUDA replays one captured graph of a
round over them. Here the same buffers, sized once for `slots` images, hold images that come and
go: `admit_all` writes new images into free slots in place (rounds/chains.py admit_images: their
prefill, one pass for all, into their slots' KV rows, their counter coordinates, their token 0,
the round's per-image state), a
released or never-filled slot is a finished image, which rides along as padding and changes
nothing, and `round` runs the round once. No shape changes, so nothing is planned, traced or
captured again: the graph a generate call of `slots` images captured (the pipeline keeps it) is
the one these rounds replay, and the first rounds here capture it where no call has.

What the host reads: once a round, each slot's length and the tokens it may have committed since
the last read (a window's worth from what the host already has), in one copy — the one wait a
generate call's round has (its finished flags). An admission reads nothing back: the slot's
token 0 arrives with the next round's read. The tokens of a finished image are therefore on the
host the round it finishes, without a read at the end.

This offers SlotRounds' interface (slots, tokens, admit, release, done, round), so InflightBatch
(runtime/scheduling/inflight.py) drives it as it drives the host loop's slots.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from specrt.runtime.conditions import Conditions
from specrt.runtime.decoding import Decoding
from specrt.runtime.stats import Stats

UNREAD = -1  # a token committed on the device that the host has not read yet (an admitted slot's token 0)


class RoundSlots:
    """`slots` images decoding in one device round's buffers (`round_`, planned for a guidance matrix
    of `slots` images), round by round; `ctx` makes an admitted image's condition rows (CFG twins).

    `step` is how a round runs: the round itself (eager), its captured CUDA graph (`graphs`: made at
    the second round, as decode_rounds makes it, unless an earlier call left one on the round), or a
    caller's compiled form of it (tests compile it to show admissions trigger no recompilation)."""

    def __init__(self, round_: Any, ctx: Decoding, slots: int, graphs: bool = False):
        import torch

        self.torch, self.round_, self.ctx, self.slots, self.graphs = torch, round_, ctx, slots, graphs
        self.total = ctx.num_image_tokens
        self.tokens: list[list[int]] = [[] for _ in range(slots)]
        self.state: Any = None  # the round's RoundState, made (or restarted) at the first admission
        self.step: Callable[[Any], None] = getattr(round_, "captured", None) or round_
        self.runs = 0  # rounds run
        self.host_reads = 0  # copies from the device the host waited for: one a round
        self._known = [0] * slots  # tokens of each slot the host has read
        self._reach: Any = None  # [window + 1]: the columns a read covers past what the host has
        self._read_from: Any = None  # [slots] on the device: where each slot's next read starts

    def admit(self, slot: int, conditions: Conditions, seed: int) -> None:
        """A new image (one condition) in the free `slot`: admit_all of one."""
        self.admit_all([slot], conditions, [seed])

    def admit_all(self, slots: Sequence[int], conditions: Conditions, seeds: Sequence[int]) -> None:
        """New images in the free `slots` (`conditions` one per slot, in order), with one prefill
        (rounds/chains.py admit_images). The first admission starts the round over `slots` copies of
        the first image (every buffer made or restarted, every row a real prefill) and frees the
        others, so a slot never filled is a finished image with finite rows."""
        from specrt.runtime.rounds.chains import admit_images

        with self.torch.inference_mode():
            if self.state is None:
                self._start(conditions.image(0), seeds[0])
            admit_images(self.round_, list(slots), self.ctx.condition_rows(conditions), list(seeds))
            self._read_from[list(slots)] = 0
        for slot in slots:
            self.tokens[slot] = [UNREAD]
            self._known[slot] = 0

    def release(self, slot: int) -> None:
        """The image in `slot` leaves (finished, cancelled or expired): the slot is padding again."""
        if self.state is not None:
            with self.torch.inference_mode():
                self.state.release(slot)
        self.tokens[slot] = []

    def done(self, slot: int) -> bool:
        return self._known[slot] >= self.total

    def compact(self) -> None:
        """Nothing leaves the fixed buffers: a free slot rides the round as padding (its rows
        finite), so the captured graph keeps its shapes."""

    def round(self) -> None:
        """One round for every slot (free ones as padding), then the one read: lengths and new tokens."""
        torch = self.torch
        with torch.inference_mode():
            advance(self)
            state = self.state
            columns = (self._read_from[:, None] + self._reach).clamp(max=state.tokens.shape[1] - 1)
            read = torch.cat([state.length[:, None], state.tokens.gather(1, columns)], dim=1).tolist()
            self._read_from.copy_(state.length)
        self.host_reads += 1
        for slot in range(self.slots):
            if self.tokens[slot]:
                self._take(slot, read[slot][0], read[slot][1:])

    def _start(self, conditions: Conditions, seed: int) -> None:
        rows = self.ctx.condition_rows(conditions.take([0] * self.slots))
        self.state = self.round_.start(rows, [seed] * self.slots, self.total)
        start_reading(self, self.round_.window + 1)

    def _take(self, slot: int, length: int, window: list[int]) -> None:
        """Slot `slot`'s part of a read: its committed `length`, and its tokens from the first the
        host had not read (`window`, a round's reach)."""
        known = self._known[slot]
        self.tokens[slot] = self.tokens[slot][:known] + window[: length - known]
        self._known[slot] = length


def advance(slots: Any) -> None:
    """Run a slot batch's round once: its `step` (eager or a caller's compiled form), or at its
    second round, with `graphs`, the capture of its CUDA graph (which runs that round), kept on
    the round so later batches and generate calls replay it. Shared by the discrete and the
    continuous families' slot batches (RoundSlots, ContinuousRoundSlots)."""
    if slots.graphs and slots.runs == 1 and slots.step is slots.round_:
        from specrt.runtime.rounds import CapturedRound

        slots.step = slots.round_.captured = CapturedRound(slots.torch, slots.round_, slots.state)
    else:
        slots.step(slots.state)
    slots.runs += 1


def start_reading(slots: Any, reach: int) -> None:
    """A slot batch's round just started over copies of its first image: every slot freed (padding
    until admitted), and its reads set to cover `reach` columns past what the host has. Shared by
    the discrete and the continuous families' slot batches (RoundSlots, ContinuousRoundSlots)."""
    for slot in range(slots.slots):
        slots.state.release(slot)
    slots._reach = slots.torch.arange(reach, device=slots.state.length.device)
    slots._read_from = slots.torch.zeros_like(slots.state.length)


def round_slots(pipeline: Any, decoder: Any, sampling: Any, mix: Any, slots: int) -> Optional[RoundSlots]:
    """The slots of a group decoding with `decoder` and `sampling` (guidance matrix `mix` for `slots`
    images) in the pipeline's device round, or None where the pipeline decodes on the host loop."""
    round_ = pipeline.device_round(decoder, sampling, mix)
    if round_ is None:
        return None
    ctx = Decoding(pipeline.target, None, sampling, [0] * slots, Stats(), pipeline.grammar)
    return RoundSlots(round_, ctx, slots, graphs=pipeline.target.cuda_graphs)
