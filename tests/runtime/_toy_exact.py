"""Exact sequence distributions of the toy models, and the chi-square check the tests share."""
from __future__ import annotations

import itertools

import numpy as np
from scipy import stats as scipy_stats

from specrt.runtime.backends.toy import ToyLM, head_rows
from specrt.runtime.sampling import SamplingParams, guidance_mix, needs_restriction, restrict


def next_token_row(lm: ToyLM, class_id: int, null_class: int, prefix: tuple[int, ...], sampling: SamplingParams) -> np.ndarray:
    """The sampling distribution after `prefix`, computed the way every method must see it."""
    rows = [lm.logits((class_id, *prefix))]
    if sampling.uses_cfg:
        rows.append(lm.logits((null_class, *prefix)))
    probs = head_rows(np.stack(rows)[:, None], guidance_mix(1, sampling), np.zeros((1, 1))).probs
    row = (restrict(probs, sampling) if needs_restriction(sampling) else probs.astype(np.float64))[0, 0]
    return row / row.sum()  # the head's float32 rows sum to 1 within ~1e-7; enumeration wants exact


def exact_distribution(lm: ToyLM, class_id: int, null_class: int, vocab: int, length: int,
                       sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x_1..x_N) for every sequence, by the chain rule over the toy's exact rows."""
    out = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        for k in range(length):
            prob *= next_token_row(lm, class_id, null_class, seq[:k], sampling)[seq[k]]
        out[seq] = prob
    return out


def chi_square(tokens: np.ndarray, exact: dict[tuple[int, ...], float], alpha: float = 1e-4) -> tuple[float, float]:
    """(statistic, critical value at level alpha); cells expecting < 5 samples are pooled."""
    n = len(tokens)
    observed = {}
    for row in map(tuple, tokens.reshape(n, -1).tolist()):
        observed[row] = observed.get(row, 0) + 1
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for seq, prob in exact.items():
        if prob * n < 5:
            pooled_obs += observed.get(seq, 0)
            pooled_exp += prob * n
        else:
            obs.append(observed.get(seq, 0))
            exp.append(prob * n)
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    obs, exp = np.asarray(obs, float), np.asarray(exp, float)
    statistic = float(((obs - exp) ** 2 / exp).sum())
    return statistic, float(scipy_stats.chi2.ppf(1 - alpha, len(obs) - 1))


def empirical_tv(tokens: np.ndarray, exact: dict[tuple[int, ...], float]) -> float:
    n = len(tokens)
    observed = {}
    for row in map(tuple, tokens.reshape(n, -1).tolist()):
        observed[row] = observed.get(row, 0) + 1
    return 0.5 * sum(abs(observed.get(seq, 0) / n - p) for seq, p in exact.items())
