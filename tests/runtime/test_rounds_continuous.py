"""The continuous family's device rounds (ar, cspd): exact, traced whole, one host read a round.

Tiny random-weight MAR pairs (the draft smaller than the target) on PyTorch. Exactness: the rounds'
tokens against the host loop's ar (the target's own distribution) by per-dimension KS and a
permutation MMD (tests/runtime/_continuous_exact.py, tolerances from the sample sizes): SINGLE (one
token of one channel, a 2-step chain: the residual step alone, with the sample its subtle bugs
need; the round's open residual draws happen there) must flag a round whose residual skips the
rejection; CHAIN (2 tokens of 2 channels, 3-step chain, drafts of 2, MAR's linear CFG) covers
commits, bonus tokens and rejections inside a draft. torch.compile(fullgraph=True) of each round
shows on a CPU that a GPU can capture it whole.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from _continuous_exact import same_distribution  # noqa: E402
from specrt.errors import SpecrtError  # noqa: E402
from specrt.models.mar.model import MARConfig, random_mar  # noqa: E402
from specrt.runtime.families.continuous import rounds as continuous_rounds  # noqa: E402
from specrt.runtime.families.continuous.methods import make_continuous_method  # noqa: E402
from specrt.runtime.families.continuous.pipeline import ContinuousPipeline  # noqa: E402
from specrt.runtime.families.continuous.round_loop import plan_round  # noqa: E402
from specrt.runtime.families.continuous.torch_runner import torch_runners  # noqa: E402
from round_runs import run_to_end  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

CLASS_ID = 3
SINGLE_SAMPLES, CHAIN_SAMPLES = 6_000, 600
SINGLE = dict(token_dim=1, seq_len=1, diffusion_steps=2, beta_start=0.3, beta_end=0.3)
CHAIN = dict(token_dim=2, seq_len=2, diffusion_steps=3, beta_start=0.1, beta_end=0.5)
BATCH = dict(token_dim=2, seq_len=8, diffusion_steps=3, beta_start=0.1, beta_end=0.5)
LINEAR_CFG = {"cfg_scale": 3.0, "cfg_schedule": "linear"}


def pipeline(scale: float, loop: str = "round", sampling: dict | None = None, device: str = "cpu",
             **shared) -> ContinuousPipeline:
    shared = dict(n_head=2, schedule="linear", **shared)
    target = random_mar(MARConfig(dim=32, n_layer=2, head_width=32, **shared), seed=0, scale=scale)
    draft = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **shared), seed=1, scale=scale)
    pipe = ContinuousPipeline(*torch_runners(target, draft, device=device), None, sampling or {}, max_images=100_000)
    pipe.loop = loop
    return pipe


def tokens_of(pipe: ContinuousPipeline, method: str, samples: int, seed: int, loop: str, **params):
    pipe.loop = loop
    result = pipe.generate([CLASS_ID] * samples, method=method, seed=seed, decode=False, **params)
    return result.tokens, result.stats


class SkippedRejection(continuous_rounds.CSpDRound):
    """Broken on purpose: the residual takes the target's first proposal, never Norm([p − q]_+)."""

    residual_acceptance = staticmethod(lambda log_p, log_q: torch.ones_like(log_p))


@pytest.mark.parametrize("planted", [False, True], ids=["cspd", "residual-skips-rejection"])
def test_the_residual_step_of_the_round_is_exact_and_its_bug_is_caught(monkeypatch, planted):
    pipe = pipeline(0.5, **SINGLE)
    reference, _ = tokens_of(pipe, "ar", SINGLE_SAMPLES, seed=1, loop="host")
    if planted:
        monkeypatch.setattr(continuous_rounds, "CSpDRound", SkippedRejection)
    tokens, stats = tokens_of(pipe, "cspd", SINGLE_SAMPLES, seed=2, loop="round", draft_len=1, prefill_ratio=0.0)
    assert 0.15 < stats.acceptance_rate < 0.85, "the pair must both accept and reject for the test to mean much"
    if not planted:  # some residual draws stayed open after K proposals and ended in a later round
        assert stats.target_forwards > SINGLE_SAMPLES and stats.residual_proposals > stats.drafted - stats.accepted
    ok, line = same_distribution(tokens, reference)
    assert ok != planted, line


@pytest.mark.parametrize("method,params", [("ar", {}), ("cspd", {"draft_len": 2, "prefill_ratio": 0.0})],
                         ids=["ar", "cspd"])
def test_rounds_match_the_host_loops_target_distribution_under_linear_cfg(method, params):
    pipe = pipeline(0.1, **CHAIN)
    reference, _ = tokens_of(pipe, "ar", CHAIN_SAMPLES, seed=1, loop="host", **LINEAR_CFG)
    tokens, stats = tokens_of(pipe, method, CHAIN_SAMPLES, seed=2, loop="round", **LINEAR_CFG, **params)
    ok, line = same_distribution(tokens, reference)
    assert ok, line
    if method == "cspd":
        assert 0.15 < stats.acceptance_rate < 0.85 and stats.tokens_per_target_pass > 1


@pytest.mark.parametrize("method,params", [("ar", {}), ("cspd", {"draft_len": 3, "prefill_ratio": 0.1})],
                         ids=["ar", "cspd"])
def test_an_image_is_the_same_alone_and_in_a_batch(method, params):
    pipe = pipeline(0.1, sampling={"cfg_scale": 2.0}, **BATCH)
    classes = [1, 3, 5, 7]
    batch = pipe.generate(classes, method=method, seed=20, decode=False, **params)
    for i, label in enumerate(classes):
        alone = pipe.generate([label], method=method, seed=20 + i, decode=False, **params).tokens
        np.testing.assert_allclose(batch.tokens[i], alone[0], atol=1e-5, err_msg=f"{method} image {i}")
    assert len({row.tobytes() for row in batch.tokens}) == len(classes)


def planned(method: str, pipe: ContinuousPipeline, sampling: dict, classes, **params):
    settings = {**pipe.sampling_defaults, **sampling}
    return plan_round(make_continuous_method(method, **params), pipe.target, pipe.draft, settings, np.array(classes))


def test_images_stop_at_seq_len_and_ride_along_unchanged_once_finished():
    pipe = pipeline(0.1, **BATCH)
    round_ = planned("cspd", pipe, {"cfg_scale": 2.0}, [2, 4, 6], draft_len=3, prefill_ratio=0.1)
    with torch.inference_mode():
        state = round_.start(np.array([2, 4, 6]), [1, 2, 3])
        lengths = []
        while not bool(state.finished.all()):
            round_(state)
            lengths.append(state.length.clone())
        done = [t.clone() for t in (state.tokens[:, :state.total], state.length, state.rounds, state.drafted,
                                    state.accepted, state.proposals)]
        round_(state)
        round_(state)
    steps = torch.stack(lengths)
    assert (steps <= state.total).all() and (steps[1:] >= steps[:-1]).all()
    assert state.length.tolist() == [state.total] * 3 and not bool(state.pending.any())
    for before, after in zip(done, (state.tokens[:, :state.total], state.length, state.rounds, state.drafted,
                                    state.accepted, state.proposals)):
        torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_a_residual_draw_left_open_keeps_its_image_in_place_until_a_later_round_ends_it():
    """An image whose K proposals all fail keeps its accepted drafts and its open draw (pending); its
    next rounds accept no draft and move nothing until a proposal is taken: then exactly one token."""
    pipe = pipeline(0.1, **BATCH)
    classes = np.array([2, 4, 6, 8])
    round_ = planned("cspd", pipe, {"cfg_scale": 2.0}, classes, draft_len=3, prefill_ratio=0.0)
    with torch.inference_mode():
        state = round_.start(classes, [1, 2, 3, 4])
        round_.residual_acceptance = lambda log_p, log_q: torch.zeros_like(log_p)  # every proposal fails
        round_(state)
        open_ = state.pending.clone()
        length, tokens, drafted = state.length.clone(), state.tokens[:, :8].clone(), state.drafted.clone()
        assert open_.any() and (length[open_] < 3).all() and length[open_].sum() > 0, length
        round_(state)
        assert state.pending[open_].all() and (state.length[open_] == length[open_]).all()
        assert (state.drafted[open_] == drafted[open_]).all()
        decided = (torch.arange(8)[None, :] < length[:, None]) & open_[:, None]  # past the length: scratch
        torch.testing.assert_close(state.tokens[:, :8][decided], tokens[decided], rtol=0, atol=0)
        del round_.residual_acceptance
        while state.pending[open_].any():
            before = state.length.clone()
            still = state.pending.clone()
            round_(state)
            ended = still & ~state.pending
            assert (state.length[ended] == before[ended] + 1).all()
            assert (state.length[still & state.pending] == before[still & state.pending]).all()


def test_a_round_reads_the_host_once_and_never_runs_the_host_step(monkeypatch):
    """Every read of a tensor's value on the host is counted while the pipeline decodes (bool, item,
    tolist, cpu: what moves a device tensor's numbers to the host; numpy takes a host tensor): one a
    round and two at the end, what stats.host_syncs reports."""
    pipe = pipeline(0.1, sampling={"cfg_scale": 2.0}, **BATCH)
    reads = []
    for name in ("__bool__", "item", "tolist", "cpu"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _f=original, _n=name, **k: reads.append(_n) or _f(self, *a, **k))
    result = pipe.generate([1, 3, 5], method="cspd", seed=1, decode=False, draft_len=3, prefill_ratio=0.1)
    monkeypatch.undo()
    rounds = result.stats.target_passes
    assert len(reads) == result.stats.host_syncs == rounds + 2, reads
    assert pipe.target.forwards == pipe.draft.forwards == pipe.target.head_calls == 0
    assert result.stats.tokens == 3 * 8 and rounds < 8


@pytest.mark.parametrize("method,params", [("ar", {}), ("cspd", {"draft_len": 2, "prefill_ratio": 0.25})],
                         ids=["ar", "cspd"])
def test_each_round_traces_whole_under_fullgraph_compile(method, params):
    """torch.compile(fullgraph=True) fails on any graph break (a read of a tensor on the host, a Python
    branch on a tensor, a tensor made from host data): a round it traces is one a GPU captures whole.
    The traced round (aot_eager) gives the eager round's tokens."""
    shared = dict(token_dim=2, seq_len=4, n_head=2, diffusion_steps=2, schedule="linear", beta_start=0.1, beta_end=0.5)
    target = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **shared), seed=0, scale=0.1)
    draft = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **shared), seed=1, scale=0.1)
    pipe = ContinuousPipeline(*torch_runners(target, draft), None, {})
    tokens = []
    for compiled in (False, True):
        round_ = planned(method, pipe, LINEAR_CFG, [3, 6], **params)
        with torch.inference_mode():
            state = round_.start(np.array([3, 6]), [5, 6])
            run_to_end(round_, state, compiled, max_runs=64 * state.total)
            tokens.append(state.tokens[:, :state.total].clone())
    torch.testing.assert_close(tokens[1], tokens[0], rtol=0, atol=0)


def test_the_loop_setting_is_checked_and_auto_on_a_cpu_is_the_host_loop():
    pipe = pipeline(0.1, loop="bogus", **BATCH)
    with pytest.raises(SpecrtError, match="loop"):
        pipe.generate([1], method="ar", decode=False)
    pipe.loop = "auto"
    auto = pipe.generate([1, 2], method="cspd", seed=3, decode=False)
    assert auto.stats.host_syncs is None and pipe.target.forwards > 0
    pipe.loop = "host"
    np.testing.assert_array_equal(auto.tokens, pipe.generate([1, 2], method="cspd", seed=3, decode=False).tokens)
    pipe.target.device_rounds = False  # as an onnxruntime runner: no module to run a round with
    pipe.loop = "round"
    with pytest.raises(SpecrtError, match="PyTorch"):
        pipe.generate([1], method="ar", decode=False)
