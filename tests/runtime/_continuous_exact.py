"""Two-sample checks for continuous tokens (per-dimension Kolmogorov–Smirnov and kernel MMD), and the
tiny random MAR bundle the continuous tests share.

Tolerances come from the sample sizes: KS uses the asymptotic critical value
sqrt(−ln(α/2)/2)·sqrt((n+m)/(n·m)) with α Bonferroni-split over the dimensions; MMD (on the first
MMD_ROWS of each side) compares the statistic with the largest of a fixed-seed permutation null.
"""
from __future__ import annotations

import math

import numpy as np


MMD_ROWS = 600  # the kernel test's rows per side (its cost grows with their square)


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


def mmd_test(a: np.ndarray, b: np.ndarray, permutations: int = 99, seed: int = 0) -> tuple[float, float]:
    """(biased MMD² with a Gaussian kernel of median-distance bandwidth, largest of
    `permutations` permuted MMD²s): equal distributions exceed it with probability
    1/(permutations+1). The kernel matrix is built once; a permutation costs a matrix-vector."""
    both = np.concatenate([a, b])
    sq = (both * both).sum(1)
    dist2 = np.maximum(sq[:, None] + sq[None, :] - 2 * both @ both.T, 0)
    kernel = np.exp(-dist2 / (2 * np.median(dist2)))
    n, m = len(a), len(b)

    def statistic(in_a: np.ndarray) -> float:
        k_a = kernel @ in_a
        aa, ab = in_a @ k_a, (1 - in_a) @ k_a
        bb = kernel.sum() - aa - 2 * ab
        return float(aa / n**2 + bb / m**2 - 2 * ab / (n * m))

    labels = np.r_[np.ones(n), np.zeros(m)]
    rng = np.random.default_rng(seed)
    null = [statistic(rng.permutation(labels)) for _ in range(permutations)]
    return statistic(labels), max(null)


def same_distribution(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    """Whether samples a and b [n, ...] pass both checks, and a line describing the statistics."""
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    ks = ks_statistics(a, b)
    critical = ks_critical(len(a), len(b), a.shape[1])
    stat, null_max = mmd_test(a[:MMD_ROWS], b[:MMD_ROWS])
    ok = bool(ks.max() < critical and stat <= null_max)
    return ok, f"KS max {ks.max():.3f} (critical {critical:.3f}), MMD² {stat:.5f} (permutation max {null_max:.5f})"


def tiny_bundle(directory, scale: float, **shared):
    """A tiny random MAR target (2 layers) and draft (1 layer) exported as a bundle in `directory`;
    `shared`: the config fields both take (token_dim, seq_len, diffusion_steps, betas)."""
    from specrt.export.mar.export import export_bundle
    from specrt.models.mar.model import MARConfig, random_mar

    shared = dict(n_head=2, schedule="linear", **shared)
    target = random_mar(MARConfig(dim=32, n_layer=2, head_width=32, **shared), seed=0, scale=scale)
    draft = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **shared), seed=1, scale=scale)
    return export_bundle(target, draft, directory)
