"""The runtime's sampling distribution (head + guidance matrix + host restriction) against an
independent float64 computation from raw logits (tests/runtime/_toy_exact.reference_row).

The chi-square tests compare sampled sequences with the same reference, so a formula error in
CFG, temperature, top-k or top-p would show there too; this checks the rows directly, over many
random logits, so it says which formula is wrong.
"""
from __future__ import annotations

import numpy as np
import pytest

from _toy_exact import one_torch_thread, reference_row  # noqa: F401 (autouse fixture)
from specrt.runtime.backends.toy import head_rows
from specrt.runtime.sampling import SamplingParams, guidance_mix, needs_restriction, restrict

SETTINGS = [
    SamplingParams(cfg_scale=1.0),
    SamplingParams(cfg_scale=4.0, temperature=1.0),
    SamplingParams(cfg_scale=1.75, temperature=0.7),
    SamplingParams(cfg_scale=1.0, temperature=1.3, top_k=3),
    SamplingParams(cfg_scale=2.0, temperature=0.9, top_p=0.6),
    SamplingParams(cfg_scale=2.0, temperature=0.8, top_k=4, top_p=0.7),  # top-p over the top-k renormalised
    SamplingParams(cfg_scale=3.0, temperature=0.0),
]


@pytest.mark.parametrize("sampling", SETTINGS, ids=lambda s: f"cfg{s.cfg_scale}-T{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_runtime_rows_equal_the_reference(sampling):
    rng = np.random.default_rng(0)
    vocab, rows = 9, 200
    cond, uncond = rng.normal(scale=2.0, size=(2, rows, vocab))
    logits = np.stack([cond, uncond], axis=1) if sampling.uses_cfg else cond[:, None]
    for r in range(rows):
        probs = head_rows(logits[r][:, None], guidance_mix(1, sampling), np.zeros((1, 1))).probs
        row = restrict(probs, sampling)[0, 0] if needs_restriction(sampling) else probs[0, 0]
        expected = reference_row(cond[r], uncond[r] if sampling.uses_cfg else None, sampling)
        np.testing.assert_allclose(row, expected, atol=2e-6, err_msg=f"row {r}")
