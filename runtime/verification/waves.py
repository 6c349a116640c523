"""Walks that read device rows in waves: verification written as generators that ask for what
they read, so a batch's images read together what each would read alone.
"""
from __future__ import annotations

from typing import Any, Generator, Optional, Sequence

import numpy as np

from specrt.runtime.verification.transport import gathers


def _whole(row: Any) -> tuple[Any, tuple]:
    """A read request (read_in_waves) for the whole of `row` (of entries read ahead: of the row they
    come from): no index array to send."""
    return (row.row if isinstance(row, _RowEntries) else row), (slice(None),)


def read_in_waves(walks: dict[Any, Generator]) -> dict[Any, Any]:
    """Run walks that read what they need of device rows by yielding read requests (lists of
    (block, index) pairs, as `gathers` takes them) and are sent the host arrays; each walk's return
    value, by key. The requests of every walk still running go in one `gathers` call a wave, so
    the images of a batch read together (on device rows: one index copy and one read back) what
    each would read alone, while each runs its own code with its own stream."""
    results: dict[Any, Any] = {}
    asking: dict[Any, list] = {}

    def advance(key: Any, answer: Optional[list]) -> None:
        try:
            asking[key] = next(walks[key]) if answer is None else walks[key].send(answer)
        except StopIteration as done:
            results[key] = done.value

    for key in walks:
        advance(key, None)
    while asking:
        waiting, asking = asking, {}
        read = gathers(*[pair for requests in waiting.values() for pair in requests])
        at = 0
        for key, requests in waiting.items():
            advance(key, read[at:at + len(requests)])
            at += len(requests)
    return results


class _RowEntries:
    """Entries of one target row read ahead (column -> P), indexed like the row by a token or an
    array of tokens: what a node's first tests read; a column not read ahead raises KeyError (a
    rule whose test reads more than its `columns`). `row`: the row they come from, read whole at a
    rejection."""

    def __init__(self, row: Any) -> None:
        self.row = row
        self.values: dict[int, float] = {}

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            return self.values[int(index)]
        tokens = np.asarray(index)
        return np.array([self.values[int(t)] for t in tokens.reshape(-1)]).reshape(tokens.shape)


def rows_ahead(p_rows: Any, wanted: dict[int, Sequence[int]]) -> Generator[list, list, dict[int, _RowEntries]]:
    """A walk (read_in_waves) asking, in one request, for p_rows[slot] at the columns `wanted` names
    for each slot: per slot, those entries standing for the row in a test (read whole, through the
    row itself, at a rejection)."""
    slots = [slot for slot, columns in wanted.items() for _ in columns]
    columns = [column for slot_columns in wanted.values() for column in slot_columns]
    if not columns:
        return {}
    values = (yield [(p_rows, (np.array(slots), np.array(columns)))])[0].tolist()
    ahead: dict[int, _RowEntries] = {}
    for slot, column, value in zip(slots, columns, values):
        if slot not in ahead:
            ahead[slot] = _RowEntries(p_rows[slot])
        ahead[slot].values[column] = value
    return ahead
