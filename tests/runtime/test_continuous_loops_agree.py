"""For a seed the continuous host loop gives the device round's tokens (ar and cspd).

Both loops key every number — chain noise, acceptance coins, residual proposals — by the same
coordinates (runtime/families/continuous/draws.py), so they decide alike and differ only by float
rounding (a batched chain sums in another order). Checked on the shipped MAR demo and on a tiny
random-weight pair whose residual draws often outlast the round's K proposals: the round leaves
such a draw open to later rounds, which the host loop's keying follows (proposal m in round
r + m // K). A host loop keyed by another K gives other tokens, so the check has teeth.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.models.mar.model import MARConfig, random_mar  # noqa: E402
from specrt.runtime.families.continuous import methods  # noqa: E402
from specrt.runtime.families.continuous.pipeline import ContinuousPipeline  # noqa: E402
from specrt.runtime.families.continuous.torch_runner import torch_runners  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

ATOL = 1e-4
IMAGES = 200
CSPD = {"draft_len": 2, "prefill_ratio": 0.0}


def both_loops(pipe, classes, method: str, seed: int, **params):
    results = {}
    for loop in ("host", "round"):
        pipe.loop = loop
        results[loop] = pipe.generate(classes, method=method, seed=seed, decode=False, **params)
    return results["host"], results["round"]


@pytest.mark.parametrize("method", ["ar", "cspd"])
def test_the_mar_demo_gives_a_seed_the_same_tokens_in_both_loops(method):
    from specrt.export.mar.hooks import torch_pipeline

    host, round_ = both_loops(torch_pipeline(), [7], method, seed=3)
    np.testing.assert_allclose(host.tokens, round_.tokens, rtol=0, atol=ATOL)
    assert (host.stats.accepted, host.stats.drafted) == (round_.stats.accepted, round_.stats.drafted)
    assert host.stats.residual_proposals == round_.stats.residual_proposals
    if method == "cspd":
        assert 0 < host.stats.accepted < host.stats.drafted


@pytest.fixture(scope="module")
def residual_pair() -> ContinuousPipeline:
    """One token of one channel, a 2-step chain, weights at scale 0.5: the draft often misses, and
    some residual draws need more than K proposals."""
    shared = dict(n_head=2, schedule="linear", token_dim=1, seq_len=1, diffusion_steps=2, beta_start=0.3, beta_end=0.3)
    target = random_mar(MARConfig(dim=32, n_layer=2, head_width=32, **shared), seed=0, scale=0.5)
    draft = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **shared), seed=1, scale=0.5)
    return ContinuousPipeline(*torch_runners(target, draft), None, {}, max_images=IMAGES)


@pytest.mark.parametrize("residual_batch", [methods.RESIDUAL_PROPOSALS, 3])
def test_residual_draws_that_span_rounds_take_the_same_proposal(residual_pair, residual_batch):
    """Whatever batch the host loop draws its proposals in, it takes the round's."""
    host, round_ = both_loops(residual_pair, [3] * IMAGES, "cspd", seed=1, residual_batch=residual_batch, **CSPD)
    assert round_.stats.target_forwards > host.stats.target_forwards == IMAGES, "no draw outlasted a round"
    np.testing.assert_allclose(host.tokens, round_.tokens, rtol=0, atol=ATOL)
    assert host.stats.residual_proposals == round_.stats.residual_proposals


def test_ar_of_the_tiny_pair_and_a_batch_agree(residual_pair):
    host, round_ = both_loops(residual_pair, [1, 3, 5, 7], "ar", seed=11)
    np.testing.assert_allclose(host.tokens, round_.tokens, rtol=0, atol=ATOL)


def test_a_host_loop_keyed_by_another_k_gives_other_tokens(residual_pair, monkeypatch):
    monkeypatch.setattr(methods, "RESIDUAL_PROPOSALS", methods.RESIDUAL_PROPOSALS // 2)
    host, round_ = both_loops(residual_pair, [3] * IMAGES, "cspd", seed=1, **CSPD)
    moved = np.abs(host.tokens - round_.tokens).max(axis=(1, 2)) > 1e-3
    assert moved.any(), "the keying of proposals past the round's K went unchecked"
