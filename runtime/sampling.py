"""The target distribution every method samples from: CFG, temperature, top-k, top-p (host side).

DESIGN.md: all methods take CFG, temperature, top-k and top-p as the target model's sampling
distribution, identically for P and Q. CFG, temperature and the softmax run on the device, in
the sampling head at the end of every graph (specrt.runtime.head), fed the `guidance_mix` made
here; greedy/top-k/top-p restrict the rows where they are (`restrict`: on the host, or where the
PyTorch backend keeps them on a GPU) and the host draws from residual rows (`inverse_cdf`,
`draw_from_cdf`, with the caller's counter uniforms). Host arrays are numpy; restricted rows are
float64.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.arrays import as_array, descending, is_host, kth_largest, namespace, unsorted
from specrt.validation import COUNT_MAX, integer, number

# Bounds that keep the head's mix (s/T and (1 − s)/T, float32) and its softmax finite.
MAX_CFG_SCALE = 1000.0
MAX_TEMPERATURE = 1000.0
MIN_TEMPERATURE = 1e-3


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
        # every value checked once, in specrt.validation; the checked (typed) values replace the given
        checked = {
            "cfg_scale": number("cfg_scale", self.cfg_scale, low=0, high=MAX_CFG_SCALE),
            "temperature": number("temperature", self.temperature, low=0, high=MAX_TEMPERATURE),
            "top_k": integer("top_k (0 disables it)", self.top_k, low=0, high=COUNT_MAX),
            "top_p": number("top_p", self.top_p, low=0, high=1, low_open=True),
        }
        if 0 < checked["temperature"] < MIN_TEMPERATURE:
            raise SpecrtError(f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE} (1/T stays finite in "
                              f"float32), got {self.temperature}")
        for key, value in checked.items():
            object.__setattr__(self, key, value)

    @property
    def uses_cfg(self) -> bool:
        """True when the model runs a [cond; uncond] batch (any scale other than 1)."""
        return self.cfg_scale != 1.0

    def for_vocab(self, vocab: int) -> "SamplingParams":
        """The same distribution with a top-k that keeps the whole vocabulary written as 0, so a
        family default like LlamaGen's top-k 2000 on a smaller vocabulary costs no host filtering."""
        return replace(self, top_k=0) if self.top_k >= vocab else self


def guidance_mix(images: int, params: SamplingParams) -> np.ndarray:
    """The sampling head's `mix` [images, batch]: CFG and temperature as one linear map of the logits.

    With CFG the model batch is [cond; uncond] and image i's guided logits are
    s·cond_i + (1 − s)·uncond_i (LlamaGen's u + (c − u)·s); dividing by the temperature T is
    linear too, so both fold into one matrix and the graph stays free of branches. Greedy
    decoding (T = 0) runs the head at T = 1 and takes the argmax on the host (`restrict`).
    """
    scale = 1.0 / params.temperature if params.temperature > 0 else 1.0
    eye = np.eye(images, dtype=np.float32)
    if not params.uses_cfg:
        return eye * np.float32(scale)
    return np.concatenate([eye * params.cfg_scale, eye * (1.0 - params.cfg_scale)], axis=1).astype(np.float32) * np.float32(scale)


def needs_restriction(params: SamplingParams) -> bool:
    """True when the head's softmax is not yet the distribution to sample (greedy, top-k, top-p)."""
    return params.temperature == 0.0 or 0 < params.top_k or params.top_p < 1.0


def _keep_top_k(probs: np.ndarray, top_k: int) -> np.ndarray:
    """Zero everything below the k-th largest probability of each row (ranking = the logits')."""
    if top_k <= 0 or top_k >= probs.shape[-1]:
        return probs
    return namespace(probs).where(probs < kth_largest(probs, top_k), 0.0, probs)


def _keep_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero all but the smallest most-probable set whose mass reaches top_p (nucleus sampling).

    The token that crosses the threshold is kept, so at least one token always survives. The
    mass is relative to the row's total: after top-k the row is no longer normalised, and top-p
    acts on the top-k distribution (LlamaGen's top_k_top_p_filtering softmaxes the kept logits).
    Host rows or torch tensors where the rows live, the same numbers: the total is the running
    sum's last entry (summed in the order the running sum adds, as every library does), not a
    separate sum whose order of additions each library chooses.
    """
    if top_p >= 1.0:
        return probs
    xp = namespace(probs)
    sorted_probs, order = descending(probs)
    running = xp.cumulative_sum(sorted_probs, axis=-1)
    keep_sorted = running - sorted_probs < top_p * running[..., -1:]
    return xp.where(unsorted(keep_sorted, order), probs, 0.0)


def restrict(probs: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The head's softmax rows [..., V] -> the distribution to sample: greedy, top-k, top-p (float64).

    Masking softmax(l) to a set and renormalising is softmax of l restricted to that set, so
    this equals filtering the logits first. Temperature 0 gives the one-hot argmax, so every
    method decodes greedily and backends can be compared token for token. Host rows, or (greedy
    and top-k) torch tensors where the rows live: the same numbers, as in runtime.arrays.
    """
    probs = as_array(probs)
    xp = namespace(probs)
    probs = xp.astype(probs, xp.float64)
    if params.temperature == 0.0:
        every = np.arange(probs.shape[-1]) if is_host(probs) else xp.arange(probs.shape[-1], device=probs.device)
        return xp.astype(every == xp.argmax(probs, axis=-1)[..., None], xp.float64)
    kept = _keep_top_p(_keep_top_k(probs, params.top_k), params.top_p)
    return kept / xp.sum(kept, axis=-1, keepdims=True)


def inverse_cdf(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """One draw per row of probs [..., V] with the given uniforms [...]: the number of CDF entries
    at or below u·total, so a zero-probability entry is never drawn (the head's formula). One row
    [V] with one uniform gives one int."""
    if probs.ndim == 1 and is_host(probs):  # one row (a rejection at batch 1): no block reshapes around the search
        return draw_from_cdf(np.cumsum(probs), float(uniforms))
    xp = namespace(probs)  # numpy, or torch where the rows live (runtime.arrays)
    rows = xp.reshape(probs, (-1, probs.shape[-1]))
    return xp.reshape(draws_from_cdf(xp.cumulative_sum(rows, axis=-1), uniforms), probs.shape[:-1])


def draws_from_cdf(cdf: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """inverse_cdf on rows' CDFs [R, V] (unnormalised: the uniform is scaled by each row's total)."""
    if len(cdf) == 1 and is_host(cdf):  # one row: a binary search, the same count, not a pass over V
        return np.array([draw_from_cdf(cdf[0], float(np.reshape(uniforms, -1)[0]))])
    xp = namespace(cdf)
    u = xp.reshape(uniforms, (-1,)) * cdf[:, -1]
    return xp.minimum(xp.sum(cdf <= u[:, None], axis=-1), cdf.shape[-1] - 1)


def draw_from_cdf(cdf: np.ndarray, uniform: float) -> int:
    """The draw of one row's CDF [V] (unnormalised) with one uniform, by binary search: the count
    of entries at or below u·total, capped at V − 1 (rounding can leave u·total past the last).
    u·total is compared in float64 whatever the CDF's dtype, as the block path compares it."""
    return min(int(cdf.searchsorted(np.float64(uniform * float(cdf[-1])), side="right")), len(cdf) - 1)
