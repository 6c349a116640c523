"""An EAGLE head as the device round calls it: a DeviceModel whose steps also take a feature per token.

Why a DeviceModel: the head has the same needs in a round as a draft model — its own KV buffer
written in place at per-row columns, masks and positions made on the device from each image's
length, tree windows in scratch columns — so it reuses all of that and changes two things. Its
steps take the pair (feature before the token, token) and keep the head's own features `hidden`
[rows, W, H] (EAGLE's recursion feeds them to the next drafts); and it has no prefill: its rows
mirror the target's sequence positions (docs/contracts.md, "EAGLE heads"), so the condition's
columns are never written and every step hides them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from specrt.runtime.backends.device_model import DeviceModel
from specrt.runtime.sampling import SamplingParams


class DeviceHead(DeviceModel):
    """An EAGLE head's module with its own KV buffer for a generate call's images (DeviceModel's
    columns; the condition's are hidden). `pairs` and `tree_pairs` are DeviceModel's window and
    tree_window with the features [rows, W, H] before each token (model rows: an image's CFG twins
    each have their own feature, as the target's rows gave them)."""

    def __init__(self, torch: Any, head: Any, mix: np.ndarray, sampling: SamplingParams, tokens: int, window: int):
        super().__init__(torch, head, mix, sampling, tokens, window)
        self.prefix_mask.fill_(False)  # no pairs at the condition positions
        self.features: Any = None  # the pass's input features, set by pairs / tree_pairs

    def prefill(self, rows: Any) -> Any:
        raise AssertionError("an EAGLE head has no prefill: its first pair is image token 0's")

    def pairs(self, ids: Any, index: Any, features: Any) -> Any:
        """window(ids, index) over the pairs (features [rows, W, H], ids [images, W]): the sampling rows
        [images, W, V]; the head's own features in `hidden`."""
        self.features = features
        return self.window(ids, index)

    def tree_pairs(self, ids: Any, depths: Any, ancestry: Any, start: Any, features: Any, slots: Any = None) -> Any:
        """tree_window over the pairs (features [rows, W, H]): the sampling rows; the head's features in `hidden`."""
        self.features = features
        return self.tree_window(ids, depths, ancestry, start, slots)

    def _run(self, row_ids: Any, positions: Any, columns: Any, mask: Any) -> Any:
        from specrt.models.kv_cache import ColumnCache

        logits, self.hidden, _ = self.gpt.step(row_ids, self.features.to(self.dtype), positions, mask,
                                               ColumnCache(self.kv, columns))
        return self.distribution(logits)


def device_head_of(runner: Any, mix: np.ndarray, sampling: SamplingParams, window: int) -> DeviceHead:
    """A DeviceHead over a TorchHeadRunner's module (eager: a head's one layer gains little compiled)."""
    return DeviceHead(runner.torch, runner.gpt, mix, sampling, runner.spec.num_image_tokens, window)
