"""The device round on a GPU: captured as one CUDA graph, replayed, kept across calls.

What a CPU cannot show: that capturing a round and replaying it gives the eager round's tokens, that
greedy decoding (nothing random) gives the host loop's tokens there too, that an image is the same
alone and in a batch under replay, and that a later call replays the kept graph. Needs a CUDA GPU:
skipped, saying so, elsewhere (bench/device-run.sh tests runs it on the GPU machine).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)")]

METHODS = [("ar", {}), ("sd", {}), ("cool-sd", {"relaxation_budget": 2.0}), ("lantern", {}), ("sjd", {}),
           ("sjd-pac", {}), ("sjd-pac", {"proactive_drafting": False}), ("sd", {"tree": "static"}),
           ("sd", {"tree": "dynamic"})]
IDS = ["ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac", "sjd-pac-chain", "sd-static", "sd-dynamic"]


def demo_pipeline(cuda_graphs: bool = True):
    from specrt.export.demo import load_demo
    from specrt.runtime.pipeline import Pipeline

    demo = load_demo(None)
    pipe = Pipeline.from_torch(demo.target, demo.draft, demo.vq, device="cuda", cuda_graphs=cuda_graphs)
    pipe.sampling_defaults = dict(vars(demo.sampling_defaults))
    return pipe


@pytest.mark.parametrize("method,params", METHODS, ids=IDS)
def test_the_captured_round_gives_the_eager_rounds_tokens_and_is_kept(method, params):
    eager, captured = demo_pipeline(cuda_graphs=False), demo_pipeline()
    for seed in range(3):  # the first call captures, later ones replay the kept graph from their first round
        expected = eager.generate([seed + 1, seed + 4], method=method, seed=seed, decode=False, **params)
        got = captured.generate([seed + 1, seed + 4], method=method, seed=seed, decode=False, **params)
        np.testing.assert_array_equal(got.tokens, expected.tokens, err_msg=f"{method} seed {seed}")
        assert got.stats.host_syncs == got.stats.target_calls + 1
    assert any(getattr(r, "captured", None) is not None for r in captured._rounds.values())


@pytest.mark.parametrize("method,params", METHODS, ids=IDS)
def test_greedy_rounds_give_the_host_loops_tokens_on_the_gpu(method, params):
    pipe = demo_pipeline()
    rounds = pipe.generate([2, 7, 7], method=method, seed=1, decode=False, temperature=0.0, **params)
    pipe.loop = "host"
    host = pipe.generate([2, 7, 7], method=method, seed=1, decode=False, temperature=0.0, **params)
    np.testing.assert_array_equal(rounds.tokens, host.tokens)


@pytest.mark.parametrize("method,params", METHODS, ids=IDS)
def test_an_image_is_the_same_alone_and_in_a_batch_under_replay(method, params):
    pipe = demo_pipeline()
    batch = pipe.generate([0, 3, 5, 9], method=method, seed=20, decode=False, **params).tokens
    for i, label in enumerate([0, 3, 5, 9]):
        alone = pipe.generate([label], method=method, seed=20 + i, decode=False, **params).tokens
        np.testing.assert_array_equal(batch[i], alone[0], err_msg=f"{method} image {i}")
