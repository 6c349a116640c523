"""How the drafted loops (runtime.methods.speculative, runtime.methods.tree_loop) use a Drafter
(runtime.drafter): which one a generate call drafts with, and how each verified round is handed back.

Why a module of its own: it is the one place that knows every kind of drafter (an independent
model, runtime.model_drafter; an EAGLE head, runtime.eagle), so neither kind imports the other.
"""
from __future__ import annotations

from typing import Optional, Sequence

from specrt.runtime.decoding import Decoding
from specrt.runtime.drafter import Drafter, Verified
from specrt.runtime.eagle import EagleDrafter, HeadRunner
from specrt.runtime.model_drafter import ModelDrafter
from specrt.runtime.runner import StepOutput


def finish_round(ctx: Decoding, drafter: Drafter, tokens: list[list[int]], images: Sequence[int], scored: StepOutput,
                 paths: Sequence[Optional[list[int]]], new: Sequence[Optional[list[int]]]) -> None:
    """After a round's verification: commit each image's accepted path in the target, hand the
    round to the drafter (rollback, then extend with what was decided) and append the new tokens
    (accepted drafts + the next token) to each image's sequence; None: the image had no round."""
    ctx.target.commit(list(paths))
    drafter.rollback([len(tokens[i]) if n is not None else None for i, n in zip(images, new)])
    drafter.extend(ctx, list(new), Verified(scored, list(paths)))
    for i, n in zip(images, new):
        if n is not None:
            tokens[i] += n
            ctx.stats.record_round(len(n))


def make_drafter(ctx: Decoding, fused: bool = True) -> Drafter:
    """The drafter over this call's draft: an EAGLE head (runtime.eagle.EagleDrafter, fed the
    target's hidden rows) or an independent model (ModelDrafter); `fused`: whether it may draft
    a round in one call (Drafter.fused)."""
    drafter = EagleDrafter(ctx.draft, ctx.target) if isinstance(ctx.draft, HeadRunner) else ModelDrafter(ctx.draft)
    drafter.fused = fused
    return drafter

