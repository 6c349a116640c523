"""The decoding context of one generate call: the models, the sampling distribution, each image's
counter coordinates, and the counters.

Every model call a method or a drafter makes goes through it (prefill, run, run_chain, run_tree,
run_pairs), with the uniforms its draws use, and the host restrictions of the rows (greedy, top-k,
top-p) are applied in one place. Random numbers are counter uniforms (runtime.counter_random): each
a pure function of the image's seed, the token index it decides and its slot (the image's round,
the kind of draw, its part) — the coordinates the device round (runtime/rounds) gives the same
draw — so nothing is drawn from a stream, and an image's tokens are the same alone, in any batch,
on any backend and in either loop. It sits below the drafters (runtime.drafter) and the methods
(runtime.methods), which both call it.
What the images are conditioned on (class ids or captions, runtime.conditions) passes through
untouched: methods only count it and hand it to Decoding.prefill.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions, as_conditions
from specrt.runtime.counter_random import (CANDIDATE, DRAFT, NEXT, draw_slot, image_key, keyed_uniform, keyed_uniforms,
                                          seed_halves)
from specrt.runtime.runner import ModelRunner, StepOutput, draws_left_on_device, window_sizes
from specrt.runtime.sampling import SamplingParams, inverse_cdf, needs_restriction, restrict
from specrt.runtime.stats import Stats
from specrt.runtime.tree_call import TreeLayout
from specrt.runtime.window import Windows


SMALL_DRAW = 32  # fewer draws than this a call are cheaper hashed one by one in Python than as numpy arrays


@dataclass
class ImageKey:
    """One image's counter coordinates: its seed's halves, its round (target passes since its prefill:
    0 in the first round, −1 before it) and its committed length at the round's start (n: the
    pending token sits at index n − 1, so a round's draws are keyed by index n + offset)."""

    low: int
    high: int
    round: int = -1
    length: int = 1
    key: int = field(init=False)  # image_key of (low, high): hashed once, not at every draw

    def __post_init__(self) -> None:
        self.key = image_key(self.low, self.high)

    def uniform(self, offset: int, kind: int, part: int = 0, earlier: bool = False) -> float:
        """The uniform of one draw at token index length + offset (Decoding.uniforms, one number)."""
        round_ = max(self.round - 1, 0) if earlier else self.round
        return keyed_uniform(self.key, self.length + offset, draw_slot(kind, part, round_))


@dataclass
class Decoding:
    """The models, sampling distribution, counter coordinates and counters of one generate call.

    `seeds` holds one seed per image of the batch, in batch order: everything random about image i
    (its uniforms for the sampling head, its verification coins, its random drafts) is a counter
    uniform of seeds[i] and the draw's own coordinates (`keys[i]`: its round and length), so an image
    does not depend on what else is decoded with it. A method calls `start_round` before each round
    with each image's committed length; `retain` keeps the keys in step when finished images leave
    the runners' batch.
    """

    target: ModelRunner
    draft: Optional[ModelRunner]
    sampling: SamplingParams
    seeds: Sequence[int]
    stats: Stats
    # a unified model's image grammar (runtime/grammar.py): the models already force its tokens;
    # methods that make up drafts without a model (SJD's fresh window slots) draft forced tokens as
    # what they must be and sampled ones from the codes only
    grammar: Optional[Any] = None
    keys: list[ImageKey] = field(init=False)

    def __post_init__(self) -> None:
        self.keys = [ImageKey(*seed_halves(seed)) for seed in self.seeds]

    @property
    def key(self) -> ImageKey:
        """The coordinates of a one-image context (`image(i)` makes one)."""
        if len(self.keys) != 1:
            raise ValueError(f"a context of {len(self.keys)} images has one key per image: use keys[i] or image(i)")
        return self.keys[0]

    def image(self, i: int) -> "Decoding":
        """The same context narrowed to image i's coordinates (for per-image verification code); a
        one-image context is its own (a copy per image and round costs more than the host work it serves)."""
        if len(self.keys) == 1 and i == 0:
            return self
        narrowed = copy.copy(self)
        narrowed.keys = [self.keys[i]]
        return narrowed

    def start_round(self, lengths: Sequence[Optional[int]]) -> None:
        """A new round: image p (batch position) has lengths[p] committed tokens and takes part in it
        (its round count advances), or None: it has finished and sits this round out."""
        for key, length in zip(self.keys, lengths):
            if length is not None:
                key.round += 1
                key.length = int(length)

    def uniforms(self, offsets: Any, kind: int, part: Any = 0, earlier: bool = False) -> np.ndarray:
        """float64 uniforms [I] or [I, K] of this round's draws of `kind` (and `part`, an int or ints
        broadcasting with offsets) at token indices n + offsets (n each image's length at the round's
        start): offsets an int (every image, [I]), [I], or [I, K] / [1, K] (every image alike).
        `earlier`: keyed by the round before (0 before the first), as the round that made a Jacobi
        window drew its fresh slots. A step's few draws are hashed one by one in Python (microseconds;
        ~40 numpy operations on tiny arrays cost tens of them, every step), many as arrays."""
        if isinstance(offsets, int) and isinstance(part, int):  # one draw an image: the usual step
            return np.array([key.uniform(offsets, kind, part, earlier) for key in self.keys], dtype=np.float64)
        offsets, parts = np.asarray(offsets, dtype=np.int64), np.asarray(part, dtype=np.int64)
        if offsets.ndim == 0:
            offsets = np.full(len(self.keys), offsets)
        if parts.ndim <= offsets.ndim <= 2 and offsets.size * len(self.keys) < SMALL_DRAW * offsets.shape[0]:
            parts = parts.reshape((1,) * (offsets.ndim - parts.ndim) + parts.shape)  # numpy's broadcast, by hand
            return self._few_uniforms(offsets.tolist(), parts.tolist(), kind, earlier)
        trailing = (1,) * (max(offsets.ndim, parts.ndim) - 1)
        shape = np.broadcast_shapes((len(self.keys), *trailing), offsets.shape, parts.shape)
        keys, lengths, rounds = (np.array(values, dtype=np.int64) for values in
                                 zip(*((k.key, k.length, k.round) for k in self.keys)))
        if earlier:
            rounds = np.maximum(rounds - 1, 0)
        extra = (None,) * (len(shape) - 1)
        slots = draw_slot(kind, parts, rounds[(slice(None), *extra)])
        return keyed_uniforms(keys[(slice(None), *extra)], lengths[(slice(None), *extra)] + offsets, slots)

    def _few_uniforms(self, offsets: list, parts: list, kind: int, earlier: bool) -> np.ndarray:
        """uniforms() of a step's few draws, hashed one by one: offsets and parts as nested lists [I] or
        [I, K], each with a leading axis of the images or of 1 (every image alike), parts broadcasting
        along the last axis too."""
        def row(values: list, i: int) -> Any:
            return values[i] if len(values) > 1 else values[0]

        rows = []
        for i, key in enumerate(self.keys):
            offset, part = row(offsets, i), row(parts, i)
            if not isinstance(offset, list):  # [I]: one draw an image
                rows.append(key.uniform(offset, kind, part, earlier))
                continue
            part = part if len(part) == len(offset) else part * len(offset)
            rows.append([key.uniform(o, kind, p, earlier) for o, p in zip(offset, part)])
        return np.array(rows, dtype=np.float64)

    def _first_uniforms(self) -> np.ndarray:
        """[I, 1]: image token 0's draw (index 0, round 0, NEXT), as the device round draws it."""
        return np.array([[keyed_uniform(k.key, 0, draw_slot(NEXT, 0, 0))] for k in self.keys], dtype=np.float64)

    def condition_rows(self, conditions: Conditions) -> Conditions:
        """Model batch for these images: [cond; uncond] when CFG is on (null class, or the
        uncond caption flag), the images' own conditions otherwise."""
        conditions = as_conditions(conditions)
        return conditions.with_uncond(self.target.spec.null_class) if self.sampling.uses_cfg else conditions

    def prefill(self, runner: ModelRunner, conditions: Conditions) -> StepOutput:
        """The condition rows of these images through `runner`: image token 0's rows and draws."""
        uniforms = self._first_uniforms()
        with self._redrawn(runner):
            return self._restricted(runner.prefill(self.condition_rows(conditions), uniforms), uniforms)

    def reseed(self, position: int, seed: int) -> None:
        """Batch position `position` holds a new image from now on (in-flight batching,
        runtime/scheduling): its counter coordinates are its own seed's, before its first round."""
        self.keys[position] = ImageKey(*seed_halves(seed))

    def admit(self, runner: ModelRunner, positions: Sequence[int], conditions: Conditions) -> StepOutput:
        """`prefill` for the images at batch positions `positions` (one per condition, in order;
        runner.admit: their rows alone, the other images' untouched), each drawn as a prefill draws
        it (reseed them first)."""
        uniforms = np.array([[keyed_uniform(self.keys[p].key, 0, draw_slot(NEXT, 0, 0))] for p in positions],
                            dtype=np.float64)
        with self._redrawn(runner):
            return self._restricted(runner.admit(positions, self.condition_rows(conditions), uniforms), uniforms)

    def run(self, runner: ModelRunner, windows: Windows, uniforms: np.ndarray) -> StepOutput:
        """One step of `runner` over each image's window (one Window for all, or one per image,
        None for none): the sampling distribution of every slot (P and Q alike) and one draw per
        slot, made on the device with `uniforms`: [I] (one per image, every slot of its window) or
        [I, ≥ W] (per slot; W the longest window), from `uniforms` (what the caller's draws are for)."""
        uniforms = self._per_slot(uniforms, int(max(window_sizes(windows, runner.images).max(initial=0), 1)))
        with self._redrawn(runner):
            return self._restricted(runner.step(windows, uniforms), uniforms)

    @staticmethod
    def _per_slot(uniforms: np.ndarray, width: int) -> np.ndarray:
        """uniforms [I] or [I, ≥ width] as the runners take them: [I, width]."""
        uniforms = np.asarray(uniforms, dtype=np.float64)
        if uniforms.ndim == 1:
            return np.repeat(uniforms[:, None], width, axis=1)
        return np.ascontiguousarray(uniforms[:, :width])

    def unused(self, runner: ModelRunner, windows: Windows) -> np.ndarray:
        """Uniforms for a step whose draws nobody reads (a catch-up, a tree level whose children the
        host draws): zeros, [I, W]."""
        return np.zeros((runner.images, int(max(window_sizes(windows, runner.images).max(initial=0), 1))))

    def run_chain(self, runner: ModelRunner, windows: Windows, lengths: Sequence[int], steps: int) -> StepOutput:
        """`runner.chain`: each image's window, then up to `steps` drafts drawn inside one call;
        image i keeps its first lengths[i] (drafts past them are never read); draft j drawn with
        the round's DRAFT uniform at index n + j, as one-token steps would draw it."""
        return runner.chain(windows, steps, self.chain_uniforms(steps))

    def chain_uniforms(self, steps: int) -> np.ndarray:
        """[I, steps]: draft j of each image's chain drawn with the round's DRAFT uniform at index n + j."""
        return self.uniforms(np.arange(steps)[None], DRAFT)

    def run_tree(self, runner: ModelRunner, windows: Windows, layout: TreeLayout, max_depths: Sequence[int],
                 features: Optional[Sequence[Optional[np.ndarray]]] = None) -> StepOutput:
        """`runner.draft_tree`: each image's window, then the static tree `layout` drafted below its
        last slot in one call, node m drawn with the round's CANDIDATE uniform of part m at its token
        index (tree_uniforms; max_depths[i]: the drafts left in image i, deeper nodes never read).
        With `features`, an EAGLE head's tree_pairs over them."""
        uniforms = self.tree_uniforms(layout)
        if features is not None:
            return runner.tree_pairs(windows, features, layout, uniforms)
        return runner.draft_tree(windows, layout, uniforms)

    def tree_uniforms(self, layout: TreeLayout) -> np.ndarray:
        """[I, nodes − 1]: node m of a static shape (its id the shape's) drawn with the round's
        CANDIDATE uniform of part m at index n − 1 + depth(m), as the device round draws it."""
        nodes = np.arange(1, layout.nodes)[None]
        return self.uniforms(np.asarray(layout.depths[1:], dtype=np.int64)[None] - 1, CANDIDATE, nodes)

    def run_chain_pairs(self, head: Any, windows: Windows, features: Sequence[Optional[np.ndarray]],
                        lengths: Sequence[int], steps: int) -> StepOutput:
        """`run_chain` for an EAGLE head (runtime.eagle.HeadRunner.chain_pairs), with the features
        before each image's window tokens, as `run_pairs` is `run`'s."""
        return head.chain_pairs(windows, features, steps, self.chain_uniforms(steps))

    def retain(self, images: Sequence[int]) -> None:
        """Keep only these images (positions in the batch) in the runners and the keys."""
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.retain(images)
        self.keys = [self.keys[i] for i in images]

    def grow(self, mix: np.ndarray) -> None:
        """One more batch position at the end, in the runners (runner.grow, guidance `mix` of the grown
        batch) and the keys (in-flight batching: `reseed` gives it its image's, `admit` prefills it)."""
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.grow(mix)
        self.keys.append(ImageKey(0, 0))

    def run_pairs(self, head: Any, windows: Windows, features: Sequence[Optional[np.ndarray]],
                  uniforms: np.ndarray) -> StepOutput:
        """One step of an EAGLE head (runtime.eagle.HeadRunner): `run`, with the features before
        each image's tokens (features[p] [pairs, W_p, H]; None where image p has no window)."""
        uniforms = self._per_slot(uniforms, int(max(window_sizes(windows, head.images).max(initial=0), 1)))
        with self._redrawn(head):
            return self._restricted(head.step_pairs(windows, features, uniforms), uniforms)

    def _redrawn(self, runner: ModelRunner) -> Any:
        """Around a step whose draws _restricted redraws (greedy, top-k, top-p): the head's own
        draws are left where they are, never read (a device backend's wait saved); else nothing."""
        return draws_left_on_device(runner) if needs_restriction(self.sampling) else nullcontext()

    def _restricted(self, out: StepOutput, uniforms: np.ndarray) -> StepOutput:
        """Greedy, top-k and top-p (sampling.restrict): they need whole rows, and the draws are
        redone on the restricted rows with the same uniforms. Rows that live on a device (the torch
        backend's DeviceRows: `array`, `send`, `receive`) are restricted and drawn from there, and
        only the draws cross; other rows on the host."""
        if not needs_restriction(self.sampling):
            return out
        with self.stats.timing("verification"):
            rows = out.probs
            if hasattr(type(rows), "send"):
                probs = restrict(rows.array, self.sampling)
                draws = rows.receive(inverse_cdf(probs, rows.send(uniforms, "restriction").view(uniforms.shape)))
                return StepOutput(rows.holding(probs), draws, rows if self.sampling.temperature == 0.0 else None)
            raw = np.asarray(out.probs)
            probs = restrict(raw, self.sampling)
            return StepOutput(probs, inverse_cdf(probs, uniforms), raw if self.sampling.temperature == 0.0 else None)

    @property
    def num_image_tokens(self) -> int:
        return self.target.spec.num_image_tokens
