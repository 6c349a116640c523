"""Every method is exact under a unified model's image grammar (forced row-end tokens), through
the unified family's pipeline (token prompts, left padding, per-row unconditional prompts).

The toy (runtime/backends/toy.py) with `row_end`: 3 codes + the row-end token, a 2x2 grid, so a
stream is [c, c, END, c, c, END] and every one of the 4^6 sequences over the head vocabulary can
be enumerated. The reference is written from the grammar's definition (a forced position puts all
mass on the row end, a sampled one samples the codes' row as LlamaGen would), sharing nothing with
the runtime's grammar code. Planted bugs — a forced token verified as if it were sampled (the
target's forcing lost), a row end drawable at a sampled position — must fail the same check.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from _toy_exact import chi_square, one_torch_thread, reference_row  # noqa: F401 (autouse fixture)
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.families.unified.pipeline import UnifiedPipeline
from specrt.runtime.families.unified.prompts import PromptEncoder
from specrt.runtime.grammar import FORCED_LOGIT, ImageGrammar
from specrt.runtime.sampling import SamplingParams

CODES, GRID, PROMPT_LEN = 3, 2, 3
PROMPT, NULL = [5, 6], [7]  # two real tokens of three (left-padded); the unconditional prompt is one token
GRAMMAR = ImageGrammar(GRID, GRID, CODES, row_end=True)
PLAIN = SamplingParams(cfg_scale=1.0)
GUIDED = SamplingParams(cfg_scale=2.0, temperature=0.9, top_k=2)
SAMPLES, PASS = 6_000, 256


def pipeline(sampling: SamplingParams, target_grammar: ImageGrammar | None = None,
             draft_grammar: ImageGrammar | None = None, max_window: int = 16) -> UnifiedPipeline:
    target, draft, vq = toy_models(vocab_size=CODES, grid_size=GRID, seed=3, row_end=True, prompt_len=PROMPT_LEN,
                                   max_window=max_window)
    target.grammar = target_grammar or target.grammar
    draft.grammar = draft_grammar or draft.grammar
    prompts = PromptEncoder({"uncond": {"kind": "ids", "ids": NULL}, "pad_id": 0}, PROMPT_LEN)
    return UnifiedPipeline(target, vq, GRAMMAR, prompts, draft=draft, sampling_defaults=vars(sampling),
                           max_images=PASS)


def exact_streams(lm, sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(stream) for every sequence over codes + row end: the chain rule over the grammar's rows."""
    forced = {k for k in range(GRAMMAR.stream_len) if k % (GRID + 1) == GRID}
    out = {}
    for seq in itertools.product(range(CODES + 1), repeat=GRAMMAR.stream_len):
        prob = 1.0
        for k, token in enumerate(seq):
            if k in forced:
                prob *= float(token == CODES)
            else:
                uncond = lm.logits((*NULL, *seq[:k]))[:CODES] if sampling.uses_cfg else None
                row = reference_row(lm.logits((*PROMPT, *seq[:k]))[:CODES], uncond, sampling)
                prob *= row[token] if token < CODES else 0.0
            if prob == 0.0:
                break
        out[seq] = prob
    return out


def run(method, sampling: SamplingParams, samples: int = SAMPLES, pipe: UnifiedPipeline | None = None,
        **params) -> tuple[np.ndarray, float, float]:
    pipe = pipe or pipeline(sampling, max_window=params.pop("max_window", 16))
    result = pipe.generate(prompt_ids=[PROMPT] * samples, method=method, seed=11, **params)
    exact = exact_streams(pipe.target.lm, sampling)
    assert abs(sum(exact.values()) - 1) < 1e-9
    return result, *chi_square(result.stream, exact)


LOSSLESS = [
    ("ar", {}, GUIDED),
    ("sd", {"draft_len": 3}, GUIDED),
    ("cool-sd", {"relaxation_budget": 1.0, "schedule": "uniform", "draft_len": 4}, PLAIN),
    ("sjd", {"window": 3}, GUIDED),
    ("sjd-pac", {"window": 6, "branching": 2, "tree_depth": 2}, PLAIN),
    ("sd", {"tree": "static", "samples": 1_500, "max_window": 26}, PLAIN),
    ("sd", {"tree": "dynamic", "total_tokens": 6, "depth": 3, "tree_top_k": 2, "samples": 1_500}, GUIDED),
]


@pytest.mark.parametrize("method,params,sampling", LOSSLESS,
                         ids=[f"{m}-{'-'.join(f'{k}{v}' for k, v in p.items())}" for m, p, _ in LOSSLESS])
def test_lossless_methods_are_exact_under_the_grammar(method, params, sampling):
    params = dict(params)
    result, statistic, critical = run(method, sampling, samples=params.pop("samples", SAMPLES), **params)
    assert GRAMMAR.is_valid(result.stream).all()
    assert result.tokens.shape == (len(result.stream), GRID, GRID)
    assert statistic < critical, f"{method} {params}: chi2 {statistic:.1f} >= {critical:.1f}"


@pytest.mark.parametrize("method,params", [("cool-sd", {"relaxation_budget": 3.0, "schedule": "exp"}),
                                           ("lantern", {"tvd_budget": 0.5})])
def test_relaxed_methods_keep_the_grammar(method, params):
    """Lossy by design, but a relaxed acceptance must never break the grammar (row ends stay put)."""
    pipe = pipeline(PLAIN)
    pipe.neighbours = np.array([[1, 2], [0, 2], [0, 1], [0, 1]], dtype=np.int32)  # codes + the row end's row
    result = pipe.generate(prompt_ids=[PROMPT] * 500, method=method, seed=3, **params)
    assert GRAMMAR.is_valid(result.stream).all()


def test_forced_tokens_cost_no_rejection():
    """Where both models force the row end, sd accepts it every time: with a draft equal to the
    target, the prefill gives token 0 and one pass verifies the other five (four drafts, the row
    ends among them, and the pass's own token) — no rejection anywhere."""
    pipe = pipeline(PLAIN)
    pipe.draft = pipe.target.__class__(pipe.target.lm, pipe.target.spec, 16, GRAMMAR)
    result = pipe.generate(prompt_ids=[PROMPT] * 20, method="sd", seed=0, draft_len=5)
    assert dict(result.stats.accepted_lengths) == {1: 20, GRAMMAR.stream_len - 1: 20}


class ForgetsForcing(ImageGrammar):
    """Planted bug: the target's logits at a forced position are a sampled position's — the forced
    token verified as if it had been sampled."""

    def forced(self) -> np.ndarray:
        return np.full(self.stream_len, -1, dtype=np.int64)


class LeaksRowEnd(ImageGrammar):
    """Planted bug: a sampled position may draw the row end (the structural token not masked)."""

    def constrain(self, logits, next_index):
        out = super().constrain(logits, next_index)
        free = self.forced()[np.clip(np.asarray(next_index), 0, self.stream_len - 1)] < 0
        out[..., self.image_vocab] = np.where(free, np.asarray(logits)[..., self.image_vocab], out[..., self.image_vocab])
        return out


BROKEN = [("sd", {"draft_len": 3}, ForgetsForcing(GRID, GRID, CODES, True), None),
          ("sjd", {"window": 3}, ForgetsForcing(GRID, GRID, CODES, True), None),
          ("sd", {"draft_len": 3}, LeaksRowEnd(GRID, GRID, CODES, True), LeaksRowEnd(GRID, GRID, CODES, True)),
          ("ar", {}, LeaksRowEnd(GRID, GRID, CODES, True), None)]


@pytest.mark.parametrize("method,params,target_grammar,draft_grammar", BROKEN,
                         ids=["sd-forced-verified-as-sampled", "sjd-forced-verified-as-sampled",
                              "sd-row-end-drawn-in-the-image", "ar-row-end-drawn-in-the-image"])
def test_the_check_flags_grammar_bugs(method, params, target_grammar, draft_grammar):
    pipe = pipeline(PLAIN, target_grammar, draft_grammar)
    _, statistic, critical = run(method, PLAIN, samples=2_000, pipe=pipe, **params)
    assert statistic > critical, f"broken grammar passed {method}: chi2 {statistic:.1f} < {critical:.1f}"


def test_constrain_is_a_point_mass_where_forced():
    logits = np.random.default_rng(0).normal(size=(GRAMMAR.stream_len, CODES + 1)).astype(np.float32)
    out = GRAMMAR.constrain(logits, np.arange(GRAMMAR.stream_len))
    for k in range(GRAMMAR.stream_len):
        if k % (GRID + 1) == GRID:
            assert out[k, CODES] == 0 and (out[k, :CODES] == FORCED_LOGIT).all()
        else:
            assert out[k, CODES] == FORCED_LOGIT and np.array_equal(out[k, :CODES], logits[k, :CODES])
