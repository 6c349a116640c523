"""runtime.verification.transport: draft rows stacked by position as verify_chains takes them, and
device views read to host arrays."""
from __future__ import annotations

import numpy as np

from _verification_cases import VOCAB
from specrt.runtime.verification.transport import by_position, gather, rows_by_position, stack_rows


def test_rows_by_position_takes_per_image_blocks_and_uses_one_images_block_as_it_is():
    """A drafter may give each image's rows as one [L, V] block (an EAGLE head's chain call): the same
    q_block as lists of those rows, for a batch with chains of different lengths; a batch of one
    image gets a view of its block, not a copy."""
    rng = np.random.default_rng(4)
    blocks = [rng.random((n, VOCAB)) for n in (3, 1, 0, 2)]
    np.testing.assert_array_equal(rows_by_position(blocks)[:, [0, 1, 3]],
                                  rows_by_position([list(b) for b in blocks])[:, [0, 1, 3]])
    one = rows_by_position(blocks[:1])
    np.testing.assert_array_equal(one, rows_by_position([list(blocks[0])]))
    assert one.shape == (3, 1, VOCAB) and np.shares_memory(one, blocks[0])
    assert rows_by_position([blocks[2]]) is None


class ReadCounting:
    """A device view as the host loop sees one (DeviceRows, DeviceProbs): indexed where it lives,
    read to the host through __array__; counts its reads."""

    def __init__(self, rows: np.ndarray, reads: list):
        self.rows, self.reads = rows, reads

    def __getitem__(self, index):
        return ReadCounting(self.rows[index], self.reads)

    def __array__(self, dtype=None, copy=None):
        self.reads.append(self.rows.size)
        return self.rows if dtype is None else self.rows.astype(dtype)


def test_device_views_are_read_to_host_arrays_once_each():
    """Stacked rows, a pass's rows by position and gathered entries come back as host arrays with the
    numbers of host rows, each view read once (a host row among them read in place)."""
    rng = np.random.default_rng(2)
    rows = rng.dirichlet(np.ones(VOCAB), size=3).astype(np.float32)
    reads: list = []
    stacked = stack_rows([ReadCounting(rows[0], reads), rows[1], ReadCounting(rows[2], reads)])
    assert isinstance(stacked, np.ndarray) and np.array_equal(stacked, rows) and reads == [VOCAB, VOCAB]
    block, reads[:] = rng.random((2, 4, VOCAB)), []
    np.testing.assert_array_equal(by_position(ReadCounting(block, reads), 3), by_position(block, 3))
    assert reads == [2 * 3 * VOCAB]
    index, reads[:] = (np.array([0, 1]), np.array([2, 3])), []
    entries = gather(ReadCounting(block, reads), index)
    assert entries.dtype == np.float64 and np.array_equal(entries, block[index]) and reads == [2 * VOCAB]
