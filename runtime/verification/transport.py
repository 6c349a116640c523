"""Rows from where a runner leaves them to the host loop's verification, as host arrays.

A runner may hand out its rows as a device view (the PyTorch backend's DeviceRows, TensorRT's
DeviceProbs) that numpy reads through __array__ and that indexes where it lives. On a GPU the
device round (runtime/rounds) verifies where the rows are; the host loop is the reference, so it
reads what it verifies to the host here, with the view's own indexing and reading, and every
formula after that runs on host arrays. Host arrays pass through as they are.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def host_rows(block: Any) -> np.ndarray:
    """The whole of `block` on the host: a host array as it is, a device view read in one transfer."""
    return np.asarray(block)


def take(block: Any, index: tuple) -> np.ndarray:
    """block[index] on the host for integer arrays that broadcast together (entries, or rows when the
    index names fewer axes than the block has): a copy, so later steps may reuse the block's buffer;
    a device view gathers there and the gathered numbers alone cross."""
    return np.asarray(block[index])


def gather(block: Any, index: tuple) -> np.ndarray:
    """take(block, index) as float64: the entries a test reads, the rows a residual reads."""
    return np.asarray(take(block, index), dtype=np.float64)


def stack_rows(rows: Sequence[Any]) -> np.ndarray:
    """n rows [V] as one host block [n, V] (device rows read back)."""
    return np.array([np.asarray(r) for r in rows])  # one C-level copy (np.stack reshapes each row in Python)


def rows_by_position(rows: Sequence[Sequence[Any]]) -> Any:
    """Per-image sequences of draft rows (rows[b][i]: image b's draft i + 1; a list, or one host
    block [L, V], which a batch of one image uses as it is) as verify_chains' q_block
    [L, images, V] on the host; a shorter chain is padded with a row that is never read. None when
    no image drafted."""
    longest = max(map(len, rows), default=0)
    if longest == 0:
        return None
    if len(rows) == 1 and isinstance(rows[0], np.ndarray):  # one image's rows as one block [L, V]: a view
        return rows[0][:, None]
    if len(rows) == 1:
        return stack_rows(rows[0])[:, None]
    filler = next(row for chain in rows for row in chain)
    by_position = [[np.asarray(chain[i] if i < len(chain) else filler) for chain in rows] for i in range(longest)]
    return np.array(by_position)  # one C-level copy


def by_position(block: Any, count: int) -> np.ndarray:
    """One pass's rows [images, ≥ count, V] (a draft chain's: image b's draft i + 1 drawn from row
    (b, i)) as verify_chains' q_block [count, images, V]: a view of a host array; a device view's
    first `count` rows of each image read in one transfer."""
    return np.asarray(block[:, :count]).swapaxes(0, 1)
