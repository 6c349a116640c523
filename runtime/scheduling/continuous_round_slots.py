"""The continuous family's device round one round at a time over a fixed batch of slots.

As round_slots.py does for discrete tokens: a continuous device round (runtime/families/continuous/
rounds.py, ar or cspd) decodes a generate call's images in buffers of fixed shape — its state, both
models' KV buffers and class rows — and on CUDA replays one captured graph of a round over them.
Here the same buffers, sized once for `slots` images, hold images that come and go: `admit` writes
a new image into a free slot in place (ContinuousRound.admit: its class id in its model rows, its
KV rows zeroed, its seed's counter coordinates, its progress and counters at zero), a released or
never-filled slot is a finished image, which rides along as padding and changes nothing, and
`round` runs the round once. The admitted image's prefill — the class token at position 0 — is
its window in its first round, as in a call's first round. No shape changes, so nothing is planned,
traced or captured again: the graph a generate call of `slots` images captured (the pipeline keeps
it) is the one these rounds replay, and the first rounds here capture it where no call has.

What the host reads: once a round, in one copy, each slot's length, its counters (rounds, drafts,
accepted drafts, residual proposals: what its result reports) and the tokens it may have committed
since the last read (a window's worth of C-channel latents past what the host already has) — the
one wait a generate call's round has (its finished flags). An admission reads nothing back. The
tokens of a finished image are therefore on the host the round it finishes.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from specrt.runtime.scheduling.round_slots import advance, start_reading

COUNTERS = ("rounds", "drafted", "accepted", "proposals")  # the state's per-image counters a read brings


class ContinuousRoundSlots:
    """`slots` images decoding in one continuous device round's buffers (`round_`, planned for a batch
    of `slots` images), round by round.

    `step` is how a round runs: the round itself (eager), its captured CUDA graph (`graphs`: made at
    the second round, as decode_rounds makes it, unless an earlier call left one on the round), or a
    caller's compiled form of it (tests compile it to show admissions trigger no recompilation).
    What the host has read: `tokens` [slots, seq_len, C], `length` [slots], `counters` [slots, 4]
    (COUNTERS' order)."""

    def __init__(self, round_: Any, slots: int, graphs: bool = False):
        import torch

        self.torch, self.round_, self.slots, self.graphs = torch, round_, slots, graphs
        self.total = round_.target.seq_len
        self.channels = round_.target.mar.cfg.token_dim
        self.tokens = np.zeros((slots, self.total, self.channels), dtype=np.float32)
        self.length = [0] * slots
        self.counters = np.zeros((slots, len(COUNTERS)), dtype=np.int64)
        self.state: Any = None  # the round's ContinuousRoundState, made (or restarted) at the first admission
        self.step: Callable[[Any], None] = getattr(round_, "captured", None) or round_
        self.runs = 0  # rounds run
        self.host_reads = 0  # copies from the device the host waited for: one a round
        self._reach: Any = None  # [window]: the columns a read covers past what the host has
        self._read_from: Any = None  # [slots] on the device: where each slot's next read starts

    def admit(self, slot: int, class_id: int, seed: int) -> None:
        """A new image (class id, seed) in the free `slot`. The first admission starts the round over
        `slots` copies of it (every buffer made or restarted) and frees the others, so a slot never
        filled is a finished image with finite rows."""
        with self.torch.inference_mode():
            if self.state is None:
                self._start(class_id, seed)
            self.round_.admit(slot, class_id, seed)
            self._read_from[slot] = 0
        self.tokens[slot] = 0.0
        self.length[slot] = 0
        self.counters[slot] = 0

    def release(self, slot: int) -> None:
        """The image in `slot` leaves (finished, cancelled or expired): the slot is padding again."""
        if self.state is not None:
            with self.torch.inference_mode():
                self.state.release(slot)

    def done(self, slot: int) -> bool:
        return self.length[slot] >= self.total

    def round(self) -> None:
        """One round for every slot (free ones as padding), then the one read: lengths, counters and
        new tokens, as float64 (exact for float32 latents and for counts below 2^53)."""
        torch = self.torch
        with torch.inference_mode():
            advance(self)
            state = self.state
            columns = (self._read_from[:, None] + self._reach).clamp(max=state.tokens.shape[1] - 1)
            window = state.tokens.gather(1, columns[:, :, None].expand(-1, -1, self.channels))
            counts = torch.stack([state.length] + [getattr(state, name) for name in COUNTERS], dim=1)
            read = torch.cat([counts.to(torch.float64), window.flatten(1).to(torch.float64)], dim=1).tolist()
            self._read_from.copy_(state.length)
        self.host_reads += 1
        for slot, row in enumerate(read):
            self._take(slot, row)

    def _start(self, class_id: int, seed: int) -> None:
        self.state = self.round_.start(np.full(self.slots, class_id, dtype=np.int64), [seed] * self.slots)
        start_reading(self, self.round_.window)

    def _take(self, slot: int, row: list[float]) -> None:
        """Slot `slot`'s part of a read: its committed length, its counters, and its tokens from the
        first the host had not read (a round's reach)."""
        known, length = self.length[slot], int(row[0])
        fresh = np.asarray(row[1 + len(COUNTERS):], dtype=np.float32).reshape(-1, self.channels)
        self.tokens[slot, known:length] = fresh[:length - known]
        self.length[slot] = length
        self.counters[slot] = row[1:1 + len(COUNTERS)]
