"""The host loop and the device round draw the same numbers, so for a seed they give the same tokens.

Every uniform of both loops is a counter uniform of (image seed, token index, round, kind, part)
(runtime.counter_random): the round's RoundState.uniforms and the host's Decoding key the same draw
the same way. So on the demo the host loop (runtime/methods) and `loop="round"` (runtime/rounds)
give the same tokens for every family with a round — AR, drafted chains (a draft model and an EAGLE
head), static and dynamic trees, SJD, SJD-PAC with and without proactive drafting's spine and full trees,
SJD's drafts coupled maximally or by Gumbel noise —
sampled and greedy, and the onnxruntime bundle's host loop gives the PyTorch host loop's tokens.
Equality holds up to float rounding at a CDF boundary or a test's edge, which these seeds avoid.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.runtime.decoding import Decoding  # noqa: E402
from specrt.runtime.sampling import SamplingParams  # noqa: E402

FAMILIES = [("ar", {}), ("sd", {"draft_len": 3, "top_k": 20, "temperature": 0.8}), ("cool-sd", {"draft_len": 4}),
            ("sd", {"tree": "static"}),
            ("cool-sd", {"tree": "dynamic", "total_tokens": 10, "depth": 3, "tree_top_k": 3}),
            ("sjd", {"window": 8}), ("sjd-pac", {"window": 16, "proactive_drafting": False}),
            ("sjd-pac", {"window": 16}), ("sjd-pac", {"window": 16, "branching": 2, "tree_depth": 3, "tree": "full"}),
            ("sjd", {"window": 8, "coupling": "maximal"}), ("sjd", {"window": 8, "coupling": "gumbel", "top_k": 20}),
            ("sjd-pac", {"window": 16, "coupling": "gumbel"})]
IDS = ["ar", "sd-chain-top-k", "cool-sd-chain", "sd-static", "cool-sd-dynamic", "sjd", "sjd-pac-chain",
       "sjd-pac-spine", "sjd-pac-full", "sjd-maximal", "sjd-gumbel", "sjd-pac-gumbel"]
# (sampling, classes, seed): the family's sampling for two images, greedy decoding for one (not AR's:
# its one draw a token is the argmax of the same row in both loops)
SETTINGS = [({}, [0, 5], 100), ({"temperature": 0.0}, [2], 7)]


def tokens(pipe, loop: str, name: str, classes, seed: int, **params) -> np.ndarray:
    pipe.loop = loop
    try:
        return pipe.generate(classes, name, seed=seed, decode=False, **params).tokens
    finally:
        pipe.loop = "auto"


@pytest.mark.parametrize("name,params", FAMILIES, ids=IDS)
def test_the_host_loop_gives_the_rounds_tokens(torch_pipe, name, params):
    for sampling, classes, seed in SETTINGS if name != "ar" else SETTINGS[:1]:
        settings = {**params, **sampling}
        host = tokens(torch_pipe, "host", name, classes, seed, **settings)
        np.testing.assert_array_equal(host, tokens(torch_pipe, "round", name, classes, seed, **settings),
                                      err_msg=f"{name} {settings}")


def test_a_host_loop_keyed_by_other_coordinates_gives_other_tokens(torch_pipe, monkeypatch):
    """The check has teeth: a host loop whose rounds never advance (every round's draws keyed as
    round 0's) draws other numbers than the round and gives other tokens."""
    round_ = tokens(torch_pipe, "round", "sd", [0, 5], 100, draft_len=3)
    monkeypatch.setattr(Decoding, "start_round", lambda self, lengths: [setattr(key, "length", n) or
                                                                       setattr(key, "round", 0)
                                                                       for key, n in zip(self.keys, lengths)
                                                                       if n is not None])
    assert not np.array_equal(tokens(torch_pipe, "host", "sd", [0, 5], 100, draft_len=3), round_)


@pytest.mark.parametrize("temperature", [0.9, 0.0])
def test_an_eagle_heads_host_loop_gives_the_rounds_tokens(temperature):
    """Chains, static and dynamic trees drafted by an EAGLE head (test_rounds_heads' tiny target with
    a random head): the host loop's EagleDrafter draws what the round's HeadDraft draws."""
    from test_rounds_heads import CHAIN, DYNAMIC, STATIC, head_pipeline

    pipe = head_pipeline(SamplingParams(cfg_scale=2.0, temperature=temperature), vocab=16, grid=4, classes=10)
    for name, shape in [("sd", CHAIN), ("cool-sd", STATIC), ("lantern", DYNAMIC)]:
        host = tokens(pipe, "host", name, [1, 3, 5], 3, **shape)
        np.testing.assert_array_equal(host, tokens(pipe, "round", name, [1, 3, 5], 3, **shape), err_msg=f"{name} {shape}")


def test_the_onnxruntime_bundles_host_loop_gives_the_pytorch_host_loops_tokens(ort_pipe, torch_pipe):
    """The demo bundle on onnxruntime runs the host loop with the same counter uniforms as the demo's
    PyTorch modules: the same tokens for a seed (and so the device round's)."""
    for name, params in [("sd", {"draft_len": 3}), ("sjd-pac", {"window": 16})]:
        ort = ort_pipe.generate([0, 5], name, seed=100, decode=False, **params).tokens
        np.testing.assert_array_equal(ort, tokens(torch_pipe, "host", name, [0, 5], 100, **params), err_msg=name)


def test_a_dynamic_tree_with_fewer_candidates_with_mass_than_it_keeps_tests_them_as_the_host_does():
    """Sampling's top_k = 2 under a tree top_k of 3: every row's third child has no mass, and with
    total_tokens = 21 (every candidate of 3 passes) the round keeps the empty ones too, among the others
    in candidate order (on a GPU, topk's order of ties may do the same at any total_tokens). The host's
    tree holds only those with mass: a node's test uniform is keyed by its number there, which the round
    must use too (its slot would key another draw: 29 of these 256 tokens differed). test_rounds' tiny
    target and draft (vocabulary 3, 2x2 grid)."""
    from test_rounds import GUIDED, pipeline

    sampling = SamplingParams(cfg_scale=GUIDED.cfg_scale, temperature=GUIDED.temperature, top_k=2)
    pipe = pipeline(sampling, vocab=3, grid=2)
    shape = {"tree": "dynamic", "total_tokens": 21, "depth": 3, "tree_top_k": 3}
    classes = [1] * 64
    host = tokens(pipe, "host", "sd", classes, 5, **shape)
    np.testing.assert_array_equal(tokens(pipe, "round", "sd", classes, 5, **shape), host)
    assert len({tuple(row.ravel()) for row in host}) > 8
