"""AR: one target forward per token, for a whole batch of images at once (the baseline)."""
from __future__ import annotations

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.methods.base import Decoding, Method
from specrt.runtime.window import Window


class Autoregressive(Method):
    """Plain sampling from P, token by token; every image of the batch advances together."""

    name = "ar"

    def generate(self, ctx: Decoding, conditions: Conditions) -> np.ndarray:
        target = ctx.target
        target.truncate(0)
        tokens = np.zeros((len(conditions), ctx.num_image_tokens), dtype=np.int64)
        tokens[:, 0] = ctx.prefill(target, conditions).draws[:, 0]
        ctx.stats.record_round(1, len(conditions))
        slot = Window.chain([0])
        for k in range(1, ctx.num_image_tokens):
            # every row feeds its own token at the same position: a per-row window of one slot
            out = ctx.run(target, slot, _rows(tokens[:, k - 1], ctx)[:, None])
            target.commit([0])
            tokens[:, k] = out.draws[:, 0]
            ctx.stats.record_round(1, len(conditions))
        return tokens


def _rows(image_tokens: np.ndarray, ctx: Decoding) -> np.ndarray:
    """Token ids per model row: the image tokens, repeated for the uncond half under CFG."""
    return np.concatenate([image_tokens, image_tokens]) if ctx.sampling.uses_cfg else image_tokens
