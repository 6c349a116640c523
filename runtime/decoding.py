"""The decoding context of one generate call: the models, the sampling distribution, one random
stream per image, and the counters.

Every model call a method or a drafter makes goes through it (prefill, run, run_chain, run_tree,
run_pairs), so each image's uniforms come from its own stream in the order the step-by-step and
level-by-level paths draw them, whatever call the runner offers, and the host restrictions of the
rows (greedy, top-k, top-p) are applied in one place. It sits below the drafters (runtime.drafter)
and the methods (runtime.methods), which both call it.
What the images are conditioned on (class ids or captions, runtime.conditions) passes through
untouched: methods only count it and hand it to Decoding.prefill.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions, as_conditions
from specrt.runtime.runner import ModelRunner, StepOutput, draws_left_on_device, window_sizes
from specrt.runtime.sampling import SamplingParams, inverse_cdf, needs_restriction, restrict
from specrt.runtime.stats import Stats
from specrt.runtime.tree_call import TreeLayout
from specrt.runtime.window import Windows, lone_window


@dataclass
class Decoding:
    """The models, sampling distribution, random streams and counters of one generate call.

    `rngs` holds one random stream per image of the batch, in batch order: everything random
    about image i (its uniforms for the sampling head, its verification coins, its random
    drafts) comes from rngs[i] alone, so an image does not depend on what else is decoded
    with it. `retain` keeps both in step when finished images leave the runners' batch.
    """

    target: ModelRunner
    draft: Optional[ModelRunner]
    sampling: SamplingParams
    rngs: list[np.random.Generator]
    stats: Stats
    # a unified model's image grammar (runtime/grammar.py): the models already force its tokens;
    # methods that make up drafts without a model (SJD's fresh window slots) draft forced tokens as
    # what they must be and sampled ones from the codes only
    grammar: Optional[Any] = None

    @property
    def rng(self) -> np.random.Generator:
        """The random stream of a one-image context (`image(i)` makes one)."""
        if len(self.rngs) != 1:
            raise ValueError(f"a context of {len(self.rngs)} images has one stream per image: use rngs[i] or image(i)")
        return self.rngs[0]

    def image(self, i: int) -> "Decoding":
        """The same context narrowed to image i's random stream (for per-image verification code);
        a one-image context is its own (a copy per image and round costs more than the host work it serves)."""
        if len(self.rngs) == 1 and i == 0:
            return self
        return replace(self, rngs=[self.rngs[i]])

    def condition_rows(self, conditions: Conditions) -> Conditions:
        """Model batch for these images: [cond; uncond] when CFG is on (null class, or the
        uncond caption flag), the images' own conditions otherwise."""
        conditions = as_conditions(conditions)
        return conditions.with_uncond(self.target.spec.null_class) if self.sampling.uses_cfg else conditions

    def prefill(self, runner: ModelRunner, conditions: Conditions) -> StepOutput:
        """The condition rows of these images through `runner`: image token 0's rows and draws."""
        uniforms = self._uniforms([1] * runner.images)
        with self._redrawn(runner):
            return self._restricted(runner.prefill(self.condition_rows(conditions), uniforms), uniforms)

    def run(self, runner: ModelRunner, windows: Windows) -> StepOutput:
        """One step of `runner` over each image's window (one Window for all, or one per image,
        None for none): the sampling distribution of every slot (P and Q alike) and one draw per
        slot, made on the device with uniforms from each image's own stream."""
        if isinstance(windows, np.ndarray) and len(windows) == len(self.rngs):  # chains of one width
            if len(self.rngs) == 1:
                uniforms = self.rngs[0].random(windows.shape)
            else:
                uniforms = np.empty(windows.shape)
                for row, rng in zip(uniforms, self.rngs):
                    rng.random(out=row)
        elif len(self.rngs) == 1 and (lone := lone_window(windows)) is not None:
            uniforms = self.rngs[0].random((1, len(lone)))  # one image's window (a tree level): one draw
        else:
            uniforms = self._uniforms(window_sizes(windows, runner.images))
        with self._redrawn(runner):
            return self._restricted(runner.step(windows, uniforms), uniforms)

    def run_chain(self, runner: ModelRunner, windows: Windows, lengths: Sequence[int], steps: int) -> StepOutput:
        """`runner.chain`: each image's window, then up to `steps` drafts drawn inside one call;
        image i keeps its first lengths[i] (drafts past them are never read), with uniforms from
        its own stream as the step-by-step loop draws them (_chain_uniforms)."""
        return runner.chain(windows, steps, self._chain_uniforms(windows, runner.images, lengths, steps))

    def run_tree(self, runner: ModelRunner, windows: Windows, layout: TreeLayout, max_depths: Sequence[int],
                 features: Optional[Sequence[Optional[np.ndarray]]] = None) -> StepOutput:
        """`runner.draft_tree`: each image's window, then the static tree `layout` drafted below its
        last slot in one call, with uniforms from each image's own stream in the order the
        level-by-level drafter draws them (_tree_uniforms; max_depths[i]: the drafts left in
        image i). With `features`, an EAGLE head's tree_pairs over them."""
        sizes = window_sizes(windows, runner.images).tolist()
        uniforms = self._tree_uniforms(layout, sizes, max_depths)
        if features is not None:
            return runner.tree_pairs(windows, features, layout, uniforms)
        return runner.draft_tree(windows, layout, uniforms)

    def run_chain_pairs(self, head: Any, windows: Windows, features: Sequence[Optional[np.ndarray]],
                        lengths: Sequence[int], steps: int) -> StepOutput:
        """`run_chain` for an EAGLE head (runtime.eagle.HeadRunner.chain_pairs), with the features
        before each image's window tokens, as `run_pairs` is `run`'s."""
        return head.chain_pairs(windows, features, steps, self._chain_uniforms(windows, head.images, lengths, steps))

    def _chain_uniforms(self, windows: Windows, images: int, lengths: Sequence[int], steps: int) -> np.ndarray:
        """[images, steps] uniforms of a chain call: image i draws its window's from its own stream,
        as `run` would (the last one draws its first draft), then one per later draft it keeps
        (lengths[i] in all): its drafts are the ones `run` on the window and lengths[i] − 1
        one-token runs would draw, and its stream ends where theirs would."""
        sizes = [windows.shape[1]] * images if isinstance(windows, np.ndarray) else window_sizes(windows, images).tolist()
        uniforms = np.zeros((images, steps))
        for row, rng, size, count in zip(uniforms, self.rngs, sizes, lengths):
            if size and count > 0:  # the window's size uniforms (the last kept), then count − 1: one draw
                row[:count] = rng.random(size + count - 1)[size - 1:]
        return uniforms

    def _tree_uniforms(self, layout: TreeLayout, sizes: Sequence[int], max_depths: Sequence[int]) -> np.ndarray:
        """[images, nodes − 1] uniforms of a one-call tree: image i takes its window's sizes[i] from
        its stream (the last draws the root's first child), then one per node it draws, in the
        layout's `uniform_order`; zeros where it draws nothing (no window, nodes past its max_depth)."""
        uniforms = np.zeros((len(self.rngs), layout.nodes - 1))
        for row, rng, size, depth in zip(uniforms, self.rngs, sizes, max_depths):
            if size and depth > 0:
                order = layout.uniform_order(depth)
                row[np.array(order) - 1] = rng.random(size - 1 + len(order))[size - 1:]
        return uniforms

    def _uniforms(self, sizes: Sequence[int]) -> np.ndarray:
        """[images, longest] uniforms: image i's first sizes[i] from its stream, zeros past them."""
        sizes = sizes.tolist() if isinstance(sizes, np.ndarray) else [int(size) for size in sizes]
        out = np.zeros((len(sizes), max(max(sizes, default=1), 1)))
        for row, (rng, size) in enumerate(zip(self.rngs, sizes)):
            if size:
                rng.random(out=out[row, :size])
        return out

    def retain(self, images: Sequence[int]) -> None:
        """Keep only these images (positions in the batch) in the runners and the streams."""
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.retain(images)
        self.rngs = [self.rngs[i] for i in images]

    def run_pairs(self, head: Any, windows: Windows, features: Sequence[Optional[np.ndarray]]) -> StepOutput:
        """One step of an EAGLE head (runtime.eagle.HeadRunner): `run`, with the features before
        each image's tokens (features[p] [pairs, W_p, H]; None where image p has no window)."""
        uniforms = self._uniforms(window_sizes(windows, head.images))
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
