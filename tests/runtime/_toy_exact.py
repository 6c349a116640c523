"""Exact sequence distributions of the toy models, and the chi-square check the tests share."""
from __future__ import annotations

import itertools

import numpy as np
from scipy import stats as scipy_stats

import pytest

from specrt.runtime.backends.toy import ToyLM
from specrt.runtime.sampling import SamplingParams


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The toy runs the real sampling head (torch) on rows of a few numbers: on a shared 2-core
    machine, torch's thread pool makes each call ~5x slower than one thread does."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)


def reference_row(cond: np.ndarray, uncond: np.ndarray | None, sampling: SamplingParams) -> np.ndarray:
    """The sampling distribution from raw logits, written from the definitions in float64 and
    sharing no code with the runtime (its head, guidance matrix and restriction), so a wrong
    CFG, temperature, top-k or top-p formula there cannot be copied into the reference.

    LlamaGen: guided = u + (c − u)·s, then / T; greedy (T = 0) is the argmax; top-k keeps the k
    largest logits; top-p keeps the most probable tokens until their mass reaches p (the
    token that crosses p included); then softmax over what is kept.
    """
    logits = np.array(cond, dtype=np.float64)
    if uncond is not None:
        logits = uncond + (logits - uncond) * sampling.cfg_scale
    if sampling.temperature == 0:
        row = np.zeros(len(logits))
        row[int(np.argmax(logits))] = 1.0
        return row
    logits = logits / sampling.temperature
    keep = np.ones(len(logits), dtype=bool)
    if 0 < sampling.top_k < len(logits):
        keep[np.argsort(-logits)[sampling.top_k:]] = False
    if sampling.top_p < 1.0:
        probs = np.exp(logits - logits[keep].max()) * keep
        probs /= probs.sum()
        mass = 0.0
        for token in np.argsort(-probs):
            if mass >= sampling.top_p:
                keep[token] = False
            mass += probs[token]
    row = np.where(keep, np.exp(logits - logits[keep].max()), 0.0)
    return row / row.sum()


def next_token_row(lm: ToyLM, condition: int | tuple, null: int | tuple, prefix: tuple[int, ...],
                   sampling: SamplingParams) -> np.ndarray:
    """The sampling distribution after `prefix`: what every method must sample from.

    condition / null: a class id, or the tokens of a caption the model sees (its real ones)."""
    condition, null = (c if isinstance(c, tuple) else (c,) for c in (condition, null))
    uncond = lm.logits((*null, *prefix)) if sampling.uses_cfg else None
    return reference_row(lm.logits((*condition, *prefix)), uncond, sampling)


def exact_distribution(lm: ToyLM, condition: int | tuple, null: int | tuple, vocab: int, length: int,
                       sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x_1..x_N) for every sequence, by the chain rule over the toy's exact rows."""
    out = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        for k in range(length):
            prob *= next_token_row(lm, condition, null, seq[:k], sampling)[seq[k]]
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
