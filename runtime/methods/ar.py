"""AR: one target forward per token, for a whole batch of images at once (the baseline)."""
from __future__ import annotations

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.counter_random import NEXT
from specrt.runtime.decoding import Decoding
from specrt.runtime.methods.base import Method


class Autoregressive(Method):
    """Plain sampling from P, token by token; every image of the batch advances together."""

    name = "ar"
    lossless = True
    auto_settings = ({},)  # the baseline every choice is measured against

    def generate(self, ctx: Decoding, conditions: Conditions) -> np.ndarray:
        target = ctx.target
        target.truncate(0)
        tokens = np.zeros((len(conditions), ctx.num_image_tokens), dtype=np.int64)
        tokens[:, 0] = ctx.prefill(target, conditions).draws[:, 0]
        ctx.stats.record_round(1, len(conditions))
        for k in range(1, ctx.num_image_tokens):
            # every image feeds its own last token at its next position: a window of one slot each,
            # token k drawn with the round's NEXT uniform at index k
            ctx.start_round([k] * len(conditions))
            out = ctx.run(target, tokens[:, k - 1:k], ctx.uniforms(0, NEXT))
            target.commit([0])
            tokens[:, k] = out.draws[:, 0]
            ctx.stats.record_round(1, len(conditions))
        return tokens
