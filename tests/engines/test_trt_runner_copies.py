"""TrtRunner's on-device KV commit, with CUDA's 2D copy replayed on host memory (no GPU needed).

The strided-copy arithmetic (pitches, runs of consecutive slots) is the part of the TensorRT
backend that can be wrong silently; here cudaMemcpy2DAsync is a ctypes.memmove per row over
numpy arrays, and the result must equal the contract's numpy formula.
"""
import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from specrt.engines.trt_runner import KVLayout, TrtRunner


class HostCudart:
    """The few cuda-python calls _copy_rows makes, performed on host pointers."""

    cudaMemcpyKind = SimpleNamespace(cudaMemcpyDeviceToDevice="d2d")

    def __init__(self):
        self.calls = 0

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert kind == "d2d" and width <= dpitch and width <= spitch
        for row in range(height):
            ctypes.memmove(dst + row * dpitch, src + row * spitch, width)
        self.calls += 1
        return (0,)


def _runner(kv, layout, batch, capacity, cudart):
    runner = object.__new__(TrtRunner)  # no engines: only the copy path is exercised
    runner.kv_layout, runner.batch, runner.capacity, runner.cudart = layout, batch, capacity, cudart
    runner._kv = SimpleNamespace(ptr=kv.ctypes.data)
    runner.step_engine = SimpleNamespace(dtypes={"past_kv": kv.dtype})
    runner.prefill_engine = SimpleNamespace(stream=None)
    return runner


@pytest.mark.parametrize("slots, start, expected_copies", [
    ([0, 1, 2], 4, 1), ([0, 2, 3, 5], 7, 3), ([4], 0, 1), ([1, 0], 3, 2)])
def test_commit_copies_match_the_contract_formula(slots, start, expected_copies):
    layout, batch, capacity, window = KVLayout(n_layer=2, n_kv_head=3, head_dim=4), 2, 12, 6
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((2, 2, batch, 3, capacity, 4)).astype(np.float32)
    present = rng.standard_normal((2, 2, batch, 3, window, 4)).astype(np.float32)
    expected = kv.copy()
    expected[:, :, :, :, start:start + len(slots)] = present[:, :, :, :, slots]
    cudart = HostCudart()
    _runner(kv, layout, batch, capacity, cudart)._copy_rows(present.ctypes.data, window, slots, start)
    np.testing.assert_array_equal(kv, expected)
    assert cudart.calls == expected_copies
