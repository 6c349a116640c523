"""Lossless rejection-sampling tests at single positions (SJD, SJD-PAC's adaptive continuation):
one drafted token against its target row, or several independent ones at once, on host rows
(verify_position, verify_positions) or where the rows live (retest_block, the device round's).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from specrt.runtime.arrays import namespace
from specrt.runtime.sampling import sample
from specrt.runtime.verification.formulas import acceptance, draw_masses, residual, residual_mass


def verify_position(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator) -> tuple[bool, int]:
    """One lossless rejection-sampling test (SJD, SJD-PAC): keep x̃ with min(1, p/q), else Norm([p − q]_+)."""
    if rng.random() <= acceptance(p[token], q[token]):
        return True, int(token)
    return False, int(sample(residual(p, q), rng))


def verify_positions(p_block: np.ndarray, q_rows: Sequence[np.ndarray], tokens: Sequence[int],
                     rng: np.random.Generator) -> list[int]:
    """verify_position at several independent positions at once (SJD-PAC's adaptive continuation
    re-tests every stale draft against its new row): the kept or resampled token of each.

    p_block [n, V] holds the new rows, q_rows the n old ones. Each position uses its own uniforms,
    so this is the same test; only the tokens' entries are read until the rejected positions'
    residuals are formed and sampled as one [R, V] block instead of R small host calls.

    Random stream: 2n uniforms up front, n tests then position i's resampling draw (used where it
    is rejected), so what a call consumes does not depend on its outcomes (retest_block, the device
    round's form, draws the same).
    """
    count = len(tokens)
    uniforms = rng.random(2 * count)  # n tests, then each position's resampling draw
    p_at = np.asarray(p_block[np.arange(count), np.asarray(tokens)], dtype=np.float64)
    q_at = np.array([row.item(t) for row, t in zip(q_rows, tokens)], dtype=np.float64)
    out = [int(t) for t in tokens]
    rejected = np.flatnonzero(uniforms[:count] > acceptance(p_at, q_at))
    if rejected.size:  # np.array copies a list of rows in C, where np.stack reshapes each row in Python first
        p_rejected = np.asarray(p_block[rejected], dtype=np.float64)
        q_rejected = np.array([q_rows[i] for i in rejected])
        drawn = draw_masses(residual_mass(p_rejected, q_rejected), p_rejected, uniforms[count + rejected])
        for i, token in zip(rejected.tolist(), drawn.tolist()):
            out[i] = token
    return out


def retest_block(p: Any, q: Any, drafted: Any, coins: Any, draw_uniforms: Any) -> Any:
    """verify_positions as the device round runs it (SJD-PAC's adaptive continuation): each old draft
    drafted [R] re-tested against its new row p [R, V] with the row q [R, V] it was drawn from, kept
    where coins [R] pass, else drawn from Norm([p − q]_+) with draw_uniforms [R]. Every row's residual
    is drawn and the applicable token kept: no shape depends on an outcome."""
    xp = namespace(p)
    rows = xp.arange(drafted.shape[0], device=p.device)
    kept = coins <= acceptance(p[rows, drafted], q[rows, drafted])
    drawn = draw_masses(residual_mass(p, q), p, draw_uniforms)
    return xp.where(kept, drafted, xp.astype(drawn, xp.int64))
