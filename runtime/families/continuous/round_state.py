"""The state a continuous device round reads and writes: one flat set of tensors for a batch of images.

As runtime/rounds/state.py's for discrete tokens, and for the same reason: a round captured as one
CUDA graph cannot ask the host for a length, a finished flag or a random number between its
stages, so every image's tokens (continuous: C channels each), its decided length, its round
count, whether it has finished, whether its residual draw is still open, and its counters live on
the device in buffers of fixed shape, updated in place. Finished images ride along as padding.

Random numbers come from draws.py, keyed by (image seed, image round, token index, kind, part)
exactly as the host loop keys the same draw, so for a seed both loops give the same tokens; every
number depends on the image's own seed and progress alone: an image is the same alone or in any
batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specrt.runtime.counter_random import seed_halves
from specrt.runtime.families.continuous import draws
from specrt.runtime.families.continuous.draws import INDEX_SPAN


@dataclass
class ContinuousRoundState:
    """A batch's continuous decoding state on the device (`total` tokens an image).

    tokens [I, total + window + 1, C] float32: token j at column j (a round writes its window past
    the decided ones, which later rounds overwrite); length [I]: decided tokens (the target's cache
    holds positions 0 .. length − 1: the class and every decided token but the last); rounds [I]:
    rounds the image took part in unfinished; finished [I] bool; pending [I] bool: the token at
    `length` was rejected and its residual draw is not done yet; drafted / accepted / proposals [I]:
    cspd's counters (drafts tested, drafts accepted, residual proposals drawn); seed_low / seed_high
    [I]: each image's 64-bit seed, split for the counter generator."""

    tokens: Any
    length: Any
    rounds: Any
    finished: Any
    pending: Any
    drafted: Any
    accepted: Any
    proposals: Any
    seed_low: Any
    seed_high: Any
    total: int

    @classmethod
    def start(cls, device: Any, seeds: Sequence[int], total: int, window: int, channels: int) -> "ContinuousRoundState":
        """A new state for len(seeds) images on `device`, as `restart` leaves it."""
        if total + window + 1 > INDEX_SPAN:
            raise ValueError(f"{total} tokens and a window of {window} exceed the {INDEX_SPAN} token indices "
                             "the random coordinates hold")
        images = len(seeds)
        count = lambda dtype=torch.int64: torch.zeros(images, dtype=dtype, device=device)  # noqa: E731
        state = cls(tokens=torch.zeros((images, total + window + 1, channels), dtype=torch.float32, device=device),
                    length=count(), rounds=count(), finished=count(torch.bool), pending=count(torch.bool),
                    drafted=count(), accepted=count(), proposals=count(), seed_low=count(), seed_high=count(),
                    total=total)
        state.restart(seeds)
        return state

    def restart(self, seeds: Sequence[int]) -> None:
        """The same buffers for a new call of as many images (a captured round replays over them)."""
        halves = torch.tensor([seed_halves(s) for s in seeds], dtype=torch.int64)
        self.seed_low.copy_(halves[:, 0])
        self.seed_high.copy_(halves[:, 1])
        for counter in (self.tokens, self.length, self.rounds, self.drafted, self.accepted, self.proposals):
            counter.zero_()
        self.finished.fill_(self.total <= 0)
        self.pending.fill_(False)

    def admit(self, image: int, seed: int) -> None:
        """Image slot `image` holds a new image from now on (in-flight batching): its seed's halves,
        nothing decided, no round taken, no draw open, its counters at zero — as `restart` leaves a
        call's images; the other images untouched. Written in place: no new tensor, nothing read back."""
        self.seed_low[image], self.seed_high[image] = seed_halves(seed)
        for counter in (self.tokens, self.length, self.rounds, self.drafted, self.accepted, self.proposals):
            counter[image] = 0
        self.finished[image] = self.total <= 0
        self.pending[image] = False

    def release(self, image: int) -> None:
        """Image slot `image` is free: finished, so it rides along as padding and changes nothing."""
        self.finished[image] = True

    def uniforms(self, index: Any, kind: int, part: Any = 0) -> Any:
        """float64 uniforms for token indices index [I, ...] of this round, one kind of draw, one part
        (an int, or an int64 tensor broadcasting with index, below draws.PART_SPAN)."""
        image = (slice(None), *(None,) * (index.dim() - 1))
        return draws.uniforms(self.seed_low[image], self.seed_high[image], self.rounds[image], index, kind, part)

    def normals(self, index: Any, kind: int, count: int, groups: int = 1) -> Any:
        """Standard normals [I, J, groups, count] float32 for token indices index [I, J] of this round
        (draws.normals: group g is the draw's g-th block of `count`)."""
        group = torch.arange(groups, device=index.device)[None, None]
        image = (slice(None), None, None)
        return draws.normals(self.seed_low[image], self.seed_high[image], self.rounds[image], index[:, :, None],
                             kind, count, group)

    def inputs(self, positions: Any) -> Any:
        """The transformer's inputs [I, W, C] at positions [I, W]: token p − 1 at position p (position
        0, the class token's, gets a row the model ignores)."""
        columns = (positions - 1).clamp(min=0)
        return self.tokens.gather(1, columns[:, :, None].expand(-1, -1, self.tokens.shape[2]))

    def commit(self, accepted: Any, drafted: Any, next_token: Any, drew: Any) -> None:
        """Image i keeps its first accepted[i] drafts drafted [I, L, C] and then, where drew[i], its
        next token next_token [I, C] (else its residual draw stays open: `pending`); finished images
        keep what they have. In place, with shapes that never depend on the outcome."""
        live = ~self.finished
        slots = torch.arange(drafted.shape[1] + 1, device=drafted.device)
        values = torch.cat([drafted, next_token[:, None]], dim=1)
        values = values.where((slots[None, :] < accepted[:, None])[:, :, None], next_token[:, None])
        columns = (self.length[:, None] + slots[None, :]).clamp(max=self.tokens.shape[1] - 1)
        columns = columns[:, :, None].expand(-1, -1, self.tokens.shape[2])
        old = self.tokens.gather(1, columns)
        self.tokens.scatter_(1, columns, values.where(live[:, None, None], old))
        made = (accepted + drew.to(accepted.dtype)) * live
        self.length.copy_((self.length + made).clamp(max=self.total))
        self.rounds += live.to(self.rounds.dtype)
        self.pending.copy_(live & ~drew)
        self.finished |= self.length >= self.total
