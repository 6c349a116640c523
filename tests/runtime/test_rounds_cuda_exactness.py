"""The device round's exactness on a CUDA GPU: chi-square against the exact distribution, KS for cspd.

Why on the GPU too: the round draws the host loop's counter uniforms, but the rows they are compared
with come from the GPU's float arithmetic, so a uniform at a CDF boundary may pick another token there
than on the CPU (tests/runtime/test_loops_agree.py: the loops agree up to such ties). A tie may flip a
token; it must not bias the distribution. So the CPU's checks (tests/runtime/test_rounds.py and
tests/runtime/test_rounds_continuous.py: the same tiny models, exact reference, statistics and planted
bugs) run here on CUDA with N = 20,480 images, 2,048 a pass (ten full passes: one round, captured once,
a setting). Each setting beside its planted bug, a known-wrong rule that must fail the same check.
Critical values from N: chi-square at alpha = 1e-4 over the sequences expecting at least 5 images (the
rest pooled, tests/runtime/_toy_exact.py); KS at family-wise alpha = 1e-3, its critical value scaled
by sqrt((n + m)/(n·m)), beside a permutation MMD (tests/runtime/_continuous_exact.py), against the CPU
host loop's ar (the reference, on the device that has no GPU float ties).

CUDA-only: on a CPU the same settings, planted bugs included, run in those two files at the CPU's
sample sizes. Skipped, saying so, without a CUDA GPU (bench/device-run.sh tests runs this file on the
GPU machine, printing each statistic beside its critical value).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import pytest

torch = pytest.importorskip("torch")

from _continuous_exact import same_distribution  # noqa: E402
from test_losslessness import BrokenSD  # noqa: E402  (SD resampling from P)
from test_rounds import (GUIDED, PLAIN, chi2_of, draw_siblings_off_their_row,  # noqa: E402
                         forget_the_proposal_rows, pipeline)
from test_rounds_continuous import SINGLE, SkippedRejection, tokens_of  # noqa: E402
from test_rounds_continuous import pipeline as mar_pipeline  # noqa: E402
from specrt.runtime.families.continuous import rounds as continuous_rounds  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)")]

SAMPLES, PASS = 20_480, 2_048
CONTINUOUS_SAMPLES = 20_000  # a side: the round's cspd and the CPU host loop's ar


# a planted bug: given the test's monkeypatch and the setting's parameters, the method to decode with
# (a broken one), or None after patching the round itself
Planted = Callable[[Any, dict], Optional[Any]]


def broken_residual(monkeypatch: Any, params: dict) -> Any:
    return BrokenSD(**params)


def forgotten_proposal(monkeypatch: Any, params: dict) -> None:
    forget_the_proposal_rows(monkeypatch)


def siblings_off_their_row(monkeypatch: Any, params: dict) -> None:
    draw_siblings_off_their_row(monkeypatch)


# (id, method, parameters, sampling, planted bug): sd's chain, static and dynamic trees, sjd, sjd-pac's
# chain windows and its proactive spine trees
SETTINGS = [("sd", "sd", {"draft_len": 3}, GUIDED, broken_residual),
            ("sd-static", "sd", {"tree": "static"}, PLAIN, broken_residual),
            ("sd-dynamic", "sd", {"tree": "dynamic", "total_tokens": 6, "depth": 3, "tree_top_k": 2}, GUIDED,
             broken_residual),
            ("sjd", "sjd", {"window": 3}, PLAIN, forgotten_proposal),
            ("sjd-pac-chain", "sjd-pac", {"window": 3, "proactive_drafting": False}, GUIDED, forgotten_proposal),
            ("sjd-pac", "sjd-pac", {"window": 4, "branching": 2, "tree_depth": 2}, PLAIN, siblings_off_their_row)]


def chi2_on(device: str, method: str, params: dict, sampling: Any, planted: Optional[Planted], monkeypatch: Any,
            samples: int = SAMPLES, per_pass: int = PASS) -> tuple[float, float]:
    """(chi-square, critical value) of `samples` images of the setting's round on `device`, with its
    planted bug where `planted`."""
    decoder = (planted(monkeypatch, params) if planted else None) or method
    pipe = pipeline(sampling, device=device, max_images=per_pass)
    return chi2_of(pipe, decoder, sampling, samples, **({} if decoder is not method else params))


@pytest.mark.parametrize("planted", [False, True], ids=["exact", "planted-bug"])
@pytest.mark.parametrize("name,method,params,sampling,bug", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_the_round_on_cuda_samples_the_exact_distribution_and_its_planted_bug_does_not(
        monkeypatch, name, method, params, sampling, bug, planted):
    statistic, critical = chi2_on("cuda", method, params, sampling, bug if planted else None, monkeypatch)
    print(f"{name}{' (planted bug)' if planted else ''}: chi2 {statistic:.1f}, critical {critical:.1f}", end=" ")
    if planted:
        assert statistic > critical, f"{name}'s planted bug passed: chi2 {statistic:.1f} <= {critical:.1f}"
    else:
        assert statistic < critical, f"{name}: chi2 {statistic:.1f} >= {critical:.1f}"


def cspd_against_the_cpu_host_loop(device: str, planted: bool, monkeypatch: Any,
                                   samples: int = CONTINUOUS_SAMPLES) -> tuple[bool, str, Any]:
    """(same distribution?, the statistics' line, the round's stats): cspd's round on `device` (its
    residual step alone, tests/runtime/test_rounds_continuous.py SINGLE) against the CPU host loop's ar."""
    reference, _ = tokens_of(mar_pipeline(0.5, **SINGLE), "ar", samples, seed=1, loop="host")
    if planted:
        monkeypatch.setattr(continuous_rounds, "CSpDRound", SkippedRejection)
    tokens, stats = tokens_of(mar_pipeline(0.5, device=device, **SINGLE), "cspd", samples, seed=2, loop="round",
                              draft_len=1, prefill_ratio=0.0)
    ok, line = same_distribution(tokens, reference)
    return ok, line, stats


@pytest.mark.parametrize("planted", [False, True], ids=["cspd", "residual-skips-rejection"])
def test_cspds_round_on_cuda_matches_the_cpu_host_loop_and_its_planted_bug_does_not(monkeypatch, planted):
    ok, line, stats = cspd_against_the_cpu_host_loop("cuda", planted, monkeypatch)
    print(f"cspd{' (planted bug)' if planted else ''}: {line}", end=" ")
    assert 0.15 < stats.acceptance_rate < 0.85, "the pair must both accept and reject for the test to mean much"
    assert ok != planted, line
