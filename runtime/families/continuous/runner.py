"""The runner of a continuous-token model (family "continuous"): transformer step + diffusion head.

Beside runtime/runner.py's ModelRunner (discrete heads that sample on the device), not a
subclass of it: the step here returns the per-token condition z instead of probabilities,
and sampling is a chain of diffusion-head calls the method drives (runtime/families/continuous/formulas.py).
It has the same shape for batches, though: the runner decodes a batch of images, model rows
[image 0..N−1] or, under CFG, [images; their unconditional twins] (row i + N is image i's
twin, class id num_classes). It owns the KV cache [L, rows, H, seq_len + 1, hd] (allocated when
the rows change) and each image's committed length (`lengths`, shared by its twin): `step`
runs one window per image after its own cache (ragged: shorter windows are padded, a pad slot
sits at the image's next position and sees only the image's cache and itself, and is never
committed; an image with no window at all is left out of the pass where the backend allows,
`steps_active_only`), `commit(counts)` appends the first n_i present rows of image i's window, so
a rejected draft costs nothing, `truncate` rolls images back, `retain` drops finished images and
`admit` starts a new image in a finished one's place (in-flight batching).
Under CFG the head runs on both rows of every chain and guides ε̂ (continuous.guided_eps)
before the chain uses it. Backends implement two hooks; one that keeps the cache itself (the
PyTorch backend's static buffer, written in place) also replaces the four cache hooks.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

import specrt.runtime.families.continuous.formulas as continuous
from specrt.errors import SpecrtError
from specrt.runtime.families.continuous.formulas import Schedule
from specrt.runtime.siblings import twin_runner

# What step takes: one [W,C] window for every image, [N,W,C] (one per image, all W wide), or a
# list with one [W_i,C] window per image (None: nothing to run for that image).
ContinuousWindows = Union[np.ndarray, Sequence[Optional[np.ndarray]]]


@dataclass(frozen=True)
class ContinuousSpec:
    """What the runtime needs to know about a continuous model (manifest 'models.<role>')."""

    token_dim: int
    seq_len: int
    num_classes: int
    n_layer: int
    n_head: int
    head_dim: int
    hidden: int
    diffusion_steps: int
    schedule: str
    beta_start: float = 1e-4
    beta_end: float = 0.02

    def diffusion(self) -> Schedule:
        return continuous.ddpm_schedule(self.schedule, self.diffusion_steps, self.beta_start, self.beta_end)


def step_inputs(lengths: np.ndarray, sizes: np.ndarray, width: int, past: int,
                seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """positions [N,W] int64 and attention_mask [N,W,past+W] bool of a ragged window.

    Image i has `lengths[i]` committed positions and a window of `sizes[i]` ≤ W slots: slot w
    sits at position lengths[i] + w and sees the image's cache (columns < lengths[i] of the
    `past` passed) and the window's slots up to itself; a pad slot (w ≥ sizes[i]) sits at the
    image's next positions (clamped to the table) and sees the cache and itself only."""
    slots = np.arange(width)
    positions = np.minimum(lengths[:, None] + slots[None, :], seq_len).astype(np.int64)
    mask = np.empty((len(lengths), width, past + width), dtype=bool)
    mask[:, :, :past] = np.arange(past)[None, None, :] < lengths[:, None, None]
    causal = slots[:, None] >= slots[None, :]
    real = slots[None, :] < sizes[:, None]
    mask[:, :, past:] = np.where(real[:, :, None], causal[None], np.eye(width, dtype=bool)[None])
    return positions, mask


class ContinuousRunner(ABC):
    """One continuous model (target or draft) decoding a batch of images.

    Counters: `forwards` (transformer steps, one per graph run), `image_forwards` (images those
    runs advanced), `head_calls` (diffusion-head calls), `forward_seconds` (time inside both).
    """

    # Finished images leave the batch at once (Batched.drop): moving KV rows is cheap next to a step.
    retain_share = 0.0
    # whether a device round (rounds.py) can run this model, and whether it sits on an accelerator
    device_rounds = False
    on_accelerator = False
    # whether a step runs only the rows of images that have a window (host arrays, gathered per step
    # anyway); a backend whose cache stays in one static buffer runs every row
    steps_active_only = True

    # the runner can make a `sibling` (runtime/siblings.py): its model shared, its cache its own
    siblings = True

    def __init__(self, spec: ContinuousSpec):
        self.spec = spec
        self.schedule = spec.diffusion()
        self._unallocated()

    def _unallocated(self) -> None:
        """The state before the first batch: no cache, counters at 0 (a backend adds its own buffers,
        calling this), so a sibling starts from it."""
        spec = self.spec
        self.lengths = np.zeros(0, dtype=np.int64)  # committed positions of each image (position 0 = class)
        self.forwards = self.image_forwards = self.head_calls = 0
        self.forward_seconds = 0.0
        self.cfg_scale = 1.0
        self._class_ids = np.zeros(0, dtype=np.int64)
        self._k = self._v = np.zeros((spec.n_layer, 0, spec.n_head, 0, spec.head_dim), dtype=np.float32)
        self._present: tuple[np.ndarray, np.ndarray] | None = None
        self._sizes = np.zeros(0, dtype=np.int64)  # the last window's size per image

    def sibling(self) -> "ContinuousRunner":
        """A runner over the same model (sessions or module shared) with a cache and counters of its
        own: an in-flight scheduler's second group's batch (runtime/siblings.py)."""
        return twin_runner(self)

    # ---- hooks a backend implements ------------------------------------------------------

    @abstractmethod
    def _transformer(self, tokens: np.ndarray, class_ids: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                     past_k: np.ndarray, past_v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """tokens [B,W,C] f32, class_ids [B] i64, positions [B,W] i64, mask [B,W,P+W] bool,
        past [L,B,H,P,hd] -> (z [B,W,D], present_k, present_v [L,B,H,W,hd])."""

    @abstractmethod
    def _head(self, x: np.ndarray, t: np.ndarray, z: np.ndarray) -> np.ndarray:
        """x [R,C] f32, t [R] i64, z [R,D] f32 -> ε̂ [R,C] f32."""

    # ---- the KV cache: host arrays passed to the step and handed back (the graphs' contract) ------

    def _new_cache(self, rows: int) -> None:
        """An empty cache [L, rows, H, capacity, hd] for a new batch (kept where the shape is the same)."""
        shape = (self.spec.n_layer, rows, self.spec.n_head, self.capacity, self.spec.head_dim)
        if self._k.shape != shape:
            self._k = np.zeros(shape, dtype=np.float32)
            self._v = np.zeros(shape, dtype=np.float32)

    def _run_window(self, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray, past: int,
                    rows: Optional[np.ndarray] = None) -> np.ndarray:
        """The transformer over the windows of model rows `rows` (None: every row) after `past` cache
        columns (mask [B,W,past+W]): z [all rows,W,D] (zeros for rows not run); the window's
        keys/values are kept for commit."""
        index = slice(None) if rows is None else rows
        past_k = np.ascontiguousarray(self._k[:, index, :, :past])
        past_v = np.ascontiguousarray(self._v[:, index, :, :past])
        z, present_k, present_v = self._transformer(tokens, self._class_ids[index], positions, mask, past_k, past_v)
        z, present_k, present_v = np.asarray(z), np.asarray(present_k), np.asarray(present_v)
        if rows is not None:  # the rows not run get zeros: never read, never committed (their windows are empty)
            everyone = len(self._class_ids)
            z = _spread(z, rows, everyone, axis=0)
            present_k, present_v = (_spread(a, rows, everyone, axis=1) for a in (present_k, present_v))
        self._present = (present_k, present_v)
        return z

    def _write_rows(self, rows: Union[slice, np.ndarray], columns: Union[slice, np.ndarray],
                    slots: Union[slice, np.ndarray]) -> None:
        """Copy the last window's slots to these cache columns of these model rows (slices: one block)."""
        present_k, present_v = self._present
        self._k[:, rows, :, columns] = present_k[:, rows, :, slots]
        self._v[:, rows, :, columns] = present_v[:, rows, :, slots]

    def _keep_rows(self, rows: np.ndarray) -> None:
        """Keep only these model rows of the cache, in this order."""
        self._k, self._v = np.ascontiguousarray(self._k[:, rows]), np.ascontiguousarray(self._v[:, rows])

    # ---- the interface the continuous methods use ----------------------------------------------

    @property
    def capacity(self) -> int:
        """Positions per image: the class token and seq_len tokens."""
        return self.spec.seq_len + 1

    @property
    def images(self) -> int:
        return len(self.lengths)

    @property
    def pairs(self) -> int:
        """Model rows per image: 1, or 2 under CFG ([cond; uncond])."""
        return len(self._class_ids) // self.images if self.images else 1

    @property
    def class_ids(self) -> np.ndarray:
        """The model rows of the batch: [classes] or [classes; unconditional]."""
        return self._class_ids

    @property
    def length(self) -> int:
        """The committed length shared by every image (one image, or lockstep); ragged batches
        read `lengths`."""
        if len(self.lengths) and np.any(self.lengths != self.lengths[0]):
            raise ValueError("the images of this batch have different lengths: read runner.lengths")
        return int(self.lengths[0]) if len(self.lengths) else 0

    def start(self, class_ids: int | Sequence[int] | np.ndarray, cfg_scale: float = 1.0) -> None:
        """Begin a batch of images of these classes: empty caches; rows [classes] or, when
        cfg_scale != 1, [classes; unconditional] (class id num_classes)."""
        ids = np.atleast_1d(np.asarray(class_ids, dtype=np.int64))
        rows = ids if cfg_scale == 1.0 else np.concatenate([ids, np.full_like(ids, self.spec.num_classes)])
        self._class_ids = rows
        self.cfg_scale = cfg_scale
        self._new_cache(len(rows))
        self.lengths = np.zeros(len(ids), dtype=np.int64)
        self._sizes = np.zeros(len(ids), dtype=np.int64)
        self._present = None

    def admit(self, image: int, class_id: int) -> None:
        """Batch position `image` holds a new image of `class_id` (its CFG twin stays unconditional)
        from its class token on: its committed length 0, so its old cache columns are masked until
        its own commits overwrite them. In-flight batching refills a finished image's place so,
        between steps; the other images' rows are untouched."""
        self._class_ids[image] = class_id
        self.lengths[image] = 0
        self._sizes[image] = 0

    def truncate(self, lengths: int | Sequence[int] | np.ndarray) -> None:
        """Roll back to `lengths` committed positions (one for every image, or one per image)."""
        np.minimum(self.lengths, np.asarray(lengths, dtype=np.int64), out=self.lengths)

    def step(self, windows: ContinuousWindows) -> np.ndarray:
        """Run each image's window after its committed positions (inputs: the class token at
        position 0, token j at position j+1; a window's row for position 0 is ignored).

        Returns z [rows, W, D] in model-row order (W the longest window; `by_image` gives
        [pairs, N, W, D]): column w of image i conditions the token at position lengths[i] + w.
        Columns past an image's own window are padding: never read, never committed."""
        per_image = self._windows(windows)
        sizes = np.array([0 if w is None else len(w) for w in per_image], dtype=np.int64)
        width = max(int(sizes.max()), 1)
        if int((self.lengths + sizes).max()) > self.capacity:
            raise SpecrtError(f"windows of {sizes.tolist()} at lengths {self.lengths.tolist()} run past "
                              f"{self.spec.seq_len} tokens")
        tokens = np.zeros((self.images, width, self.spec.token_dim), dtype=np.float32)
        for i, window in enumerate(per_image):
            if window is not None and len(window):
                tokens[i, : len(window)] = window
        # only the images with a window, where some have none and the backend allows (steps_active_only)
        subset = self.steps_active_only and 0 < np.count_nonzero(sizes) < self.images
        images = np.flatnonzero(sizes) if subset else np.arange(self.images)
        past = int(self.lengths[images].max())
        positions, mask = step_inputs(self.lengths[images], sizes[images], width, past, self.spec.seq_len)
        tokens, pairs = tokens[images], self.pairs
        if pairs > 1:  # the CFG twins run the same window at the same positions
            tokens, positions, mask = (np.concatenate([a] * pairs) for a in (tokens, positions, mask))
        start = time.perf_counter()
        if subset:
            z = self._run_window(tokens, positions, mask, past,
                                 np.concatenate([images + self.images * k for k in range(pairs)]))
        else:
            z = self._run_window(tokens, positions, mask, past)
        self.forward_seconds += time.perf_counter() - start
        self.forwards += 1
        self.image_forwards += int(np.count_nonzero(sizes))
        self._sizes = sizes
        return np.asarray(z, dtype=np.float32)

    def by_image(self, z: np.ndarray) -> np.ndarray:
        """A step's z [rows, W, D] as [pairs, N, W, D]: z4[:, i, w] is image i's slot w, [cond; uncond]."""
        return z.reshape(self.pairs, self.images, *z.shape[1:])

    def commit(self, counts: int | Sequence[int] | np.ndarray) -> None:
        """Append the first counts[i] present rows of image i's last window (its CFG twin alike)
        at its committed length; one count for every image, or one per image (0: nothing)."""
        counts = np.broadcast_to(np.asarray(counts, dtype=np.int64), (self.images,))
        if not counts.any():
            return
        if np.any(counts < 0) or np.any(counts > self._sizes):
            raise ValueError(f"cannot commit {counts.tolist()} rows of windows of {self._sizes.tolist()}")
        if (counts == counts[0]).all() and (self.lengths == self.lengths[0]).all():  # lockstep: one block copy
            start, count = int(self.lengths[0]), int(counts[0])
            self._write_rows(slice(None), slice(start, start + count), slice(0, count))
        else:
            image = np.repeat(np.arange(self.images), counts)
            slots = np.concatenate([np.arange(n) for n in counts])
            rows = np.concatenate([image + self.images * k for k in range(self.pairs)])
            columns, slots = np.tile(slots + self.lengths[image], self.pairs), np.tile(slots, self.pairs)
            self._write_rows(rows, columns, slots)
        self.lengths += counts

    def retain(self, images: Sequence[int]) -> None:
        """Keep only these images (positions in the batch, in order) with their CFG twins: finished
        images leave the batch, and later steps cost nothing for them."""
        keep = np.asarray(images, dtype=np.int64)
        if len(keep) == self.images and np.array_equal(keep, np.arange(self.images)):
            return
        rows = np.concatenate([keep + self.images * k for k in range(self.pairs)])
        self._keep_rows(rows)
        self._class_ids = self._class_ids[rows]
        self.lengths, self._sizes = self.lengths[keep], self._sizes[keep]
        self._present = None

    def head(self, x: np.ndarray, t: np.ndarray, z: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        eps = self._head(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(t, np.int64),
                         np.ascontiguousarray(z, np.float32))
        self.forward_seconds += time.perf_counter() - start
        self.head_calls += 1
        return np.asarray(eps, dtype=np.float32)

    def guided_head(self, x: np.ndarray, t: np.ndarray, z: np.ndarray,
                    cfg_scales: np.ndarray | None = None) -> np.ndarray:
        """ε̂ for chain rows x [R,C] under conditions z [pairs,R,D]: the head itself, or guided under
        CFG (each row at its cfg_scales entry [R], default the batch's cfg_scale). The rows may
        belong to any images: the head treats every row on its own."""
        return continuous.guided_head(self.head, x, t, z, self.cfg_scale if cfg_scales is None else cfg_scales)

    def sample(self, z: np.ndarray, noise: np.ndarray, temperature: float,
               cfg_scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Tokens from conditions z [pairs,R,D] on noise [T+1,R,C]: (x_0, last-step mean), see
        continuous.chain; cfg_scales [R] are the rows' guidance scales (continuous.cfg_scales)."""
        if cfg_scales is None:
            return continuous.chain(self.guided_head, z, noise, self.schedule, temperature)
        return continuous.chain(lambda x, t, zz: self.guided_head(x, t, zz, cfg_scales), z, noise,
                                self.schedule, temperature)

    def reset_counters(self) -> None:
        self.forwards = self.image_forwards = self.head_calls = 0
        self.forward_seconds = 0.0

    def _windows(self, windows: ContinuousWindows) -> list[Optional[np.ndarray]]:
        if isinstance(windows, np.ndarray):
            if windows.ndim == 2:
                return [windows] * self.images
            if windows.ndim != 3 or len(windows) != self.images:
                raise ValueError(f"windows of shape {windows.shape} for a batch of {self.images} images")
            return list(windows)
        windows = list(windows)
        if len(windows) != self.images:
            raise ValueError(f"{len(windows)} windows for a batch of {self.images} images")
        return windows


def _spread(values: np.ndarray, rows: np.ndarray, count: int, axis: int) -> np.ndarray:
    """values whose `axis` holds rows `rows` of `count`, as an array of all `count` (zeros elsewhere)."""
    shape = list(values.shape)
    shape[axis] = count
    out = np.zeros(shape, dtype=values.dtype)
    index = [slice(None)] * values.ndim
    index[axis] = rows
    out[tuple(index)] = values
    return out
