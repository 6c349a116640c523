"""runtime.verification.positions: the device round's re-test of stale drafts against the host's."""
from __future__ import annotations

import numpy as np
import pytest

from _verification_cases import VOCAB
from specrt.runtime.verification.positions import verify_positions


def test_the_device_rounds_re_test_of_stale_drafts_is_the_host_ones():
    """retest_block (SJD-PAC's adaptive continuation in the device round) gives verify_positions'
    token at every position with the same uniforms (n tests, then n residual draws), over draws with
    rejections and acceptances and rows equal to their stale row (a residual without mass: the
    block forms every row's fallback and must keep the draft there)."""
    torch = pytest.importorskip("torch")
    from specrt.runtime.verification.positions import retest_block

    kept = resampled = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        count = 1 + seed % 7
        p_rows = rng.dirichlet(np.full(VOCAB, 0.3), size=count).astype(np.float32)
        q_rows = [rng.dirichlet(np.full(VOCAB, 0.3)).astype(np.float32) for _ in range(count)]
        if seed % 5 == 0:  # a stale row equal to its new one: an empty residual (its draft is kept)
            q_rows[0] = p_rows[0].copy()
        tokens = [int(rng.choice(VOCAB, p=q.astype(np.float64) / q.astype(np.float64).sum())) for q in q_rows]
        uniforms = np.random.default_rng(seed + 99).random(2 * count)
        host = verify_positions(p_rows, q_rows, tokens, uniforms[:count], uniforms[count:])
        device = retest_block(torch.from_numpy(p_rows), torch.from_numpy(np.stack(q_rows)),
                              torch.tensor(tokens), torch.from_numpy(uniforms[:count]),
                              torch.from_numpy(uniforms[count:])).tolist()
        assert device == host, seed
        if seed % 5 == 0:
            assert device[0] == tokens[0], seed
        kept += sum(a == b for a, b in zip(host, tokens))
        resampled += sum(a != b for a, b in zip(host, tokens))
    assert kept and resampled
