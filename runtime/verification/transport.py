"""Draft and target rows between host and device: stacking a chain's rows by position, and
gathering the entries or rows verification reads, in as few transfers as the rows' backend allows.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def rows_by_position(rows: Sequence[Sequence[Any]]) -> Any:
    """Per-image sequences of draft rows (rows[b][i]: image b's draft i + 1; a list, or one host
    block [L, V], which a batch of one image uses as it is) as verify_chains' q_block
    [L, images, V], stacked where the rows live (stack_rows); a shorter chain is padded with a row
    that is never read. None when no image drafted."""
    longest = max(map(len, rows), default=0)
    if longest == 0:
        return None
    if len(rows) == 1 and isinstance(rows[0], np.ndarray):  # one image's rows as one block [L, V]: a view
        return rows[0][:, None]
    if len(rows) == 1 and all(isinstance(row, np.ndarray) for row in rows[0]):  # one image's host rows: one stack
        return stack_rows(rows[0])[:, None]
    filler = next(row for chain in rows for row in chain)
    by_position = [[chain[i] if i < len(chain) else filler for chain in rows] for i in range(longest)]
    if not any(hasattr(type(row), "stack_rows") for chain in rows for row in chain):  # host rows: one C-level copy
        return np.array(by_position)
    return stack_rows([stack_rows(block) for block in by_position])


def by_position(block: Any, count: int) -> Any:
    """One pass's rows [images, ≥ count, V] (a draft chain's: image b's draft i + 1 drawn from row
    (b, i)) as verify_chains' q_block [count, images, V]: a view of a host array, stacked where
    the rows live otherwise (stack_rows)."""
    if isinstance(block, np.ndarray):
        return block[:, :count].swapaxes(0, 1)
    return stack_rows([block[:, i] for i in range(count)])


def _gathers_in_place(block: Any) -> bool:
    """A host array, or a device view that gathers where it lives (it has a `stack_rows`, as the
    torch backend's DeviceRows: advanced indexing runs on the device)."""
    return isinstance(block, np.ndarray) or hasattr(type(block), "stack_rows")


def take(block: Any, index: tuple) -> Any:
    """block[index] for integer arrays that broadcast together (entries, or rows when the index
    names fewer axes than the block has), kept where the block lives when it gathers in place (a
    copy either way: later steps may reuse the block's buffer); other views (TensorRT's
    DeviceProbs, which reads a whole view for any array index) are read one entry or row at a time
    to the host, never a whole block (a slice in the index: what it names, read once)."""
    if _gathers_in_place(block):
        return block[index]
    if any(isinstance(part, slice) for part in index):  # whole rows (host_rows): the view read once
        return np.asarray(block[index])
    arrays = np.broadcast_arrays(*[np.asarray(part) for part in index])
    out = np.empty(arrays[0].shape + tuple(block.shape[len(index):]))
    for at in np.ndindex(*arrays[0].shape):
        out[at] = block[tuple(int(part[at]) for part in arrays)]
    return out


def gather(block: Any, index: tuple) -> np.ndarray:
    """take(block, index) on the host as float64: for device rows the gathered numbers alone cross,
    in one transfer."""
    return np.asarray(take(block, index), dtype=np.float64)


def gathers(*pairs: tuple[Any, tuple]) -> list[np.ndarray]:
    """gather(block, index) of each (block, index) pair. Where a block's backend gathers several
    at once (its `gather_all` classmethod, as the torch backend's DeviceRows has), all go there:
    on a GPU, a round's P and Q entries, or a rejection's two rows, then cost one index copy and
    one read back (two synchronisations) instead of one of each per block."""
    together = next((type(block).gather_all for block, _ in pairs if hasattr(type(block), "gather_all")), None)
    if together is not None:
        return together(pairs)
    return [gather(block, index) for block, index in pairs]


def host_rows(*rows: Any) -> list[np.ndarray]:
    """Whole rows on the host: host arrays as they are, device rows read back together (one transfer)."""
    if all(isinstance(row, np.ndarray) for row in rows):
        return list(rows)
    return gathers(*[(row, (slice(None),)) for row in rows])


def stack_rows(rows: Sequence[np.ndarray]) -> np.ndarray:
    """n rows [V] as one block [n, V] that can be indexed like numpy.

    When some rows are device-resident views (a backend's `stack_rows` classmethod, e.g. the torch
    backend's DeviceRows) the block is stacked on the device, so reading one entry of each row is
    one transfer instead of n: on a GPU each transfer is a synchronisation."""
    backend = next((type(r) for r in rows if hasattr(type(r), "stack_rows")), None)
    if backend is not None:
        return backend.stack_rows(rows)
    return np.array([np.asarray(r) for r in rows])  # one C-level copy (np.stack reshapes each row in Python)
