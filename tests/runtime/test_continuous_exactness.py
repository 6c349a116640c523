"""cspd emits the target's own token distribution (paper 002), on onnxruntime and PyTorch.

Two tiny continuous target/draft pairs with random weights (draft smaller than target) are
exported to bundles once: CHAIN (2 tokens of 2 channels, a 3-step DDPM chain, drafts of 2, so
KV commits, bonus tokens and rejections inside a draft all happen) and SINGLE (1 token of 1
channel, a 2-step chain: the residual step in isolation, cheap enough for the larger sample its
subtler bugs need). The target alone (ar) and cspd sample with fixed seeds; per-dimension KS
and a permutation MMD (tests/runtime/_continuous_exact.py) must not tell them apart, and must
flag the planted bugs: a residual bound M far below 1/Z, a residual drawn from the target
itself, and independent instead of aligned noise in the acceptance ratio. Every image has its
own seed; the samples are decoded as one batch (ragged acceptance, the product's
path) and, for the plain case, one image per call too; cspd is also checked at a noise
temperature of 0.9 (MAR's temperature: it scales every denoising step's noise, τ·σ_t).
"""
from __future__ import annotations

import numpy as np
import pytest

from _continuous_exact import same_distribution, tiny_bundle
from specrt.runtime.families.continuous import draws, formulas as continuous
from specrt.runtime.families.continuous.bundle import open_runner
from specrt.runtime.families.continuous.methods import CSpD, ContinuousAR, ContinuousDecoding, ContinuousStats

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

SAMPLES = 600          # CHAIN
SINGLE_SAMPLES = 20000  # SINGLE (batched, so cheap: the too-small bound moves KS by ~0.045)
CLASS_ID = 3
SINGLE_SCALE = 0.5
CSPD = {"draft_len": 2, "prefill_ratio": 0.0}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("chain") / "bundle", 0.1, token_dim=2, seq_len=2,
                       diffusion_steps=3, beta_start=0.1, beta_end=0.5)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("single") / "bundle", SINGLE_SCALE, token_dim=1, seq_len=1,
                       diffusion_steps=2, beta_start=0.3, beta_end=0.3)


@pytest.fixture(scope="module")
def single_reference(single):
    return sample(single, ContinuousAR(), seed=1, samples=SINGLE_SAMPLES)[0]


def sample(bundle, method, seed: int, samples: int = SAMPLES, backend: str = "onnxruntime", per_call: int = 0,
           **sampling):
    """`samples` images of CLASS_ID, image i with seed (seed << 32) + i (one sample's seeds apart from
    another's), decoded `per_call` images a call (0: all in one batch); sampling: cfg_scale,
    cfg_schedule, temperature."""
    target, draft = open_runner(bundle, "target", backend), open_runner(bundle, "draft", backend)
    seeds = [(seed << 32) + i for i in range(samples)]
    per_call = per_call or samples
    stats, tokens = ContinuousStats(), []
    for first in range(0, samples, per_call):
        part = seeds[first : first + per_call]
        ctx = ContinuousDecoding(target, draft, part, stats=stats, **sampling)
        tokens.append(method.generate(ctx, np.full(len(part), CLASS_ID)))
    return np.concatenate(tokens), stats


@pytest.fixture(scope="module")
def reference(bundle):
    return sample(bundle, ContinuousAR(), seed=1)[0]


@pytest.mark.parametrize("sampling, per_call", [
    ({}, 0), ({}, 1), ({"cfg_scale": 3.0, "cfg_schedule": "linear"}, 0), ({"temperature": 0.9}, 0),
], ids=["plain-batched", "plain-one-image-per-call", "cfg-linear-batched", "temperature-0.9-batched"])
def test_cspd_matches_the_target_distribution(bundle, reference, sampling, per_call):
    """Batched (all samples in one call: ragged acceptance, per-image streams) and one image per
    call; with CFG under MAR's linear schedule (each token position its own scale, shared by
    target and draft; the constant schedule's CFG path is the backends-agree test's); and at
    temperature 0.9 against ar at 0.9."""
    target_tokens = sample(bundle, ContinuousAR(), seed=1, **sampling)[0] if sampling else reference
    tokens, stats = sample(bundle, CSpD(**CSPD), seed=2, per_call=per_call, **sampling)
    assert 0.15 < stats.acceptance_rate < 0.85, "the pair must both accept and reject for the test to mean much"
    assert stats.tokens_per_target_pass > 1
    ok, line = same_distribution(tokens, target_tokens)
    assert ok, line
    if sampling:  # same seeds, same noise: guidance (the unconditional rows) or τ moved the tokens
        assert np.abs(target_tokens - reference).max() > 1e-3
    if not per_call:  # one batch: a target pass serves every unfinished image
        assert stats.target_passes < stats.target_forwards / 10


class TooSmallBound(CSpD):
    """Broken on purpose: bound M = 1/(100·Z), so M·p < p' wherever p' is large."""

    residual_acceptance = staticmethod(lambda log_p, log_q: np.minimum(1.0, 100 * continuous.residual_acceptance(log_p, log_q)))


class ResidualFromTarget(CSpD):
    """Broken on purpose: the rejected token is redrawn from the target, not Norm([p − q]_+)."""

    residual_acceptance = staticmethod(lambda log_p, log_q: np.ones_like(log_p))


class IndependentNoise(CSpD):
    """Broken on purpose: the target scores the drafts on its own noise, not the draft's."""

    def verification_noise(self, ctx, draft_noise, rows):
        return ctx.noise(rows, draws.PROPOSAL_TEST + 1)  # a kind no draw uses: independent numbers


def test_independent_noise_is_caught(bundle, reference):
    tokens, _ = sample(bundle, IndependentNoise(**CSPD), seed=2)
    ok, line = same_distribution(tokens, reference)
    assert not ok, f"IndependentNoise passed: {line}"


@pytest.mark.parametrize("method", [CSpD, TooSmallBound, ResidualFromTarget], ids=lambda c: c.__name__)
def test_the_residual_step_is_exact_and_its_bugs_are_caught(single, single_reference, method):
    tokens, stats = sample(single, method(draft_len=1, prefill_ratio=0.0), seed=2, samples=SINGLE_SAMPLES)
    assert 0.15 < stats.acceptance_rate < 0.85
    ok, line = same_distribution(tokens, single_reference)
    assert ok == (method is CSpD), f"{method.__name__}: {line}"


def test_pytorch_and_onnxruntime_emit_the_same_tokens(bundle):
    """One bundle, two backends: same seed, same decisions, tokens equal to float tolerance."""
    onnx_tokens, onnx_stats = sample(bundle, CSpD(**CSPD), seed=5, samples=4, cfg_scale=2.0)
    torch_tokens, torch_stats = sample(bundle, CSpD(**CSPD), seed=5, samples=4, backend="torch", cfg_scale=2.0)
    assert onnx_stats.accepted == torch_stats.accepted
    np.testing.assert_allclose(torch_tokens, onnx_tokens, atol=1e-4)


def test_prefilling_takes_the_first_tokens_from_the_target(bundle):
    """prefill_ratio = 1 is the target alone (same seeds, same draws, same tokens as ar); 0.5 of
    2 tokens drafts only the second."""
    ar_tokens, _ = sample(bundle, ContinuousAR(), seed=4, samples=5)
    full, full_stats = sample(bundle, CSpD(draft_len=2, prefill_ratio=1.0), seed=4, samples=5)
    np.testing.assert_array_equal(full, ar_tokens)
    assert full_stats.drafted == 0 and full_stats.target_passes == 2 and full_stats.target_forwards == 10
    _, half_stats = sample(bundle, CSpD(draft_len=2, prefill_ratio=0.5), seed=4, samples=5)
    assert half_stats.drafted == 5


def test_cfg_schedule_follows_mar():
    """MAR's linear ramp 1 + (s − 1)·(seq_len − mask_len)/seq_len, mask_len clamped to ≥ 1 before the
    last step (so the last two tokens share a scale); constant is s everywhere."""
    np.testing.assert_allclose(continuous.cfg_scales(3.0, "linear", np.arange(4), 4), [1.5, 2.0, 2.5, 2.5])
    np.testing.assert_allclose(continuous.cfg_scales(3.0, "constant", np.arange(3), 4), [3.0, 3.0, 3.0])
    eps = continuous.guided_eps(np.ones((2, 1)), np.zeros((2, 1)), np.array([1.5, 2.5]))
    np.testing.assert_allclose(eps[:, 0], [1.5, 2.5])
