"""Two-sample checks for continuous tokens: per-dimension Kolmogorov–Smirnov and kernel MMD.

Tolerances come from the sample sizes: KS uses the asymptotic critical value
sqrt(−ln(α/2)/2)·sqrt((n+m)/(n·m)) with α Bonferroni-split over the dimensions; MMD compares
the statistic with the largest of a fixed-seed permutation null.
"""
from __future__ import annotations

import math

import numpy as np


def ks_statistics(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two-sample KS statistic of every column of a [n,d] and b [m,d]."""
    out = []
    for col in range(a.shape[1]):
        x, y = np.sort(a[:, col]), np.sort(b[:, col])
        grid = np.concatenate([x, y])
        cdf_x = np.searchsorted(x, grid, side="right") / len(x)
        cdf_y = np.searchsorted(y, grid, side="right") / len(y)
        out.append(np.abs(cdf_x - cdf_y).max())
    return np.array(out)


def ks_critical(n: int, m: int, dims: int, alpha: float = 1e-3) -> float:
    """The KS critical value at family-wise level alpha over `dims` columns."""
    per_dim = alpha / dims
    return math.sqrt(-math.log(per_dim / 2) / 2) * math.sqrt((n + m) / (n * m))


def mmd2(a: np.ndarray, b: np.ndarray, bandwidth: float) -> float:
    """Biased MMD² with a Gaussian kernel."""
    both = np.concatenate([a, b])
    sq = (both * both).sum(1)
    kernel = np.exp(-(sq[:, None] + sq[None, :] - 2 * both @ both.T) / (2 * bandwidth**2))
    n = len(a)
    return float(kernel[:n, :n].mean() + kernel[n:, n:].mean() - 2 * kernel[:n, n:].mean())


def mmd_test(a: np.ndarray, b: np.ndarray, permutations: int = 99, seed: int = 0) -> tuple[float, float]:
    """(MMD², largest of `permutations` permuted MMD²s): equal distributions exceed it with
    probability 1/(permutations+1)."""
    both = np.concatenate([a, b])
    diffs = both[:, None, :] - both[None, :, :]
    bandwidth = float(np.median(np.sqrt((diffs * diffs).sum(-1))))
    rng = np.random.default_rng(seed)
    null = []
    for _ in range(permutations):
        order = rng.permutation(len(both))
        null.append(mmd2(both[order[: len(a)]], both[order[len(a):]], bandwidth))
    return mmd2(a, b, bandwidth), max(null)


def same_distribution(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    """Whether samples a and b [n, ...] pass both checks, and a line describing the statistics."""
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    ks = ks_statistics(a, b)
    critical = ks_critical(len(a), len(b), a.shape[1])
    stat, null_max = mmd_test(a, b)
    ok = bool(ks.max() < critical and stat <= null_max)
    return ok, f"KS max {ks.max():.3f} (critical {critical:.3f}), MMD² {stat:.5f} (permutation max {null_max:.5f})"
