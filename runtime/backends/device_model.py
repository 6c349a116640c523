"""A model as the device round calls it: a window of tokens per image in, sampling rows out, no host.

Why not the TorchRunner's step: the runner takes numpy windows, a mask built on the host and
lengths kept in host arrays, and commits by copying accepted rows — every step starts and ends on
the host. The round (runtime/rounds) keeps each image's length on the device, so here a step is
a function of device tensors alone: image i's W tokens sit at token indices first[i] .. first[i] + W − 1,
their keys/values are scattered straight to those columns of one static buffer
(models.kv_cache.ColumnCache), and the mask and positions are derived from `first` on the device.
A rejected token's columns are overwritten by a later round; nothing is ever copied down.

Rows of the buffer are the CFG rows of the images (row k·images + i is image i's twin k, as the
guidance matrix orders them), so an image's tokens are fed to all its rows and the head mixes
them back into one distribution per image (runtime/head.py).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.sampling import SamplingParams, needs_restriction, restrict


class DeviceModel:
    """One model (a specrt.models GPT) with its own KV buffer for a generate call's images.

    The buffer's columns: the condition's, then every image token a round may write (the image's
    tokens and one window past its end), then `window` scratch columns where a tree window's slots
    are written (siblings share a token index) until commit_path copies the accepted ones down.
    `run_layer` is how a transformer block runs (the runner's compiled one, or eagerly)."""

    def __init__(self, torch: Any, gpt: Any, mix: np.ndarray, sampling: SamplingParams, tokens: int, window: int,
                 run_layer: Any = None):
        self.torch, self.gpt, self.sampling, self.run_layer = torch, gpt, sampling, run_layer
        parameter = next(gpt.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.mix = torch.from_numpy(np.ascontiguousarray(mix, dtype=np.float32)).to(self.device)
        self.images, rows = mix.shape
        self.row_image = torch.arange(rows, device=self.device) % self.images
        self.prefix = int(gpt.config.cond_len)
        self.scratch = self.prefix + tokens + window + 1  # the first scratch column
        self.width = self.scratch + window
        cfg = gpt.config
        self.kv = torch.zeros((cfg.n_layer, 2, rows, cfg.n_kv_head, self.width, cfg.head_dim),
                              dtype=self.dtype, device=self.device)
        self.column_index = torch.arange(self.width, device=self.device)
        self.row_dtype = torch.float64 if needs_restriction(sampling) else torch.float32  # what distribution gives
        # the condition's columns every image token sees (a padded caption's stay hidden): set by prefill
        self.prefix_mask = (self.column_index < self.prefix)[None, :].repeat(rows, 1)
        self.hidden: Any = None  # the last pass's final-norm hidden states [rows, W, H]: what an EAGLE head reads

    def prefill(self, rows: Conditions, images: Optional[Sequence[int]] = None) -> Any:
        """The condition rows through the model, their keys/values into the buffer's first columns:
        the sampling rows [images, V] image token 0 is drawn from. `images`: in-flight admission
        (runtime/scheduling/round_slots.py) — `rows` are those images' condition rows (twin-major, as
        condition_rows makes them), written to their model rows only (image_rows), in place, the
        other images' untouched, in one pass for them all; their rows [len(images), V]."""
        from specrt.runtime.backends.torch_backend import prefill_inputs

        inputs = prefill_inputs(self.torch, rows, self.device, self.dtype)
        logits, self.hidden, present = self.gpt.prefill(*inputs)
        model_rows = slice(None) if images is None else self.image_rows(images)
        self.kv[:, :, model_rows, :, : present.shape[4]] = present.to(self.dtype)
        if rows.caption_mask is not None:  # padded caption columns stay hidden from every image token
            self.prefix_mask[model_rows, : self.prefix] = self.torch.from_numpy(rows.caption_mask).to(self.device)
        elif images is not None:  # the condition's every column, whatever the slots' last images hid
            self.prefix_mask[model_rows, : self.prefix] = True
        chosen = None if images is None else self.torch.as_tensor(list(images), device=self.device)
        mix = self.mix if chosen is None else self.mix[chosen][:, model_rows]
        return self.distribution(logits, mix)[:, 0]

    def image_rows(self, images: Sequence[int]) -> Any:
        """These images' model rows, twin-major (twin k of each in turn: k·images + image), as
        condition_rows orders a batch's rows: int64 [rows // self.images · len(images)]."""
        twins = self.row_image.shape[0] // self.images
        chosen = self.torch.as_tensor(list(images), dtype=self.torch.int64, device=self.device)
        return (self.torch.arange(twins, device=self.device)[:, None] * self.images + chosen[None, :]).reshape(-1)

    def window(self, ids: Any, index: Any) -> Any:
        """Image i's tokens ids [images, W] at token indices index [images, W] (a chain: ascending, each
        slot seeing the image's tokens up to its own index; a repeated index is the same token fed
        twice): their keys/values written to those columns, and the sampling rows [images, W, V]
        that follow each."""
        columns = self.prefix + index[self.row_image]  # [rows, W]: token index + the condition's columns
        column = self.column_index[None, None, :]
        seen = (column >= self.prefix) & (column <= columns[:, :, None])  # the image's tokens up to the slot's own
        return self._run(ids[self.row_image], columns, columns, self.prefix_mask[:, None, :] | seen)

    def tree_window(self, ids: Any, depths: Any, ancestry: Any, start: Any, slots: Any = None) -> Any:
        """A tree window: image i's W tokens ids [images, W] at depths [images or 1, W] below its token
        start[i] (depth 0: that token itself), each seeing the scratch columns its row of ancestry
        [images or 1, W, A] marks (scratch offsets 0..A − 1: its ancestors and itself) and the committed
        token columns before start[i]. Keys/values go to the scratch columns, slot j to
        scratch + slots[j] (default j); the sampling rows [images, W, V] that follow each slot."""
        window = ids.shape[1]
        rows = self.row_image.shape[0]
        by_row = lambda t: t[self.row_image] if t.shape[0] == self.images and self.images > 1 else t  # noqa: E731
        rows_start = start[self.row_image]
        positions = self.prefix + rows_start[:, None] + by_row(depths)
        offsets = self.torch.arange(window, device=self.device) if slots is None else slots
        columns = (self.scratch + offsets)[None, :].expand(rows, window)
        column = self.column_index[None, :]
        seen = self.prefix_mask | ((column >= self.prefix) & (column < self.prefix + rows_start[:, None]))
        scratch = self.torch.zeros((rows, window, self.width), dtype=self.torch.bool, device=self.device)
        scratch[:, :, self.scratch:self.scratch + ancestry.shape[-1]] = by_row(ancestry)
        return self._run(ids[self.row_image], positions.expand(rows, window), columns, seen[:, None, :] | scratch)

    def commit_path(self, slots: Any, start: Any) -> None:
        """Copy the keys/values of tree-window slots [images, P] (the accepted path, depth by depth)
        from their scratch columns to their tokens' columns start[i] + 0..P − 1. Slots past an image's
        accepted path copy into columns past its committed length, which later rounds overwrite."""
        rows_slots, rows_start = slots[self.row_image], start[self.row_image]
        layers, two, rows, heads, _, dim = self.kv.shape
        count = slots.shape[1]
        shape = (layers, two, rows, heads, count, dim)
        source = (self.scratch + rows_slots)[None, None, :, None, :, None].expand(shape)
        target = (self.prefix + rows_start[:, None] + self.torch.arange(count, device=self.device))
        self.kv.scatter_(4, target[None, None, :, None, :, None].expand(shape), self.kv.gather(4, source))

    def _run(self, row_ids: Any, positions: Any, columns: Any, mask: Any) -> Any:
        from specrt.models.kv_cache import ColumnCache

        logits, self.hidden, _ = self.gpt.step(row_ids, positions, mask, ColumnCache(self.kv, columns), self.run_layer)
        return self.distribution(logits)

    def distribution(self, logits: Any, mix: Any = None) -> Any:
        """The sampling distribution [images, W, V] of the model rows' logits: CFG and temperature
        (the head's mix; `mix`: another guidance matrix over these rows), then top-k / top-p / greedy
        where the user asked for them, on the device."""
        from specrt.runtime.head import SamplingHead

        probs = SamplingHead.distribution(logits, self.mix if mix is None else mix)
        return restrict(probs, self.sampling) if needs_restriction(self.sampling) else probs


def device_model_of(runner: Any, mix: np.ndarray, sampling: SamplingParams, window: int) -> DeviceModel:
    """A DeviceModel over a TorchRunner's module, with its compiled block when it has one."""
    run_layer = runner.compiled.run_layer if runner.compiled is not None else None
    return DeviceModel(runner.torch, runner.gpt, mix, sampling, runner.spec.num_image_tokens, window, run_layer)
