"""The formulas of continuous speculative decoding (paper 002, CSpD), once, in numpy.

Notation as in 002's section 3: p is the TARGET density, q the DRAFT density (its
introduction swaps the letters). A token x_0 is sampled by a DDPM chain in the diffusion
head: x_T ~ N(0, I), x_{t−1} = μ_θ(x_t, t) + τ·σ_t·ε_t for t = T..1, with the fixed variance
σ_t² = β_t at every step (τ = temperature, as MAR scales the noise).

Why the acceptance ratio is the last step's density ratio (the derivation behind Alg. 1):
with trajectory alignment the draft and the target use the same noise u = (x_T, ε_T..ε_2).
Treat u as an auxiliary variable: under either model u ~ N(0, I) with the same density, and
given u the chain is deterministic down to x_1, then x_0 ~ N(μ(x_1, 1), τ²σ_1²). So on the
joint space (u, x_0) the target density is φ(u)·N(x_0; μ_p(x_1^p), τ²σ_1²) and the draft's is
φ(u)·N(x_0; μ_q(x_1^q), τ²σ_1²), whose ratio is

    p/q = N(x_0; μ_p(x_1^p(u)), τ²σ_1²) / N(x_0; μ_q(x_1^q(u)), τ²σ_1²)        (accept_probability)

and speculative sampling on that joint space is exact for the x_0 marginal (002 App. A.3's
argument, applied to (u, x_0)). 002's extra factor Σ = Π_{t≥2} sqrt|Σ_q,t| / sqrt|Σ_p,t| is
1 here, because both models sample with the same fixed schedule (the runtime refuses a pair
whose schedules differ). On rejection the residual Norm([p − q]_+) of the same joint space is
sampled by acceptance-rejection with the target as proposal and the bound M = 1/Z (002 Eq. 7–10):
draw fresh u and x_0 from the target, run the draft's chain on the same u, accept with
α_s = max(0, p − q)/p                                                         (residual_acceptance)
so Z = ∫ max(0, p − q) never has to be computed.

Every formula takes numpy arrays (the host loop) or torch tensors (the device round,
runtime/families/continuous/rounds.py) and computes in the arrays' own library
(runtime/arrays.namespace): one implementation of each, wherever it runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.arrays import as_array, is_host, namespace

SCHEDULES = ("cosine", "linear")
CFG_SCHEDULES = ("constant", "linear")
# head(x_t [R,C], t [R] int64 (0 = last step), z) -> predicted noise ε̂ [R,C] (numpy arrays or torch tensors)
HeadFn = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class Schedule:
    """A fixed DDPM schedule; index t = 0..T−1 is the step that produces x_t from x_{t+1}."""

    betas: np.ndarray        # [T] float64
    alpha_bars: np.ndarray   # [T] float64, cumulative product of 1 − β

    def __post_init__(self) -> None:
        # (β_t, ᾱ_t) as Python floats: what the formulas read, so that a traced device round sees
        # constants and never a numpy array (torch.compile would make it a guarded tensor)
        object.__setattr__(self, "_steps", tuple((float(b), float(a)) for b, a in zip(self.betas, self.alpha_bars)))

    @property
    def steps(self) -> int:
        return len(self._steps)

    def beta(self, t: int) -> float:
        return self._steps[t][0]

    def alpha_bar(self, t: int) -> float:
        return self._steps[t][1]

    def sigma(self, t: int) -> float:
        """σ_t = sqrt(β_t) (DDPM's fixed 'large' variance)."""
        return math.sqrt(self._steps[t][0])

    @property
    def sigmas(self) -> np.ndarray:
        """Per-step standard deviation: σ_t = sqrt(β_t) (DDPM's fixed 'large' variance)."""
        return np.sqrt(self.betas)


def ddpm_schedule(name: str, steps: int, beta_start: float = 1e-4, beta_end: float = 0.02) -> Schedule:
    """The schedule both models of a bundle sample with (export trains with the same one).

    "cosine": Nichol & Dhariwal's (MAR's default) at `steps` points, β clipped at 0.999.
    "linear": β from beta_start to beta_end (DDPM's endpoints by default; a short chain that
    should end near pure noise needs larger ones).
    """
    if name not in SCHEDULES:
        raise SpecrtError(f"unknown diffusion schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if steps < 1:
        raise SpecrtError(f"diffusion steps must be >= 1, got {steps}")
    if name == "linear":
        if not 0 < beta_start <= beta_end < 1:
            raise SpecrtError(f"linear schedule needs 0 < beta_start <= beta_end < 1, got {beta_start}, {beta_end}")
        betas = np.linspace(beta_start, beta_end, steps)
    else:
        f = lambda s: math.cos((s / steps + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
        betas = np.array([min(1 - f(i + 1) / f(i), 0.999) for i in range(steps)])
    return Schedule(betas=betas, alpha_bars=np.cumprod(1 - betas))


def guided_eps(eps_cond: Any, eps_uncond: Any, cfg_scale: float | Any) -> Any:
    """Classifier-free guidance on the head's output, as MAR: ε̂ = ε_u + s·(ε_c − ε_u), with one
    scale or one per row ([R], see cfg_scales). The guided ε̂ defines the chain both models
    sample and score, so exactness is unaffected."""
    scale = np.asarray(cfg_scale, dtype=np.float32) if is_host(cfg_scale) and is_host(eps_cond) else cfg_scale
    return eps_uncond + (scale[:, None] if getattr(scale, "ndim", 0) else scale) * (eps_cond - eps_uncond)


def guided_head(head: HeadFn, x: Any, t: Any, z: Any, cfg_scale: float | Any) -> Any:
    """ε̂ for chain rows x [R,C] under conditions z [pairs,R,D]: the head itself (one pair), or
    the head on every row and its unconditional twin ([x; x] against [z_cond; z_uncond]) guided
    at cfg_scale (one, or [R])."""
    if len(z) == 1:
        return head(x, t, z[0])
    xp = namespace(x)
    eps = head(xp.concat([x, x]), xp.concat([t, t]), xp.concat([z[0], z[1]]))
    return guided_eps(eps[: len(x)], eps[len(x):], cfg_scale)


def cfg_scales(cfg_scale: float, cfg_schedule: str, positions: Any, seq_len: int) -> Any:
    """The guidance scale of each token position [R] under MAR's `cfg_schedule`.

    "constant": s everywhere. "linear": MAR's (Muse's) ramp 1 + (s − 1)·(seq_len − mask_len)/seq_len,
    where mask_len is the number of tokens still masked after the step that generates the token.
    In raster order one token per step, token n leaves seq_len − n − 1 masked; MAR clamps
    mask_len to at least 1 before its final step, so the last token shares the one before it's
    scale: s_n = 1 + (s − 1)·min(n + 1, seq_len − 1)/seq_len. Target and draft use the same
    scale at the same position, so the scale is part of the distribution both sample and score.
    """
    positions = as_array(positions)
    positions = positions.astype(np.int64) if is_host(positions) else positions
    if cfg_schedule not in CFG_SCHEDULES:
        raise SpecrtError(f"unknown cfg_schedule {cfg_schedule!r}; choose one of {', '.join(CFG_SCHEDULES)}")
    if cfg_schedule == "constant":
        return _float32(positions * 0 + cfg_scale)
    generated = namespace(positions).minimum(positions + 1, max(seq_len - 1, 0)) / seq_len
    return _float32(1.0 + (cfg_scale - 1.0) * generated)


def denoise_mean(schedule: Schedule, x_t: Any, eps: Any, t: int) -> Any:
    """μ(x_t, t) = (x_t − β_t/sqrt(1 − ᾱ_t)·ε̂) / sqrt(1 − β_t)  (DDPM's ε-parameterised mean)."""
    beta, alpha_bar = schedule.beta(t), schedule.alpha_bar(t)
    return _float32((x_t - beta / math.sqrt(1 - alpha_bar) * eps) / math.sqrt(1 - beta))


def chain(head: HeadFn, z: Any, noise: Any, schedule: Schedule, temperature: float) -> tuple[Any, Any]:
    """Run the denoising chain of every row of z (the head's condition: [R,D], or the runner's
    [B,R,D] with CFG rows) on `noise` [T+1,R,C].

    Returns (x_0 [R,C], μ_0 [R,C]): the token and the mean of its last Gaussian step, whose
    density (last_step_logpdf) is what the acceptance ratio compares.
    """
    steps = schedule.steps
    x = noise[steps]
    mean = x
    xp = namespace(x)
    zero = xp.zeros((len(x),), dtype=xp.int64, device=getattr(x, "device", None))
    for t in range(steps - 1, -1, -1):
        eps = head(x, zero + t, z)
        mean = denoise_mean(schedule, x, eps, t)
        x = _float32(mean + temperature * schedule.sigma(t) * noise[t])
    return x, mean


def last_step_logpdf(x0: Any, mean: Any, schedule: Schedule, temperature: float) -> Any:
    """log N(x_0; μ_0, τ²σ_0² I) per row [R], in float64."""
    std = temperature * schedule.sigma(0)
    x0, mean = as_array(x0), as_array(mean)
    xp = namespace(x0)
    diff = (xp.astype(x0, xp.float64) - xp.astype(mean, xp.float64)) / std
    channels = diff.shape[-1]
    return -0.5 * (diff * diff).sum(-1) - channels * (math.log(std) + 0.5 * math.log(2 * math.pi))


def accept_probability(log_p: Any, log_q: Any) -> Any:
    """min(1, p/q) for a drafted token (draft density q, target density p, aligned noise)."""
    return _exp_of_negative(as_array(log_p) - as_array(log_q))


def residual_acceptance(log_p: Any, log_q: Any) -> Any:
    """α_s = max(0, p − q) / (M·p) with M = 1/Z, i.e. max(0, 1 − q/p) (002 Eq. 10)."""
    return 1.0 - _exp_of_negative(as_array(log_q) - as_array(log_p))


def _exp_of_negative(log_ratio: Any) -> Any:
    """exp(min(0, log_ratio)): a ratio capped at 1, in the array's own library."""
    capped = namespace(log_ratio).minimum(log_ratio, 0.0)
    return np.exp(capped) if is_host(capped) else capped.exp()


def _float32(array: Any) -> Any:
    """The array as float32 in its own library (numpy promotes a float64 scalar's product)."""
    return np.asarray(array, dtype=np.float32) if is_host(array) else array.float()
