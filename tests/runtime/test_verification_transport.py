"""runtime.verification.transport: draft rows stacked by position as verify_chains takes them."""
from __future__ import annotations

import numpy as np

from _verification_cases import VOCAB
from specrt.runtime.verification.transport import rows_by_position


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
