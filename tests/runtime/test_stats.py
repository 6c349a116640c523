"""Stats.timing: blocks add their time once, nested blocks of the same part are not counted twice."""
from __future__ import annotations

import time

import pytest

from specrt.runtime.stats import Stats


def test_nested_blocks_of_one_part_count_once_and_other_parts_add_up():
    stats = Stats()
    start = time.perf_counter()
    with stats.timing("verification"):
        time.sleep(0.02)
        with stats.timing("verification"):  # a sample drawn inside verification: already timed
            time.sleep(0.03)
    wall = time.perf_counter() - start
    outer = stats.seconds["verification"]
    assert 0.05 <= outer <= wall  # the outer block's time; the inner 0.03 s added again would exceed it
    with stats.timing("vq_decode"):
        time.sleep(0.01)
    assert stats.seconds["verification"] == outer and stats.seconds["vq_decode"] >= 0.01
    with stats.timing("verification"):  # the part can be timed again once its block ended
        time.sleep(0.01)
    assert stats.seconds["verification"] >= outer + 0.01


def test_a_block_that_raises_is_still_counted_and_ends():
    stats = Stats()
    with pytest.raises(ValueError):
        with stats.timing("verification"):
            time.sleep(0.01)
            raise ValueError("boom")
    assert stats.seconds["verification"] >= 0.01
    with stats.timing("verification"):
        pass
    assert not stats._timing_now  # no part left marked as being timed
