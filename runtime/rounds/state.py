"""The state a device round reads and writes: one flat set of tensors for a batch of images.

Why tensors and not Python lists: a round that is captured as one CUDA graph cannot ask the host
for a length, a finished flag or a random number between its stages. So every image's committed
tokens, its length, its round count, whether it has finished and the histogram of tokens per
round live on the device, in buffers of fixed shape (vLLM's SpecDecodeMetadata is the model),
and a round updates them in place. Finished images stay in the batch as padding: their rows run
and change nothing.

Random numbers come from runtime.counter_random, keyed by (image seed, token index, draw kind,
round): every uniform a round uses is fresh — no (round, index, kind) repeats within an image —
and depends on nothing but the image's own seed and progress, so an image is the same alone or
in any batch. The host loop (runtime/decoding.py) keys its draws the same way (draw_slot).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specrt.runtime.counter_random import (CANDIDATE, DRAFT, FRESH, KINDS, NEXT, PARTS, RESAMPLE, RETEST, TEST,
                                          counter_uniforms, draw_slot, seed_halves)

__all__ = ["CANDIDATE", "DRAFT", "FRESH", "KINDS", "NEXT", "PARTS", "RESAMPLE", "RETEST", "TEST", "RoundState"]


@dataclass
class RoundState:
    """A batch's decoding state on the device (all tensors; `total` image tokens an image).

    tokens [I, total + window + 1] int64: committed tokens first (a round writes its window past
    them, which later rounds overwrite); length [I]: committed tokens, ≥ 1 (the last is the pending
    token, not yet in the target's cache); rounds [I]: rounds the image took part in unfinished;
    finished [I] bool; produced [window + 2]: how many rounds produced each count of tokens;
    seed_low / seed_high [I]: each image's 64-bit seed, split for the counter generator."""

    tokens: Any
    length: Any
    rounds: Any
    finished: Any
    produced: Any
    seed_low: Any
    seed_high: Any
    total: int

    @classmethod
    def start(cls, device: Any, seeds: Sequence[int], total: int, window: int) -> "RoundState":
        """A new state for len(seeds) images on `device`, as `restart` leaves it."""
        images = len(seeds)
        state = cls(tokens=torch.zeros((images, total + window + 1), dtype=torch.int64, device=device),
                    length=torch.ones(images, dtype=torch.int64, device=device),
                    rounds=torch.zeros(images, dtype=torch.int64, device=device),
                    finished=torch.zeros(images, dtype=torch.bool, device=device),
                    produced=torch.zeros(window + 2, dtype=torch.int64, device=device),
                    seed_low=torch.zeros(images, dtype=torch.int64, device=device),
                    seed_high=torch.zeros(images, dtype=torch.int64, device=device), total=total)
        state.restart(seeds)
        return state

    def restart(self, seeds: Sequence[int]) -> None:
        """The same buffers for a new call of as many images (a captured round replays over them):
        the seeds' halves in place, one token committed (image token 0: the caller writes it), every
        count back to zero."""
        halves = torch.tensor([seed_halves(s) for s in seeds], dtype=torch.int64)
        self.seed_low.copy_(halves[:, 0])
        self.seed_high.copy_(halves[:, 1])
        self.tokens.zero_()
        self.length.fill_(1)
        self.rounds.zero_()
        self.finished.fill_(self.total <= 1)
        self.produced.zero_()

    def admit(self, image: int, seed: int) -> None:
        """Image slot `image` holds a new image from now on (in-flight batching): its seed's halves,
        one token committed (the caller writes it), its round count at zero, unfinished — as
        `restart` leaves a call's images; the other images untouched. Scalars written in place: no
        new tensor, nothing read back."""
        self.seed_low[image], self.seed_high[image] = seed_halves(seed)
        self.tokens[image] = 0
        self.length[image] = 1
        self.rounds[image] = 0
        self.finished[image] = self.total <= 1

    def release(self, image: int) -> None:
        """Image slot `image` is free: finished, so it rides along as padding and changes nothing."""
        self.finished[image] = True

    def uniforms(self, index: Any, kind: int, part: Any = 0) -> Any:
        """float64 uniforms for token indices index [I, K] (or [I]) of this round, for one kind of draw
        and one part of it (below PARTS: an int, or int64 tensor broadcasting with index)."""
        extra = (None,) * (index.dim() - 1)
        slot = draw_slot(kind, part, self.rounds[(slice(None), *extra)])
        return counter_uniforms(self.seed_low[(slice(None), *extra)], self.seed_high[(slice(None), *extra)], index, slot)

    def pending(self) -> Any:
        """Each image's pending token [I] (its last committed one)."""
        return self.tokens.gather(1, (self.length - 1)[:, None])[:, 0]

    def commit(self, accepted: Any, drafted: Any, next_token: Any) -> None:
        """Image i keeps its first accepted[i] drafts drafted [I, L] and then next_token[i]; finished
        images keep what they have. In place, with shapes that never depend on the outcome."""
        live = ~self.finished
        slots = torch.arange(drafted.shape[1] + 1, device=drafted.device)
        values = torch.cat([drafted, next_token[:, None]], dim=1)
        values = values.where(slots[None, :] < accepted[:, None], next_token[:, None])
        columns = (self.length[:, None] + slots[None, :]).clamp(max=self.tokens.shape[1] - 1)
        old = self.tokens.gather(1, columns)
        self.tokens.scatter_(1, columns, values.where(live[:, None], old))
        made = (accepted + 1) * live
        self.produced.index_add_(0, made, live.to(self.produced.dtype))
        self.length += made
        self.rounds += live.to(self.rounds.dtype)
        self.finished |= self.length >= self.total
