"""Lossless methods reproduce the target's exact sequence distribution (chi-square, 20,000 images,
decoded in batches of 256).

The toy family (vocab 3, 2x2 grid = 4 tokens) is small enough to enumerate P over all 81
sequences. Each method samples 20,000 images with a fixed seed; the chi-square statistic must
stay under the 1 − 1e-4 quantile. The same check must flag deliberately broken variants,
injected as Method subclasses, so a pass means something.
"""
from __future__ import annotations

import numpy as np
import pytest

from _toy_exact import chi_square, exact_distribution, one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.runtime.backends.toy import UNCOND_TOKEN, toy_models
from specrt.runtime.methods.jacobi import JacobiDecoding
from specrt.runtime.methods.speculative import SpeculativeDecoding
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.verification.rules import VanillaRule

SAMPLES = 20_000
CLASS_ID = 1
PASS = 256  # images decoded together: every sample run is a batched one (ragged acceptance, images leaving)


def run(method, sampling: SamplingParams, vocab: int = 3, grid: int = 2, samples: int = SAMPLES, max_window: int = 16,
        **params) -> tuple[float, float]:
    target, draft, vq = toy_models(vocab_size=vocab, grid_size=grid, num_classes=2, seed=3, max_window=max_window)
    pipe = Pipeline(target, vq, draft, sampling_defaults=vars(sampling), max_images=PASS)
    tokens = pipe.generate([CLASS_ID] * samples, method=method, seed=11, **params).tokens
    exact = exact_distribution(target.lm, CLASS_ID, 2, vocab, grid * grid, sampling)
    assert abs(sum(exact.values()) - 1) < 1e-9
    return chi_square(tokens, exact)


PLAIN = SamplingParams(cfg_scale=1.0)
GUIDED = SamplingParams(cfg_scale=2.0, temperature=0.9, top_k=2)

LOSSLESS = [
    ("sd", {"draft_len": 3}, GUIDED),
    ("cool-sd", {"relaxation_budget": 1.0, "schedule": "uniform", "draft_len": 2}, PLAIN),
    ("cool-sd", {"relaxation_budget": 1.0, "schedule": "uniform", "draft_len": 3}, GUIDED),  # UniformRSD δ = 1 is SD
    ("sjd", {"window": 3}, PLAIN),
    # 9 binary tokens: deep proactive-drafting trees (spine + siblings) and chains behind them
    ("sjd-pac", {"window": 8, "branching": 2, "tree_depth": 2, "vocab": 2, "grid": 3}, PLAIN),
    ("sjd-pac", {"window": 6, "branching": 2, "tree_depth": 2}, GUIDED),
    ("sjd-pac", {"window": 4, "proactive_drafting": False}, PLAIN),
    ("sjd-pac", {"window": 6, "branching": 3, "tree_depth": 1, "adaptive_continuation": False}, PLAIN),
    # tree drafting: EAGLE-1's static tree (children drawn without replacement; 3 of its 4 root
    # ranks exist in a vocabulary of 3) and an EAGLE-2 dynamic tree (top-k children, point masses),
    # recursive rejection over siblings. 2,000 and 1,500 images (a tree round costs several draft
    # passes); the critical value is the chi-square quantile for the cells this many images fill;
    # test_planted_bugs flags a broken sibling residual at the same 2,000 (chi2 134 vs a critical 85)
    # and dynamic children verified against q at 500.
    ("sd", {"tree": "static", "samples": 2_000, "max_window": 26}, PLAIN),
    ("sd", {"tree": "dynamic", "total_tokens": 6, "depth": 3, "tree_top_k": 2, "samples": 1_500}, GUIDED),
]


@pytest.mark.parametrize("method,params,sampling", LOSSLESS,
                         ids=[f"{m}-{'-'.join(f'{k}{v}' for k, v in p.items())}-{'cfg' if s.uses_cfg else 'plain'}"
                              for m, p, s in LOSSLESS])
def test_lossless_methods_match_the_exact_target_distribution(method, params, sampling):
    statistic, critical = run(method, sampling, **params)
    assert statistic < critical, f"{method} {params}: chi2 {statistic:.1f} >= {critical:.1f}"


class ResampleFromTarget(VanillaRule):
    """Broken on purpose: resample from P instead of the residual Norm([P − Q]_+)."""

    def resample(self, p, q, token, position):
        return p


class BrokenSD(SpeculativeDecoding):
    def rule(self, ctx):
        return ResampleFromTarget()


class BrokenJacobi(JacobiDecoding):
    """Broken on purpose: drafts taken from stale rows claim a uniform proposal q."""

    def _next_levels(self, ctx, levels, p_rows, draws, spine, accepted, rejected):
        new = super()._next_levels(ctx, levels, p_rows, draws, spine, accepted, rejected)
        vocab = p_rows.shape[-1]
        for level in new:
            level.q = np.full(vocab, 1.0 / vocab)
        return new


@pytest.mark.parametrize("broken", [BrokenSD(draft_len=2), BrokenJacobi(window=3)], ids=["sd-resample-from-P", "sjd-wrong-proposal-q"])
def test_the_check_flags_broken_variants(broken):
    statistic, critical = run(broken, PLAIN)
    assert statistic > critical, f"broken {broken.name} passed: chi2 {statistic:.1f} < {critical:.1f}"


# Text-to-image: a caption of 2 real tokens in a 4-token condition (left-padded, so 2 hidden
# columns), under CFG (the uncond rows keep the caption's mask). The toy checks every slot's
# position against the columns its mask shows, so a padded column leaking in fails loudly.
CAPTION = (5.0, 7.0)
# Half the c2i sample size keeps the suite's time; the broken variant is still flagged at it.
T2I_SAMPLES = SAMPLES // 2
T2I = [("sd", {"draft_len": 3}, GUIDED), ("sjd", {"window": 3}, GUIDED)]


def run_t2i(method, sampling: SamplingParams, **params) -> tuple[float, float]:
    target, draft, vq = toy_models(vocab_size=3, grid_size=2, seed=3, caption_len=4)
    pipe = Pipeline(target, vq, draft, sampling_defaults=vars(sampling), max_images=PASS)
    captions = np.tile(np.array(CAPTION, dtype=np.float32)[None, :, None], (T2I_SAMPLES, 1, 1))
    tokens = pipe.generate(captions=captions, method=method, seed=11, **params).tokens
    exact = exact_distribution(target.lm, tuple(int(c) for c in CAPTION), (UNCOND_TOKEN,) * len(CAPTION), 3, 4, sampling)
    return chi_square(tokens, exact)


@pytest.mark.parametrize("method,params,sampling", T2I, ids=[m for m, _, _ in T2I])
def test_lossless_methods_on_padded_captions(method, params, sampling):
    statistic, critical = run_t2i(method, sampling, **params)
    assert statistic < critical, f"t2i {method} {params}: chi2 {statistic:.1f} >= {critical:.1f}"


def test_the_t2i_check_flags_a_broken_variant():
    statistic, critical = run_t2i(BrokenSD(draft_len=2), GUIDED)
    assert statistic > critical, f"broken sd passed on t2i: chi2 {statistic:.1f} < {critical:.1f}"
