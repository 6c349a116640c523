"""Lossless rejection-sampling tests at single positions (SJD, SJD-PAC's adaptive continuation):
one drafted token against its target row, or several independent ones at once.
"""
from __future__ import annotations

from typing import Any, Generator, Optional, Sequence

import numpy as np

from specrt.runtime.arrays import namespace
from specrt.runtime.sampling import sample
from specrt.runtime.verification.formulas import acceptance, draw_masses, residual, residual_mass
from specrt.runtime.verification.transport import stack_rows
from specrt.runtime.verification.waves import _whole, read_in_waves


def verify_position(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator,
                    entries: Optional[tuple[float, float]] = None) -> tuple[bool, int]:
    """One lossless rejection-sampling test (SJD, SJD-PAC): keep x̃ with min(1, p/q), else Norm([p − q]_+).
    `entries`: P(x̃) and Q(x̃) when the caller read them ahead (device rows, a whole chain's at once)."""
    return read_in_waves({0: position_walk(p, q, token, rng, entries)})[0]


def position_walk(p: Any, q: Any, token: int, rng: np.random.Generator,
                  entries: Optional[tuple[float, float]] = None) -> Generator[list, list, tuple[bool, int]]:
    """verify_position as a walk (read_in_waves): a rejection asks for the two rows whole where
    either is not on the host."""
    if rng.random() <= acceptance(*(entries if entries is not None else (p[token], q[token]))):
        return True, int(token)
    rows = [p, q] if isinstance(p, np.ndarray) and isinstance(q, np.ndarray) else (yield [_whole(p), _whole(q)])
    return False, int(sample(residual(*rows), rng))


def verify_positions(p_block: np.ndarray, q_rows: Sequence[np.ndarray], tokens: Sequence[int],
                     rng: np.random.Generator) -> list[int]:
    """verify_position at several independent positions at once (SJD-PAC's adaptive continuation
    re-tests every stale draft against its new row): the kept or resampled token of each.

    p_block [n, V] holds the new rows (one gather from the step's output), q_rows the n old
    ones (stacked once, stack_rows). Each position uses its own uniforms, so this is the same
    test; only the tokens' entries are read until the rejected positions' residuals are formed
    and sampled as one [R, V] block instead of R small host calls.

    Random stream: 2n uniforms up front, n tests then position i's resampling draw (used where it
    is rejected), so what a call consumes does not depend on its outcomes.
    """
    return read_in_waves({0: positions_walk(p_block, np.arange(len(tokens)), q_rows, tokens, rng)})[0]


def positions_walk(p_rows: Any, slots: np.ndarray, q_rows: Sequence[Any], tokens: Sequence[int],
                   rng: np.random.Generator) -> Generator[list, list, list[int]]:
    """verify_positions as a walk (read_in_waves) over the new rows p_rows[slots] (on device rows
    indexed inside the reads: no index copy of their own): host rows are read in place; device rows
    ask for the tokens' entries, then for the rejected positions' rows."""
    count = len(tokens)
    uniforms = rng.random(2 * count)  # n tests, then each position's resampling draw
    index = np.arange(count), np.asarray(tokens)
    on_host = isinstance(p_rows, np.ndarray) and all(isinstance(row, np.ndarray) for row in q_rows)
    # host rows: read q at each token in place and copy only the rejected rows below; device rows
    # (DeviceRows): one stacked block, read with P's (one request: one transfer each way)
    q_block = None if on_host else stack_rows(q_rows)
    if not on_host and _verifies_in_place(p_rows, q_block):
        return (yield from _positions_in_place(p_rows, slots, q_block, index[1], uniforms))
    if on_host:
        p_at = np.asarray(p_rows[slots, index[1]], dtype=np.float64)
        q_at = np.array([row.item(t) for row, t in zip(q_rows, tokens)], dtype=np.float64)
    else:
        p_at, q_at = yield [(p_rows, (slots, index[1])), (q_block, index)]
    out = [int(t) for t in tokens]
    rejected = np.flatnonzero(uniforms[:count] > acceptance(p_at, q_at))
    if rejected.size:
        if on_host:  # np.array copies a list of rows in C, where np.stack reshapes each row in Python first
            p_rejected = np.asarray(p_rows[slots[rejected]], dtype=np.float64)
            q_rejected = np.array([q_rows[i] for i in rejected])
        else:
            p_rejected, q_rejected = yield [(p_rows, (slots[rejected],)), (q_block, (rejected,))]
        drawn = draw_masses(residual_mass(p_rejected, q_rejected), p_rejected, uniforms[count + rejected])
        for i, token in zip(rejected.tolist(), drawn.tolist()):
            out[i] = token
    return out


def _verifies_in_place(*blocks: Any) -> bool:
    """Blocks whose backend computes where they live (a `send` to their device and a `receive`
    from it, as the torch backend's DeviceRows has), all of one kind."""
    kinds = {type(block) for block in blocks}
    return len(kinds) == 1 and hasattr(next(iter(kinds)), "send")


def _positions_in_place(p_rows: Any, slots: np.ndarray, q_block: Any, tokens: np.ndarray,
                        uniforms: np.ndarray) -> Generator[list, list, list[int]]:
    """positions_walk where the rows live (the host loop's SJD-PAC on a GPU): slots, tokens and
    uniforms go there in one copy, retest_block runs there, and the walk asks for the n tokens alone,
    where reading back would cost each rejected position's two whole rows."""
    count = len(tokens)
    sent = p_rows.send(np.concatenate([slots, tokens, uniforms]).astype(np.float64), "continuation")
    xp = namespace(sent)
    ints = xp.astype(sent[: 2 * count], xp.int64)  # slots and token ids are exact in float64
    at, drafted, u = ints[:count], ints[count:], sent[2 * count:]
    out = retest_block(p_rows.array[at], q_block.array, drafted, u[:count], u[count:])
    return (yield [(p_rows.holding(out), (slice(None),))])[0].astype(np.int64).tolist()


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
