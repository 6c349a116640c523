"""The device round with an EAGLE head drafting (runtime/rounds/drafts.py HeadDraft): exact, the host
loop's drafts, the same image in any batch, capturable.

A head's drafts do not change what a lossless round samples — only how often it accepts — so the
checks of its features are on the drafts themselves. Greedy decoding draws nothing at random: a
chain round must draft, round by round, what the host loop's EagleDrafter drafts (catch-up pairs,
positions, masks and the head's own features all the host's), and a greedy dynamic tree of top-k 1
is the argmax chain, so it must draft the chain round's drafts (greedy trees of more children are
the host loop's: tests/runtime/test_rounds_greedy_trees.py). The chi-square against the tiny target's enumerated distribution
(tests/runtime/test_rounds.py) checks the head's round is lossless, and flags a round whose q is
not the row its drafts came from.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_rounds import GUIDED, PASS, chi2_of, tiny_models  # noqa: E402
from specrt.models.eagle_head import EagleConfig, EagleHead  # noqa: E402
from specrt.runtime.eagle import EagleDrafter  # noqa: E402
from specrt.runtime.methods import make_method  # noqa: E402
from specrt.runtime.decoding import Decoding  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402
from specrt.runtime.rounds import plan_round  # noqa: E402
from specrt.runtime.rounds.chains import ChainRound  # noqa: E402
from specrt.runtime.rounds.dynamic import DynamicTreeRound  # noqa: E402
from specrt.runtime.sampling import SamplingParams, guidance_mix  # noqa: E402
from round_runs import run_to_end  # noqa: E402

GREEDY = SamplingParams(cfg_scale=2.0, temperature=0.0)
CHAIN = {"draft_len": 3}
STATIC = {"tree": "static", "static_tree": "reverse_balanced_25"}
DYNAMIC = {"tree": "dynamic", "total_tokens": 10, "depth": 3, "tree_top_k": 3}
SHAPES = [CHAIN, STATIC, DYNAMIC]
SHAPE_IDS = ["chain", "static", "dynamic"]
DEPTH = 5  # the top-k 1 tree's depth: the chain's length
SAMPLES = 4_000  # images of the 81-sequence target: the critical value is the quantile for the cells they fill


def head_pipeline(sampling: SamplingParams, **config) -> Pipeline:
    """test_rounds' tiny target with a random EAGLE head on it as the draft, decoding by rounds (one
    torch thread: the toy's many small calls run ~5x slower on a shared pool)."""
    torch.set_num_threads(1)
    target, _, vq = tiny_models(**config)
    head = EagleHead(EagleConfig.for_target(target, n_head=2, ffn_hidden=16)).tie_to(target).eval()
    with torch.no_grad():
        for parameter in (head.fc.weight, *head.layers.parameters()):
            parameter.normal_(0.0, 0.3)
    pipe = Pipeline.from_torch(target, head, vq, max_window=64, sampling_defaults=sampling, max_images=PASS)
    pipe.loop = "round"
    return pipe


def drafts_by_round(monkeypatch, round_class, name: str, drafts_of) -> list:
    """Record, each time round_class.<name> runs, drafts_of(its output) [I, D] and which images were live."""
    seen, original = [], getattr(round_class, name)

    def recording(self, state, *args):
        out = original(self, state, *args)
        seen.append((drafts_of(self, out).clone(), (~state.finished).clone()))
        return out

    monkeypatch.setattr(round_class, name, recording)
    return seen


RECORDERS = {"chain": (ChainRound, "_draft", lambda self, out: out[0]),
             "dynamic": (DynamicTreeRound, "_grow", lambda self, out: out[1][:, 1:])}


def test_a_head_round_is_lossless_and_flags_a_q_that_is_not_the_drafts_row(monkeypatch):
    """sd's chain with a head against the exact distribution (test_rounds' chi-square), then the same
    with each draft's q reported as uniform: flagged."""
    pipe = head_pipeline(GUIDED)
    statistic, critical = chi2_of(pipe, "sd", GUIDED, SAMPLES, draft_len=2)
    assert statistic < critical, f"head chain: chi2 {statistic:.1f} >= {critical:.1f}"
    draft = ChainRound._draft

    def uniform_q(self, state, n, steps):
        drafts, q_rows = draft(self, state, n, steps)
        return drafts, torch.full_like(q_rows, 1.0 / q_rows.shape[-1])

    monkeypatch.setattr(ChainRound, "_draft", uniform_q)
    statistic, critical = chi2_of(head_pipeline(GUIDED), "sd", GUIDED, SAMPLES, draft_len=2)
    assert statistic > critical, f"a q off the drafts' rows passed: chi2 {statistic:.1f} < {critical:.1f}"


@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_a_greedy_head_chain_round_drafts_what_the_host_loop_drafts(monkeypatch, model_type):
    """One image, round by round: the round's drafts (every one the host drafted: near the end the host
    drafts fewer) and its tokens are the host loop's. t2i: a caption padded to the model's cond_len."""
    config = {"model_type": "t2i", "cond_len": 5, "caption_dim": 12} if model_type == "t2i" else {}
    pipe = head_pipeline(GREEDY, vocab=16, grid=4, classes=10, **config)
    conditions = {"captions": (np.random.default_rng(0).standard_normal((1, 5, 12)).astype(np.float32),
                               np.array([[1, 1, 1, 0, 0]], dtype=bool))} if config else {"class_ids": [6]}
    rounds = drafts_by_round(monkeypatch, *RECORDERS["chain"])
    host, propose = [], EagleDrafter.propose_chain

    def recording(self, ctx, lengths):
        drafts, rows = propose(self, ctx, lengths)
        host.append(drafts[0])
        return drafts, rows

    monkeypatch.setattr(EagleDrafter, "propose_chain", recording)
    by_rounds = pipe.generate(**conditions, method="sd", seed=4, decode=False, **CHAIN)
    pipe.loop = "host"
    by_host = pipe.generate(**conditions, method="sd", seed=4, decode=False, **CHAIN)
    np.testing.assert_array_equal(by_rounds.tokens, by_host.tokens)
    host = [drafts for drafts in host if drafts]
    assert len(host) >= len(rounds) - 1 and sum(len(d) for d in host) > len(host)
    for r, ((drafts, _), expected) in enumerate(zip(rounds, host)):
        assert drafts[0, : len(expected)].tolist() == expected, f"round {r}"
    assert by_rounds.stats.accepted_lengths == by_host.stats.accepted_lengths


def test_a_greedy_head_tree_of_top_k_1_drafts_the_chain_rounds_drafts(monkeypatch):
    """A greedy dynamic tree of top-k 1 is the argmax chain its depth long: a tree round feeds each node
    its parent's head feature and keeps the target's along the accepted path, as the chain round does."""
    pipe = head_pipeline(GREEDY, vocab=16, grid=4, classes=10)
    chains = drafts_by_round(monkeypatch, *RECORDERS["chain"])
    trees = drafts_by_round(monkeypatch, *RECORDERS["dynamic"])
    chain = pipe.generate([3, 6, 1], method="sd", seed=4, decode=False, draft_len=DEPTH)
    grown = pipe.generate([3, 6, 1], method="sd", seed=4, decode=False, tree="dynamic", total_tokens=DEPTH,
                          depth=DEPTH, tree_top_k=1)
    np.testing.assert_array_equal(grown.tokens, chain.tokens)
    assert len(trees) == len(chains) > 0
    for r, ((tree_drafts, live), (chain_drafts, _)) in enumerate(zip(trees, chains)):
        assert tree_drafts.shape == chain_drafts.shape
        assert torch.equal(tree_drafts[live], chain_drafts[live]), f"round {r}"
    assert grown.stats.accepted_lengths == chain.stats.accepted_lengths
    assert max(grown.stats.accepted_lengths) > 1  # some drafts were accepted: the paths were kept


@pytest.mark.parametrize("params", SHAPES, ids=SHAPE_IDS)
def test_an_image_is_the_same_alone_and_in_any_batch_with_a_head(params):
    pipe = head_pipeline(GUIDED, vocab=16, grid=4, classes=10)
    batch = pipe.generate([3, 6, 1, 6], method="sd", seed=[5, 9, 2, 13], decode=False, **params)
    assert batch.stats.host_syncs == batch.stats.target_calls + 1  # one read a round, one at the end
    assert pipe.target.forwards == 0 and pipe.draft.forwards == 0  # no host-driven step ran
    for i, (label, seed) in enumerate([(3, 5), (6, 9), (1, 2), (6, 13)]):
        alone = pipe.generate([label], method="sd", seed=seed, decode=False, **params).tokens
        np.testing.assert_array_equal(batch.tokens[i], alone[0], err_msg=f"{params} image {i}")
    assert len({tuple(row.ravel()) for row in batch.tokens}) > 1


@pytest.mark.parametrize("params", [CHAIN, {"tree": "dynamic", "total_tokens": 4, "depth": 2, "tree_top_k": 2}],
                         ids=["chain", "dynamic"])
def test_head_rounds_trace_whole_under_fullgraph_compile(params):
    """As test_rounds' check: torch.compile(fullgraph=True, aot_eager) traces the head's round with no
    graph break, and the traced round gives the eager tokens. (A static tree's head passes are the
    dynamic tree's HeadDraft.expand: left out for time, its tree code traced in test_rounds.)"""
    pipe = head_pipeline(GUIDED, vocab=16, grid=4, classes=10)
    method = make_method("sd", **params)
    mix = guidance_mix(2, GUIDED)
    rows = Decoding(pipe.target, None, GUIDED, [], None).condition_rows(pipe.conditions([3, 6]))
    total = pipe.target.spec.num_image_tokens
    tokens = []
    for compiled in (False, True):
        round_ = plan_round(method, pipe.target, pipe.draft, GUIDED, mix, None)
        with torch.inference_mode():
            state = round_.start(rows, [5, 6], total)
            run_to_end(round_, state, compiled, total)
            tokens.append(state.tokens[:, :total].clone())
    torch.testing.assert_close(tokens[1], tokens[0], rtol=0, atol=0)
