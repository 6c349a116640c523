"""A continuous model (transformer + diffusion head) as the device round calls it: tensors in, tensors out.

Why not the ContinuousRunner: the runner takes numpy windows, builds the mask on the host from
lengths it keeps in host arrays, and commits by copying accepted rows, so every step starts and
ends on the host. Here image i's window sits at the positions the round passes (device tensors),
the mask is derived from them on the device, and every layer writes the window's keys/values
straight to their positions' columns of one static buffer per model, in place
(models.kv_cache.ColumnCache, the discrete device round's form): columns before the window's
first position hold the image's committed tokens, and whatever a round writes past them (drafts
later rejected, an unfinished image's scratch, a finished image's padding) is overwritten before
anything reads it. Attention reads the buffer as it lies, under that mask: no layer copies it.

Rows are the model rows of the images: [images] or, under CFG, [images; their unconditional twins]
(class id num_classes), as the runner orders them; a chain's head runs on both rows of every
token and guides ε̂ (formulas.guided_head) before the chain uses it.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

import specrt.runtime.families.continuous.formulas as continuous


class ContinuousDeviceModel:
    """One MAR-style module (specrt.models.mar) with its own KV buffer for a batch of images.

    `columns`: positions a window may write, 0 .. columns − 1 (the class token's, seq_len tokens'
    and the widest window past an image's end). `cfg_scale` 1 runs one row an image. `run_layer`
    runs each block (a compiled one: runtime.backends.compiled_step), default eagerly."""

    def __init__(self, torch: Any, mar: Any, class_ids: np.ndarray, cfg_scale: float, columns: int,
                 run_layer: Optional[Any] = None):
        self.torch, self.mar, self.run_layer = torch, mar, run_layer
        cfg = mar.cfg
        parameter = next(mar.parameters())
        self.device = parameter.device
        self.schedule = continuous.ddpm_schedule(cfg.schedule, cfg.diffusion_steps, cfg.beta_start, cfg.beta_end)
        self.images, self.seq_len = len(class_ids), cfg.seq_len
        self.pairs = 1 if cfg_scale == 1.0 else 2
        rows = self._rows(class_ids)
        self.class_ids = rows.to(self.device)
        self.row_image = torch.arange(len(rows), device=self.device) % self.images
        shape = (cfg.n_layer, 2, len(rows), cfg.n_head, columns, cfg.head_dim)  # kv_cache's layout
        self.kv = torch.zeros(shape, dtype=parameter.dtype, device=self.device)
        self.column_index = torch.arange(columns, device=self.device)
        self.scale = cfg_scale  # the call's guidance scale, where a row has no scale of its own

    def restart(self, class_ids: np.ndarray) -> None:
        """The same buffers for a new call of as many images (a captured round replays over them)."""
        self.class_ids.copy_(self._rows(class_ids))

    def admit(self, image: int, class_id: int) -> None:
        """A new image in image slot `image` (in-flight batching): its class id in its conditional row
        (its unconditional twin keeps the null class) and its KV rows zeroed — in place, so a captured
        round replays over the same buffers. The zeroing is hygiene, not what exactness rests on: the
        mask hides every column past a position until the image's own window has written it."""
        self.class_ids[image] = class_id
        self.kv[:, :, image::self.images].zero_()  # rows image, image + images, ...: its pairs' rows

    def _rows(self, class_ids: np.ndarray) -> Any:
        """The model rows' class ids (host tensor): [classes] or [classes; unconditional]."""
        ids = np.asarray(class_ids, dtype=np.int64)
        rows = np.concatenate([ids] + [np.full_like(ids, self.mar.cfg.num_classes)] * (self.pairs - 1))
        return self.torch.from_numpy(np.ascontiguousarray(rows))

    def window(self, inputs: Any, positions: Any) -> Any:
        """Image i's inputs [images, W, C] at positions [images, W] (consecutive and ascending, but that
        a position may repeat, the same input fed twice; position 0 is the class token, its input
        ignored): the conditions z [pairs, images, W, D] of the tokens that follow each slot, the slots'
        keys/values written to their positions' columns. A slot sees every column up to its own
        position: the image's committed ones before the window, then the window's slots up to itself."""
        from specrt.models.kv_cache import ColumnCache

        rows_positions = positions[self.row_image]
        mask = self.column_index[None, None, :] <= rows_positions[:, :, None]  # [rows, W, columns]
        z, _ = self.mar.transformer.decode_step(
            inputs[self.row_image], self.class_ids, rows_positions.clamp(max=self.seq_len), mask,
            ColumnCache(self.kv, rows_positions), self.run_layer)
        return z.reshape(self.pairs, self.images, *z.shape[1:])

    def sample(self, z: Any, noise: Any, temperature: float, cfg_scales: Optional[Any] = None) -> tuple[Any, Any]:
        """Tokens from conditions z [pairs, R, D] on noise [T+1, R, C] (formulas.chain): (x_0, the last
        step's mean), rows guided at cfg_scales [R] (None: the call's one scale)."""
        scales = self.scale if cfg_scales is None else cfg_scales
        head = lambda x, t, zz: continuous.guided_head(self.mar.head, x, t, zz, scales)  # noqa: E731
        return continuous.chain(head, z, noise, self.schedule, temperature)
