"""The torch backend's CUDA graphs: the same tokens as eager steps, on every method.

Graph replay runs the very kernels eager steps launch, on the same fixed input buffers, so
the tokens must be identical (not merely close). Needs a CUDA GPU: skipped, saying so, elsewhere.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.errors import SpecrtError  # noqa: E402

METHODS = [("ar", {}), ("sd", {}), ("cool-sd", {"relaxation_budget": 2.0}), ("lantern", {}), ("sjd", {}),
           ("sjd-pac", {})]


def test_cuda_graphs_need_a_cuda_device():
    from specrt.export.demo import load_demo
    from specrt.runtime.pipeline import Pipeline

    demo = load_demo(None)
    with pytest.raises((ValueError, SpecrtError), match="CUDA"):
        Pipeline.from_torch(demo.target, demo.draft, demo.vq, device="cpu", cuda_graphs=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)")
@pytest.mark.parametrize("method,params", METHODS, ids=[m for m, _ in METHODS])
def test_graph_replay_gives_the_eager_tokens(method, params):
    from specrt.export.demo import load_demo
    from specrt.runtime.pipeline import Pipeline

    pipes = {}
    for graphs in (False, True):
        demo = load_demo(None)
        pipes[graphs] = Pipeline.from_torch(demo.target, demo.draft, demo.vq, device="cuda", cuda_graphs=graphs)
    for seed in range(3):  # the first call captures (second use of a size), later ones replay
        eager = pipes[False].generate([seed + 1], method=method, seed=seed, **params)
        replayed = pipes[True].generate([seed + 1], method=method, seed=seed, **params)
        np.testing.assert_array_equal(replayed.tokens, eager.tokens)
        assert replayed.stats.host_numbers == eager.stats.host_numbers
    assert pipes[True].target._graphs, "no window size was captured"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)")
@pytest.mark.parametrize("method,params", [("sd", {}), ("sjd", {}), ("sd", {"tree": "static"})], ids=["sd", "sjd", "tree"])
def test_step_inputs_are_page_locked_and_their_async_copies_give_the_waiting_copies_tokens(monkeypatch, method, params):
    """On CUDA the step inputs live in page-locked memory and go to the device without waiting;
    a batch of three images gives the tokens it gives with pageable inputs (copies that wait),
    so no step reads inputs the host has already overwritten."""
    from specrt.export.demo import load_demo
    from specrt.runtime.backends.torch_backend import TorchRunner
    from specrt.runtime.pipeline import Pipeline
    from specrt.runtime.runner import ModelRunner

    def tokens():
        demo = load_demo(None)
        pipe = Pipeline.from_torch(demo.target, demo.draft, demo.vq, device="cuda")
        out = pipe.generate([1, 4, 7], method=method, seed=3, decode=False, **params).tokens
        return out, torch.from_numpy(pipe.target._mask).is_pinned()

    asynchronous, pinned = tokens()
    assert pinned
    monkeypatch.setattr(TorchRunner, "_host_buffer", ModelRunner._host_buffer)
    waiting, pinned = tokens()
    assert not pinned
    np.testing.assert_array_equal(asynchronous, waiting)
