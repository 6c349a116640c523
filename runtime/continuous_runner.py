"""The runner of a continuous-token model (family "continuous"): transformer step + diffusion head.

Beside runtime/runner.py's ModelRunner (discrete heads that sample on the device), not a
subclass of it: the step here returns the per-token condition z instead of probabilities,
and sampling is a chain of diffusion-head calls the method drives (runtime/continuous.py).
The runner owns the KV cache [L, B, H, capacity, hd] (B = 1, or 2 for CFG's [cond; uncond]
rows; allocated when B changes), feeds the committed rows as the step graph's past, keeps the
window's present rows, and `commit(n)` appends the first n of them, so a rejected draft costs
nothing. Under CFG the head runs on both rows and guides ε̂ (continuous.guided_eps) before the
chain uses it. Backends implement two hooks.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime import continuous
from specrt.runtime.continuous import Schedule


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


class ContinuousRunner(ABC):
    """One continuous model (target or draft) decoding one image at a time.

    Counters: `forwards` (transformer steps), `head_calls` (diffusion-head calls),
    `forward_seconds` (time inside both).
    """

    def __init__(self, spec: ContinuousSpec):
        self.spec = spec
        self.schedule = spec.diffusion()
        self.length = 0
        self.forwards = self.head_calls = 0
        self.forward_seconds = 0.0
        self.cfg_scale = 1.0
        self._class_ids = np.zeros(1, dtype=np.int64)
        self._k = self._v = np.zeros((spec.n_layer, 0, spec.n_head, 0, spec.head_dim), dtype=np.float32)
        self._present: tuple[np.ndarray, np.ndarray] | None = None

    # ---- hooks a backend implements ------------------------------------------------------

    @abstractmethod
    def _transformer(self, tokens: np.ndarray, class_ids: np.ndarray, positions: np.ndarray,
                     past_k: np.ndarray, past_v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """tokens [1,W,C] f32, class_ids [1] i64, positions [W] i64, past [L,1,H,P,hd] ->
        (z [1,W,D], present_k, present_v [L,1,H,W,hd])."""

    @abstractmethod
    def _head(self, x: np.ndarray, t: np.ndarray, z: np.ndarray) -> np.ndarray:
        """x [R,C] f32, t [R] i64, z [R,D] f32 -> ε̂ [R,C] f32."""

    # ---- the interface the continuous methods use ----------------------------------------------

    def start(self, class_id: int, cfg_scale: float = 1.0) -> None:
        """Begin an image of `class_id`: empty cache; rows [class] or, when cfg_scale != 1,
        [class; unconditional] (class id num_classes)."""
        rows = [class_id] if cfg_scale == 1.0 else [class_id, self.spec.num_classes]
        self._class_ids = np.array(rows, dtype=np.int64)
        self.cfg_scale = cfg_scale
        shape = (self.spec.n_layer, len(rows), self.spec.n_head, self.spec.seq_len + 1, self.spec.head_dim)
        if self._k.shape != shape:
            self._k = np.zeros(shape, dtype=np.float32)
            self._v = np.zeros(shape, dtype=np.float32)
        self.length = 0

    @property
    def class_ids(self) -> np.ndarray:
        """The model rows of the current image: [class] or [class; unconditional]."""
        return self._class_ids

    def truncate(self, length: int) -> None:
        """Roll back to `length` committed positions (position 0 is the class token)."""
        self.length = min(self.length, length)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Run positions length .. length+W−1 (inputs: the class token at position 0, token j at
        position j+1; `tokens` [W,C] holds the window's inputs, its row for position 0 is
        ignored). Returns z [B,W,D]: column w conditions the token at position length+w."""
        rows = len(self._class_ids)
        tokens = np.ascontiguousarray(np.broadcast_to(np.asarray(tokens, dtype=np.float32).reshape(1, -1, self.spec.token_dim),
                                                      (rows, len(tokens), self.spec.token_dim)))
        width = tokens.shape[1]
        if self.length + width > self.spec.seq_len + 1:
            raise SpecrtError(f"window of {width} at length {self.length} runs past {self.spec.seq_len} tokens")
        positions = np.arange(self.length, self.length + width, dtype=np.int64)
        past_k = np.ascontiguousarray(self._k[:, :, :, : self.length])
        past_v = np.ascontiguousarray(self._v[:, :, :, : self.length])
        start = time.perf_counter()
        z, present_k, present_v = self._transformer(tokens, self._class_ids, positions, past_k, past_v)
        self.forward_seconds += time.perf_counter() - start
        self.forwards += 1
        self._present = (present_k, present_v)
        return np.asarray(z, dtype=np.float32)

    def commit(self, count: int) -> None:
        """Append the first `count` rows of the last window to the cache."""
        if count <= 0:
            return
        present_k, present_v = self._present
        self._k[:, :, :, self.length : self.length + count] = present_k[:, :, :, :count]
        self._v[:, :, :, self.length : self.length + count] = present_v[:, :, :, :count]
        self.length += count

    def head(self, x: np.ndarray, t: np.ndarray, z: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        eps = self._head(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(t, np.int64),
                         np.ascontiguousarray(z, np.float32))
        self.forward_seconds += time.perf_counter() - start
        self.head_calls += 1
        return np.asarray(eps, dtype=np.float32)

    def guided_head(self, x: np.ndarray, t: np.ndarray, z: np.ndarray,
                    cfg_scales: np.ndarray | None = None) -> np.ndarray:
        """ε̂ for rows x [R,C] under conditions z [B,R,D]: the head itself, or guided under CFG
        (each row at its cfg_scales entry [R], default the image's cfg_scale)."""
        if len(z) == 1:
            return self.head(x, t, z[0])
        eps = self.head(np.concatenate([x, x]), np.concatenate([t, t]), np.concatenate([z[0], z[1]]))
        scale = self.cfg_scale if cfg_scales is None else cfg_scales
        return continuous.guided_eps(eps[: len(x)], eps[len(x):], scale)

    def sample(self, z: np.ndarray, noise: np.ndarray, temperature: float,
               cfg_scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Tokens from conditions z [B,R,D] on noise [T+1,R,C]: (x_0, last-step mean), see
        continuous.chain; cfg_scales [R] are the rows' guidance scales (continuous.cfg_scales)."""
        if cfg_scales is None:
            return continuous.chain(self.guided_head, z, noise, self.schedule, temperature)
        return continuous.chain(lambda x, t, zz: self.guided_head(x, t, zz, cfg_scales), z, noise,
                                self.schedule, temperature)
