"""Coupled Jacobi drafts (MC-SJD, arXiv 2510.24211): how a window position's next draft relates to its last.

SJD re-drafts every unverified window position each iteration. Exactness needs only that each draft
follow the distribution recorded for it given everything verified before it, so the new draft may
depend on the old one; coupling them keeps drafts that still fit, and a settled context is accepted
further. The couplings (COUPLINGS):
- independent: a fresh draw from the new row (SJD);
- maximal: keep the old draft x with probability min(1, p_new(x)/q_old(x)), else draw from
  Norm([p_new − q_old]_+) — the verification rule itself (runtime.verification.positions: retest_block,
  verify_positions), which is SJD-PAC's adaptive continuation; the result is a draw from p_new, so p_new is
  recorded as its q (the old q would claim a distribution the kept token does not have);
- gumbel: every draft at token index j is argmax(log q_j + g_j) with Gumbel noise g_j fixed for the index
  (the NOISE uniforms of runtime.counter_random: the same in every round), so an unchanged row re-drafts
  the same token, and a changed one mostly does (collision ≥ (1 − TV)/(1 + TV)).

Why the Gumbel draft is exact with noise reused across iterations: a position is tested at most once
— the first round that reaches it commits it (its draft kept, or a residual or bonus token) — and
nothing at earlier positions reads its noise (the target is causal, tests and draws are keyed by their
own positions). So the draft at j when j is tested is argmax(log q_j + g_j) with g_j independent of all
that came before, which is a draw from q_j; the test's coin (TEST, keyed by round) is another uniform.
Noise that did depend on what came before — one noise for every position, or a test's coin taken from
the drafted token's own noise — would break this: tests/runtime/test_coupled_jacobi.py plants the
first and the chi-square flags it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from specrt.runtime.arrays import namespace
from specrt.runtime.counter_random import keyed_uniforms, noise_slots

COUPLINGS = ("independent", "maximal", "gumbel")


def position_noise(key: Any, index: Any, tokens: Any) -> Any:
    """The Gumbel noise of token indices index [...] as exponentials E = −log U [..., V] (g = −log E),
    one per vocabulary entry of tokens [V] (int64, where index lives): a function of the image's key
    (counter_random.image_key), the index and the token alone, so every round draws it the same."""
    xp = namespace(tokens)
    return -xp.log(keyed_uniforms(key, index[..., None], noise_slots(tokens)))


def gumbel_drafts(rows: Any, noise: Any) -> Any:
    """The Gumbel-max draws argmax(log q + g) of rows q [..., V] with noise E [..., V] (position_noise):
    log q − log E = log(q / E), so argmax(q / E), zero-probability entries never drawn. int64 [...]."""
    xp = namespace(rows)
    return xp.argmax(xp.astype(rows, xp.float64) / noise, axis=-1)


def host_gumbel_drafts(key: int, index: Any, rows: np.ndarray) -> np.ndarray:
    """gumbel_drafts(rows, position_noise(key, index, every token)) for host rows [..., V] at token
    indices index [...], with the noise hashed only where a row has mass: a top-k or top-p row (LlamaGen's
    top-k 2,000 of 16,384) needs a few thousand of its V hashes. Entries without mass score 0 in both
    forms and never win, and the others are the same operations on the same numbers: the same draws."""
    rows = np.asarray(rows)
    flat = rows.reshape(-1, rows.shape[-1])
    at = np.broadcast_to(np.asarray(index, dtype=np.int64), rows.shape[:-1]).reshape(-1)
    row, token = np.nonzero(flat)
    if len(token) == flat.size:  # full support: the dense form, without the gathers
        return gumbel_drafts(rows, position_noise(key, np.asarray(index, dtype=np.int64), np.arange(rows.shape[-1])))
    score = np.zeros(flat.shape)
    score[row, token] = flat[row, token].astype(np.float64) / -np.log(keyed_uniforms(key, at[row], noise_slots(token)))
    return score.argmax(axis=-1).reshape(rows.shape[:-1])
