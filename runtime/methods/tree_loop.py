"""Tree drafting for the draft-then-verify methods (sd, cool-sd, lantern with tree=static|dynamic).

One round: the drafter grows a TokenTree below the pending token (runtime.tree: a static shape,
children drawn without replacement; or EAGLE-2's dynamic tree, top-k children kept by cumulative
draft probability); the target scores every node in one pass with the tree mask; verify_tree
walks it with the method's acceptance rule (recursive rejection over siblings), and the accepted
path's KV rows are committed. Images are decoded one at a time (with their CFG pair).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.drafting import Verified, make_drafter
from specrt.runtime.methods.base import Decoding
from specrt.runtime.tree import draft_dynamic, draft_static, static_shape
from specrt.runtime.verification import verify_tree

if TYPE_CHECKING:  # pragma: no cover
    from specrt.runtime.methods.speculative import DraftThenVerify


def generate_tree_one(method: "DraftThenVerify", ctx: Decoding, condition: Conditions) -> np.ndarray:
    """Tokens [grid²] of one image, drafted as trees and verified with method.rule(ctx)."""
    target = ctx.target
    rule = method.rule(ctx)
    first = method.start(ctx, target, condition)
    tokens = [int(first.draws[0, 0])]
    drafter = make_drafter(ctx)
    drafter.start(ctx, condition, tokens[0], first)
    shape = static_shape(method.static_tree) if method.tree == "static" else None
    ctx.stats.record_round(1)
    while len(tokens) < ctx.num_image_tokens:
        max_depth = ctx.num_image_tokens - len(tokens) - 1  # drafts that still fit in the image
        if shape is not None:
            tree = draft_static(ctx, drafter, tokens[-1], shape, max_depth)
        else:
            tree = draft_dynamic(ctx, drafter, tokens[-1], method.depth, method.tree_top_k, method.total_tokens,
                                 max_depth)
        scored = ctx.run(target, tree.window())
        with ctx.stats.timing("verification"):
            outcome = verify_tree(scored.probs[0], tree, rule, ctx.rng, scored.draws[0])
        target.commit(outcome.path)
        new = outcome.accepted + [outcome.next_token]
        drafter.rollback(len(tokens))
        drafter.extend(ctx, new, Verified(scored, outcome.path))
        tokens += new
        ctx.stats.record_round(len(new))
    return np.asarray(tokens, dtype=np.int64)
