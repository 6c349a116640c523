"""An EAGLE head's draft chain (runtime/chain.py HeadChain): a round's drafts in one head call.

EagleDrafter.propose_chain drafts a chain round step by step: one head call for the queued
(token, feature) pairs, then one per further draft, fed with the head's own feature of the
slot before it. Where the head runner can (an EAGLE bundle's draft_chain graph, or the PyTorch
module) the round is one call; nothing else changes, so the tokens must be the step-by-step
loop's (which the EAGLE exactness suites test), for every image, alone and in ragged batches,
on both backends, and the head's state after a round (committed rows, stable lengths, queues)
must be the loop's too. Trees likewise: a round's static or dynamic tree in one head call
(HeadTree, HeadGrowth: each node fed its parent's head feature) must give the tokens of the
level path (one head call per depth).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from demo_pipes import assert_one_call_trees_are_the_levels, step_by_step  # noqa: E402
from specrt.manifest import read_manifest  # noqa: E402
from specrt.runtime.eagle import EagleDrafter  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402
from specrt.runtime.sampling import SamplingParams, guidance_mix  # noqa: E402
from specrt.runtime.tree import DEFAULT_GROWTH, DEFAULT_STATIC_TREE, static_shape  # noqa: E402
from specrt.runtime.tree_call import GrowthLayout, TreeLayout  # noqa: E402
from specrt.runtime.window import Window  # noqa: E402

METHODS = ["sd", "cool-sd", "lantern"]


@pytest.fixture(scope="module")
def eagle_bundle(demo_bundle):
    """The demo with its packaged EAGLE head as the draft (`specrt export --eagle demo`), exported once
    beside the session's demo bundle, whose target and VQ graphs it copies (only the head's are exported)."""
    torch.set_num_threads(1)
    from specrt.bench.models import demo_bundle as cached_demo_bundle

    return cached_demo_bundle(cache_dir=demo_bundle.parent, eagle=True)


@pytest.fixture(scope="module")
def ort_pipe(eagle_bundle):
    return Pipeline.from_bundle(eagle_bundle, threads=1)


@pytest.fixture(scope="module")
def torch_pipe():
    torch.set_num_threads(1)
    from specrt.export.demo import load_demo
    from specrt.export.eagle.checkpoint import load_eagle_head, packaged_demo_head

    demo = load_demo()
    pipe = Pipeline.from_torch(demo.target, load_eagle_head(packaged_demo_head(), demo.target), demo.vq, threads=1)
    pipe.sampling_defaults = dict(vars(demo.sampling_defaults))
    return pipe


def test_the_eagle_demo_bundle_copies_the_cached_demos_target_and_vq(demo_bundle, eagle_bundle):
    plain, eagle = read_manifest(demo_bundle), read_manifest(eagle_bundle)  # hashes checked on read
    for name in ("target_prefill", "target_step", "vq_decode"):
        file = eagle.graph(name).file
        assert eagle.files[file] == plain.files[file] and eagle.graph(name) == plain.graph(name)
    assert eagle.models["draft"]["kind"] == "eagle" and "draft_prefill" not in eagle.graphs


def test_the_eagle_demo_bundle_carries_a_four_draft_head_chain(eagle_bundle, ort_pipe):
    graph = read_manifest(eagle_bundle).graph("draft_chain")
    assert graph.kind == "chain" and graph.role == "draft"
    assert graph.input_names[:2] == ("input_ids", "hidden") and "last" in graph.input_names
    assert graph.output_names == ("present_kv", "probs", "draws")
    assert graph.input("uniforms").shape[1] == 4
    head = ort_pipe.draft
    assert head.can_chain(4) and not head.can_chain(3)
    # a shorter round still uses the graph's four drafts (the extra ones ignored); a longer one cannot
    assert [head.chain_steps_for(n) for n in (2, 4, 5)] == [4, 4, 0]


@pytest.mark.parametrize("backend", ["ort", "torch"])
@pytest.mark.parametrize("method", METHODS)
def test_head_chain_tokens_equal_the_step_by_step_loop(request, backend, method):
    pipe = request.getfixturevalue(f"{backend}_pipe")
    classes = [0, 1, 2, 3, 4, 5]  # a ragged batch: queues of 1 to 5 pairs, images end at different rounds
    for images, seed in ((classes, 12), ([classes[3]], 14)):
        chained = pipe.generate(images, method=method, seed=seed, decode=False, tree="chain")
        chain_calls = pipe.draft.forwards  # counted per generate call
        stepped = pipe.generate(images, method=method, seed=seed, decode=False, tree="chain", fused_drafting=False)
        np.testing.assert_array_equal(chained.tokens, stepped.tokens)
        assert chain_calls < 0.5 * pipe.draft.forwards  # one head call per round instead of one per draft
        assert chained.stats.draft_calls == chain_calls


@pytest.mark.parametrize("method", METHODS)
def test_head_chains_on_device_rows_give_the_host_rows_tokens(torch_pipe, method):
    """With the rows kept on the device (as on a GPU; forced on the CPU here) the head's chains are
    verified from the entries and rows read back: the tokens of host rows."""
    classes = [0, 1, 2, 3, 4, 5]
    expected = torch_pipe.generate(classes, method=method, seed=3, decode=False).tokens
    runners = [torch_pipe.target, torch_pipe.draft]
    for runner in runners:
        runner.keep_rows_on_device = True
    try:
        result = torch_pipe.generate(classes, method=method, seed=3, decode=False)
    finally:
        for runner in runners:
            runner.keep_rows_on_device = False
    np.testing.assert_array_equal(result.tokens, expected)


def _record_rounds(monkeypatch) -> dict[str, list]:
    """After every propose_chain: the drafts, rows, the head's lengths, stable lengths, queues and
    committed KV rows, appended to rounds[mode] (set rounds["mode"] before each run)."""
    propose, rounds = EagleDrafter.propose_chain, {"mode": "chained", "chained": [], "stepped": []}

    def recorded(self, ctx, lengths):
        drafts, rows = propose(self, ctx, lengths)
        head = self.head
        kv = np.asarray(head._kv)
        committed = [kv[:, :, p::head.images, :, : int(n)].copy() for p, n in enumerate(head.lengths)]
        rounds[rounds["mode"]].append((drafts, [np.array(r) for chain in rows for r in chain], head.lengths.copy(),
                                       self._stable.copy(), [list(q) for q in self._tokens], committed))
        return drafts, rows

    monkeypatch.setattr(EagleDrafter, "propose_chain", recorded)
    return rounds


def test_a_head_chain_leaves_the_state_of_the_loop(ort_pipe, monkeypatch):
    """Each round: the same drafts and rows, the queues committed and gone, the same stable
    lengths, the drafts fed committed as this round's rows, the same KV rows."""
    rounds = _record_rounds(monkeypatch)
    ort_pipe.generate([1, 4, 2], method="sd", seed=2, decode=False)
    rounds["mode"] = "stepped"
    with step_by_step(ort_pipe):
        ort_pipe.generate([1, 4, 2], method="sd", seed=2, decode=False)
    chained, stepped = rounds["chained"], rounds["stepped"]
    assert len(chained) == len(stepped) > 10
    for a, b in zip(chained, stepped):
        assert a[0] == b[0]
        assert len(a[1]) == len(b[1])
        for got, want in zip(a[1], b[1]):
            np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_array_equal(a[2], b[2])
        np.testing.assert_array_equal(a[3], b[3])
        assert a[4] == b[4]
        for got, want in zip(a[5], b[5]):
            np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_a_head_chain_is_its_steps(request, backend):
    """chain_pairs after a window of pairs = step_pairs on it, then one-pair steps on each draft
    with the head's own feature of the slot before: the same rows, the same draws."""
    head = request.getfixturevalue(f"{backend}_pipe").draft
    mix = guidance_mix(2, SamplingParams(cfg_scale=4.0))
    rng = np.random.default_rng(0)
    features = [rng.standard_normal((2, 3, head.dim)).astype(np.float32),
                rng.standard_normal((2, 1, head.dim)).astype(np.float32)]
    windows = [Window.chain([7, 8, 9]), Window.chain([5])]  # ragged: image 1's draft 1 follows its slot 0
    uniforms = np.array([[0.3, 0.9, 0.05, 0.6], [0.7, 0.2, 0.5, 0.4]])

    def start():
        head.allocate(mix)
        head.begin()

    start()
    out = head.chain_pairs(windows, features, 4, uniforms)
    rows, draws = np.array(out.probs), out.draws.copy()

    start()
    step = head.step_pairs(windows, features, np.array([[0.0, 0.0, uniforms[0, 0]], [uniforms[1, 0], 0.0, 0.0]]))
    head.commit([range(3), range(1)])
    last = [2, 0]
    step_rows = [[np.array(step.probs[p, s])] for p, s in enumerate(last)]
    step_draws = [[int(step.draws[p, s])] for p, s in enumerate(last)]
    for j in range(1, 4):
        fed = [head.features_out[p::2, s:s + 1].copy() for p, s in enumerate(last)]
        step = head.step_pairs([Window.chain([d[-1]]) for d in step_draws], fed, uniforms[:, j:j + 1])
        head.commit(range(1))
        last = [0, 0]
        for p in range(2):
            step_rows[p].append(np.array(step.probs[p, 0]))
            step_draws[p].append(int(step.draws[p, 0]))
    np.testing.assert_allclose(rows, np.array(step_rows), atol=1e-5)
    assert draws.tolist() == step_draws


def test_restricted_sampling_drafts_step_by_step(ort_pipe):
    """top-k acts on the host between steps: the chain cannot apply it, so the loop drafts."""
    chained = ort_pipe.generate([2], method="sd", seed=0, decode=False, top_k=50)
    calls = ort_pipe.draft.forwards
    with step_by_step(ort_pipe):
        ort_pipe.generate([2], method="sd", seed=0, decode=False, top_k=50)
    assert calls == ort_pipe.draft.forwards and chained.stats.draft_calls == calls


def test_the_eagle_demo_bundle_carries_the_head_trees(eagle_bundle, ort_pipe):
    manifest = read_manifest(eagle_bundle)
    for name, kind in (("draft_tree", "tree"), ("draft_growth", "growth")):
        graph = manifest.graph(name)
        assert graph.kind == kind and graph.input_names[:2] == ("input_ids", "hidden")
    assert ort_pipe.draft.can_draft_tree(TreeLayout(static_shape(DEFAULT_STATIC_TREE)))
    assert ort_pipe.draft.can_grow_tree(GrowthLayout(*DEFAULT_GROWTH))


@pytest.mark.parametrize("backend", ["ort", "torch"])
@pytest.mark.parametrize("tree", ["static", "dynamic"])
@pytest.mark.parametrize("method", METHODS)
def test_head_trees_in_one_call_give_the_level_by_level_tokens(request, backend, tree, method):
    classes = [0, 1, 2, 3]  # a ragged batch: queues of different lengths, images end at different rounds
    assert_one_call_trees_are_the_levels(request.getfixturevalue(f"{backend}_pipe"), classes, 17, method=method,
                                         tree=tree)


@pytest.mark.parametrize("draft", ["independent", "eagle"])
def test_a_tree_that_would_overflow_the_window_catches_up_first(draft):
    """With 40 fed frontier nodes and a window of 41, a round whose queue (or uncached tokens)
    holds more than the pending token runs the ones before it in a call of their own first,
    drawing the uniforms the level path's one window would: the same tokens."""
    from specrt.export.demo import load_demo
    from specrt.export.eagle.checkpoint import load_eagle_head, packaged_demo_head

    demo = load_demo()
    model = load_eagle_head(packaged_demo_head(), demo.target) if draft == "eagle" else demo.draft
    pipe = Pipeline.from_torch(demo.target, model, demo.vq, max_window=41, threads=1)
    pipe.sampling_defaults = dict(vars(demo.sampling_defaults))
    assert_one_call_trees_are_the_levels(pipe, [3, 4, 5], 9, method="sd", tree="dynamic", total_tokens=20)
