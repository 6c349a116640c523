"""The device round on a GPU: captured as one CUDA graph, replayed, kept across calls.

What a CPU cannot show: that capturing a round and replaying it gives the eager round's tokens, that
greedy decoding (nothing random) gives the host loop's tokens there too, that an image is the same
alone and in a batch under replay, and that a later call replays the kept graph — with the demo's
draft GPT and with its EAGLE head (runtime/rounds/drafts.py HeadDraft) drafting, and under the chameleon
demo's image grammar; and that in-flight slots (runtime/scheduling/round_slots.py, and the continuous
family's continuous_round_slots.py) refill the captured round's buffers with no new capture, an image
admitted mid-flight getting its tokens alone. Needs a CUDA GPU:
skipped, saying so, elsewhere (bench/device-run.sh tests runs it on the GPU machine).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)")]

METHODS = [("ar", {}, False), ("sd", {}, False), ("cool-sd", {"relaxation_budget": 2.0}, False),
           ("lantern", {}, False), ("sjd", {}, False), ("sjd-pac", {}, False),
           ("sjd-pac", {"proactive_drafting": False}, False),
           ("sjd-pac", {"tree": "full", "branching": 2, "tree_depth": 3}, False), ("sd", {"tree": "static"}, False),
           ("sd", {"tree": "dynamic"}, False),
           # the demo's EAGLE head drafting (eagle: True)
           ("sd", {}, True), ("cool-sd", {"relaxation_budget": 2.0}, True), ("sd", {"tree": "static"}, True),
           ("sd", {"tree": "dynamic"}, True)]
IDS = ["ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac", "sjd-pac-chain", "sjd-pac-full", "sd-static", "sd-dynamic",
       "eagle-sd", "eagle-cool-sd", "eagle-sd-static", "eagle-sd-dynamic"]


def demo_pipeline(eagle: bool, cuda_graphs: bool = True):
    """The demo on the GPU, drafting with its draft GPT or (eagle) its packaged EAGLE head."""
    from specrt.export.demo import load_demo
    from specrt.export.eagle.checkpoint import load_eagle_head, packaged_demo_head
    from specrt.runtime.pipeline import Pipeline

    demo = load_demo(None)
    draft = load_eagle_head(packaged_demo_head(), demo.target) if eagle else demo.draft
    pipe = Pipeline.from_torch(demo.target, draft, demo.vq, device="cuda", cuda_graphs=cuda_graphs)
    pipe.sampling_defaults = dict(vars(demo.sampling_defaults))
    return pipe


@pytest.mark.parametrize("method,params,eagle", METHODS, ids=IDS)
def test_the_captured_round_gives_the_eager_rounds_tokens_and_is_kept(method, params, eagle):
    eager, captured = demo_pipeline(eagle, cuda_graphs=False), demo_pipeline(eagle)
    for seed in range(3):  # the first call captures, later ones replay the kept graph from their first round
        expected = eager.generate([seed + 1, seed + 4], method=method, seed=seed, decode=False, **params)
        got = captured.generate([seed + 1, seed + 4], method=method, seed=seed, decode=False, **params)
        np.testing.assert_array_equal(got.tokens, expected.tokens, err_msg=f"{method} seed {seed}")
        assert got.stats.host_syncs == got.stats.target_calls + 1
    assert any(getattr(r, "captured", None) is not None for r in captured._rounds.values())


@pytest.mark.parametrize("method,params,eagle", METHODS, ids=IDS)
def test_greedy_rounds_give_the_host_loops_tokens_on_the_gpu(method, params, eagle):
    pipe = demo_pipeline(eagle)
    rounds = pipe.generate([2, 7, 7], method=method, seed=1, decode=False, temperature=0.0, **params)
    pipe.loop = "host"
    host = pipe.generate([2, 7, 7], method=method, seed=1, decode=False, temperature=0.0, **params)
    np.testing.assert_array_equal(rounds.tokens, host.tokens)


@pytest.mark.parametrize("method,params,eagle", METHODS, ids=IDS)
def test_an_image_is_the_same_alone_and_in_a_batch_under_replay(method, params, eagle):
    pipe = demo_pipeline(eagle)
    batch = pipe.generate([0, 3, 5, 9], method=method, seed=20, decode=False, **params).tokens
    for i, label in enumerate([0, 3, 5, 9]):
        alone = pipe.generate([label], method=method, seed=20 + i, decode=False, **params).tokens
        np.testing.assert_array_equal(batch[i], alone[0], err_msg=f"{method} image {i}")


GRAMMAR_METHODS = [("sd", {}), ("sjd", {}), ("sjd-pac", {})]


@pytest.mark.parametrize("method,params", GRAMMAR_METHODS, ids=[m for m, _ in GRAMMAR_METHODS])
def test_a_captured_round_under_a_grammar_gives_the_eager_rounds_and_the_greedy_host_loops_tokens(method, params):
    """The chameleon demo's image grammar (a forced row end after every row) inside a captured round:
    the eager round's streams, every one valid, and under greedy decoding the host loop's."""
    from specrt.export.demo.registry import get_demo

    hook = get_demo("chameleon").hook("torch_pipeline")
    eager, captured = hook(None, device="cuda", cuda_graphs=False), hook(None, device="cuda")
    prompts = ["a thin two", "a thick seven"]
    for seed in range(2):
        expected = eager.generate(prompts=prompts, method=method, seed=seed, decode=False, **params)
        got = captured.generate(prompts=prompts, method=method, seed=seed, decode=False, **params)
        np.testing.assert_array_equal(got.stream, expected.stream, err_msg=f"{method} seed {seed}")
        assert captured.grammar.is_valid(got.stream).all()
        assert got.stats.host_syncs == got.stats.target_calls + 1
    rounds = captured.generate(prompts=prompts, method=method, seed=1, decode=False, temperature=0.0, **params)
    captured.loop = "host"
    host = captured.generate(prompts=prompts, method=method, seed=1, decode=False, temperature=0.0, **params)
    np.testing.assert_array_equal(rounds.stream, host.stream)


def mar_demo_pipeline(cuda_graphs: bool = True):
    """The continuous demo (MAR-style target and draft) on the GPU: its rounds run where loop is auto."""
    from specrt.export.mar.demo import load_mar_demo
    from specrt.runtime.families.continuous.pipeline import ContinuousPipeline
    from specrt.runtime.families.continuous.torch_runner import torch_runners

    demo = load_mar_demo(None)
    target, draft = torch_runners(demo.target, demo.draft, device="cuda")
    target.cuda_graphs = cuda_graphs
    return ContinuousPipeline(target, draft, None, demo.sampling_defaults)


@pytest.mark.parametrize("method,params", [("ar", {}), ("cspd", {"draft_len": 4})], ids=["ar", "cspd"])
def test_a_captured_continuous_round_gives_the_eager_rounds_tokens_alone_or_in_a_batch(method, params):
    eager, captured = mar_demo_pipeline(cuda_graphs=False), mar_demo_pipeline()
    for seed in range(2):  # the first call captures, the second replays the kept graph from its first round
        expected = eager.generate([1, 4, 7], method=method, seed=seed, decode=False, **params)
        got = captured.generate([1, 4, 7], method=method, seed=seed, decode=False, **params)
        np.testing.assert_allclose(got.tokens, expected.tokens, atol=1e-4, err_msg=f"{method} seed {seed}")
        assert got.stats.host_syncs == got.stats.target_passes + 2
    assert any(getattr(r, "captured", None) is not None for r in captured._rounds.values())
    for i, label in enumerate([1, 4, 7]):
        alone = captured.generate([label], method=method, seed=1 + i, decode=False, **params).tokens
        np.testing.assert_allclose(alone[0], got.tokens[i], atol=1e-4, err_msg=f"{method} image {i}")


SLOT_METHODS = [("ar", {}, False), ("sd", {}, False), ("sjd", {}, False), ("sjd-pac", {}, False), ("sd", {}, True)]


@pytest.mark.parametrize("method,params,eagle", SLOT_METHODS, ids=["ar", "sd", "sjd", "sjd-pac", "eagle-sd"])
def test_slots_refill_the_captured_round_without_a_new_capture(method, params, eagle):
    """In-flight slots capture the round at their second round where no call has, and replay it from
    then on across admissions: one capture, the same buffers, one host read a round and none at an
    admission, and each image (the third admitted mid-flight into a used slot) its request's alone.
    A later generate call of as many images, and a later batch of slots, replay that same graph."""
    from slot_runs import alone, round_buffers, run_requests, slots_of

    pipe = demo_pipeline(eagle)
    requests = [(1, 3), (4, 8), (7, 5)]
    slots, first, reads = slots_of(pipe, method, params, 2), {}, {}
    assert slots.step is slots.round_ and getattr(slots.round_, "captured", None) is None
    tokens = run_requests(slots, pipe, requests, admitted=lambda s: first or first.update(round_buffers(s)),
                          reads=reads)
    captured = slots.round_.captured
    assert captured is not None and slots.step is captured
    assert round_buffers(slots) == first
    assert reads["admit"] == [0] * len(requests) and reads["round"] == [1] * slots.runs
    for request in requests:
        assert tokens[request] == alone(pipe, method, params, request), f"{method} {request}"
    called = pipe.generate([1, 4], method=method, seed=[3, 8], decode=False, **params).tokens
    assert [row.ravel().tolist() for row in called] == [tokens[(1, 3)], tokens[(4, 8)]]
    again = slots_of(pipe, method, params, 2)
    assert again.round_ is slots.round_ and again.step is captured
    later = run_requests(again, pipe, requests[::-1])
    assert later == tokens and slots.round_.captured is captured


@pytest.mark.parametrize("method,params,eagle", SLOT_METHODS, ids=["ar", "sd", "sjd", "sjd-pac", "eagle-sd"])
def test_slots_admitted_together_refill_the_captured_round(method, params, eagle):
    """Requests entering between two rounds admitted with one prefill (admit_all, as the scheduler
    admits them) under replay: the round captured once, the same buffers, no host read at an
    admission, and each image its request's alone."""
    from slot_runs import alone, round_buffers, run_requests, slots_of

    pipe = demo_pipeline(eagle)
    requests = [(1, 3), (4, 8), (7, 5), (2, 6), (9, 1)]  # three enter together, two as slots free
    slots, first, reads = slots_of(pipe, method, params, 3), {}, {}
    tokens = run_requests(slots, pipe, requests, admitted=lambda s: first or first.update(round_buffers(s)),
                          reads=reads, together=True)
    assert slots.step is slots.round_.captured and round_buffers(slots) == first
    assert set(reads["admit"]) == {0} and reads["round"] == [1] * slots.runs
    for request in requests:
        assert tokens[request] == alone(pipe, method, params, request), f"{method} {request}"


@pytest.mark.parametrize("method,params", [("ar", {}), ("cspd", {"draft_len": 4})], ids=["ar", "cspd"])
def test_continuous_slots_refill_the_captured_round_without_a_new_capture(method, params):
    """The continuous demo's device-round slots: captured at their second round where no call has,
    replayed from then on across admissions (one a round, the third into a slot another image left):
    one capture, the same buffers, one host read a round and none at an admission, each image its
    request's alone (to the captured round's 1e-4 above). A generate call of as many images, and a
    later batch of slots, replay that same graph."""
    from continuous_slot_runs import alone, open_round_batch, run_in_flight
    from slot_runs import round_buffers
    from specrt.runtime.scheduling import Request

    pipe = mar_demo_pipeline()
    queue = [Request(class_id=c, seed=s, method=method, params=params, decode=False) for c, s in [(1, 3), (4, 8), (7, 5)]]
    batch, first = open_round_batch(pipe, queue[0], 2), {}
    slots = batch.rounds
    assert slots.step is slots.round_ and getattr(slots.round_, "captured", None) is None
    run = run_in_flight(batch, queue, admitted=lambda b: first or first.update(round_buffers(b.rounds)))
    captured = slots.round_.captured
    assert captured is not None and slots.step is captured
    assert round_buffers(slots) == first
    assert run.reads["admit"] == [0] * len(queue) and run.reads["round"] == [1] * slots.runs
    tokens = [run.results[i].tokens[0] for i in range(len(queue))]
    for request, got in zip(queue, tokens):
        np.testing.assert_allclose(got, alone(pipe, request).tokens[0], atol=1e-4, err_msg=f"{method} {request}")
    called = pipe.generate([1, 4], method=method, seed=[3, 8], decode=False, **params).tokens
    np.testing.assert_allclose(called, np.stack(tokens[:2]), atol=1e-4)
    again = open_round_batch(pipe, queue[0], 2)
    assert again.rounds.round_ is slots.round_ and again.rounds.step is captured
    later = run_in_flight(again, queue[::-1])
    for index in range(len(queue)):
        np.testing.assert_allclose(later.results[len(queue) - 1 - index].tokens[0], tokens[index], atol=1e-4)
    assert slots.round_.captured is captured
