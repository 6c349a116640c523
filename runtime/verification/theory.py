"""Cool-SD's Theorem 2 estimated along a drafted path: the expected accepted length (Eq. 7) and
the total-variation bound (Eq. 8-9), reported per round by Stats for the relaxed methods.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specrt.runtime.verification.rules import AcceptanceRule


def accepted_mass(q: np.ndarray, f: np.ndarray) -> float:
    """Σ_x Q(x)·f(x): the probability that one draft position is accepted (the inner sum of Eq. 7)."""
    return float(np.dot(np.asarray(q), f))


def tv_bound_term(p: np.ndarray, q: np.ndarray, f: np.ndarray, g: np.ndarray) -> float:
    """½ Σ_x |Q(x)f(x) − P(x) + G(x)·Σ_y (1 − f(y))Q(y)| for one position (the summand of Eq. 8-9)."""
    p, q = np.asarray(p), np.asarray(q)
    return 0.5 * float(np.abs(q * f - p + g * np.dot(1.0 - f, q)).sum())


@dataclass
class RoundEstimate:
    """Unbiased one-sample estimates of Theorem 2's E[τ+1] and TV bound along the drafted path."""

    expected_accepted_length: float
    tv_bound: float


def theorem2_along_path(p_rows: np.ndarray, q_rows: np.ndarray, drafts: Sequence[int],
                        rule: AcceptanceRule) -> RoundEstimate:
    """Eq. 7 and Eq. 8-9 estimated from the rows one round computes.

    Both are expectations over the drafted prefix x̃ ~ Q of products Π f_k; the drafted path is
    one such sample, so Π_{k<i} f_k(x̃_k) times the exact per-position term is an unbiased
    estimate. Averaged over rounds (Stats) they approximate the theorem's quantities. The TV
    term needs G independent of the rejected token, so LANTERN's Eq.-6 resampling gives NaN.
    """
    length, prefix_product, tv = 1.0, 1.0, 0.0
    for i, token in enumerate(drafts):
        f = rule.acceptance_row(p_rows[i], q_rows[i], i + 1)
        length += prefix_product * accepted_mass(q_rows[i], f)
        if rule.resample_depends_on_token:
            tv = float("nan")
        else:
            g = rule.resample(p_rows[i], q_rows[i], int(token), i + 1)
            tv += prefix_product * tv_bound_term(p_rows[i], q_rows[i], f, g)
        prefix_product *= f[int(token)]
    return RoundEstimate(length, tv)
