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


@pytest.mark.parametrize("sampling", SETTINGS[3:], ids=lambda s: f"k{s.top_k}-p{s.top_p}-T{s.temperature}")
def test_device_rows_are_restricted_to_the_host_rows_numbers(sampling):
    """`restrict` on torch tensors (the PyTorch backend's rows where they live) gives the host's
    numbers bit for bit, ties included: top-k keeps every entry equal to the k-th largest, top-p
    sorts stably (equal entries in index order) and keeps the entry that crosses the mass."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    rows = rng.dirichlet(np.full(9, 0.5), size=(50, 3)).astype(np.float32)
    rows[:10, :, :4] = rows[:10, :, :1]  # ties: four equal entries in some rows
    host = restrict(rows, sampling)
    device = restrict(torch.from_numpy(rows.copy()), sampling).numpy()
    np.testing.assert_array_equal(device, host)
    assert (host > 0).sum(axis=-1).min() >= 1  # a token always survives


def test_top_p_keeps_equal_entries_in_index_order_on_host_and_device_rows():
    """Four equal entries and top-p 0.6: the nucleus is the first three by index, on both."""
    torch = pytest.importorskip("torch")
    row = np.array([[0.1, 0.225, 0.225, 0.1, 0.225, 0.225]], dtype=np.float32)
    sampling = SamplingParams(top_p=0.6)
    expected = np.array([[0.0, 1 / 3, 1 / 3, 0.0, 1 / 3, 0.0]])
    np.testing.assert_allclose(restrict(row, sampling), expected, rtol=1e-6)
    np.testing.assert_array_equal(restrict(torch.from_numpy(row.copy()), sampling).numpy(), restrict(row, sampling))
