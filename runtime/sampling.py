"""The target distribution every method samples from: CFG, temperature, top-k, top-p.

DESIGN.md: all methods take CFG, temperature, top-k and top-p as the target model's sampling
distribution, identically for P and Q. This module is the one place those formulas live;
the PyTorch baseline, every runtime backend and every decoding method call it.
Arrays are numpy; probabilities are float64 so acceptance ratios P/Q stay exact enough for
the losslessness tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.errors import SpecrtError


@dataclass(frozen=True)
class SamplingParams:
    """How logits become the distribution we sample from.

    cfg_scale: classifier-free guidance s in u + (c - u)·s; 1.0 (or None) means no guidance
      batch. temperature 0 means greedy (a one-hot distribution on the argmax). top_k 0 and
      top_p 1.0 disable those filters.
    """

    cfg_scale: float = 4.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.cfg_scale < 0:
            raise SpecrtError(f"cfg_scale must be >= 0, got {self.cfg_scale}")
        if self.temperature < 0:
            raise SpecrtError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecrtError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecrtError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def uses_cfg(self) -> bool:
        """True when the model runs a [cond; uncond] batch (any scale other than 1)."""
        return self.cfg_scale != 1.0


def guided_logits(logits: np.ndarray, cfg_scale: float) -> np.ndarray:
    """Combine a [cond; uncond] batch along axis 0: u + (c − u)·s, as LlamaGen does.

    logits: [2B, ...] with the conditional half first. Returns [B, ...].
    """
    if logits.shape[0] % 2:
        raise ValueError(f"CFG needs a [cond; uncond] batch of even size, got {logits.shape[0]}")
    half = logits.shape[0] // 2
    cond, uncond = logits[:half], logits[half:]
    return uncond + (cond - uncond) * cfg_scale


def _keep_top_k(scaled: np.ndarray, top_k: int) -> np.ndarray:
    """Mask (to -inf) everything below the k-th largest logit of each row."""
    if top_k <= 0 or top_k >= scaled.shape[-1]:
        return scaled
    kth = np.partition(scaled, -top_k, axis=-1)[..., -top_k, None]
    return np.where(scaled < kth, -np.inf, scaled)


def _keep_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero all but the smallest most-probable set whose mass reaches top_p (nucleus sampling).

    The token that crosses the threshold is kept, so at least one token always survives.
    """
    if top_p >= 1.0:
        return probs
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, probs, 0.0)


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Temperature, top-k and top-p applied to (already guided) logits [..., V] -> float64 probs.

    Rows sum to 1. Temperature 0 gives the one-hot argmax distribution, so every method
    decodes greedily and backends can be compared token for token.
    """
    if params.temperature == 0.0:
        onehot = np.zeros(np.shape(logits), dtype=np.float64)
        np.put_along_axis(onehot, np.argmax(logits, axis=-1)[..., None], 1.0, axis=-1)
        return onehot
    scaled = np.array(logits, dtype=np.float64)  # our own copy: the steps below work in place
    if params.temperature != 1.0:
        scaled /= params.temperature
    scaled = _keep_top_k(scaled, params.top_k)
    scaled -= np.max(scaled, axis=-1, keepdims=True)
    probs = np.exp(scaled, out=scaled)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        probs = _keep_top_p(probs, params.top_p)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def target_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Raw model logits (a [cond; uncond] batch when CFG is on) -> the distribution to sample."""
    if params.uses_cfg:
        logits = guided_logits(logits, params.cfg_scale)
    return probabilities(logits, params)


def sample(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row of probs [..., V] by inverse CDF with one uniform per row.

    Using exactly one uniform per draw keeps the random stream, and therefore the image,
    identical across backends for the same seed. The drawn index is the first whose
    cumulative mass exceeds u·total, so a zero-probability entry is never drawn.
    """
    if probs.ndim == 1:  # the per-token hot path of the speculative methods
        cdf = np.cumsum(probs)
        index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        return np.int64(min(index, probs.shape[0] - 1))
    flat = probs.reshape(-1, probs.shape[-1])
    cdf = np.cumsum(flat, axis=-1)
    u = rng.random(flat.shape[0]) * cdf[:, -1]
    idx = np.minimum((cdf <= u[:, None]).sum(axis=-1), flat.shape[-1] - 1)
    return idx.reshape(probs.shape[:-1])
