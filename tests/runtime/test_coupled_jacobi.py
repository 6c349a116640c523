"""Coupled Jacobi drafts (the `coupling` of sjd and sjd-pac): exact in every mode, on both loops.

Exactness is the chi-square of 2,000–4,000 images against the target's exact sequence distribution (vocabulary
3, 2x2 grid: 81 sequences) under the 1 − 1e-4 quantile for the cells they fill: on the host loop with the
toy backend (test_losslessness.run), on the device round with a tiny real GPT (test_rounds). The same
check at the same sample size flags each coupling's planted bug: maximal coupling recording the old
row as a kept draft's q (the authors' scripts do; a kept token is a draw from the new row), and Gumbel
noise shared by every position of an image (a later position's draft then depends on the noise that
decided the positions tested before it). Both loops give the same tokens for a seed (test_loops_agree).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from round_runs import run_to_end  # noqa: E402
from test_losslessness import run as host_chi2  # noqa: E402
from test_rounds import PLAIN, chi2_of, pipeline, tiny_models  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)
from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.counter_random import image_key  # noqa: E402
from specrt.runtime.decoding import Decoding  # noqa: E402
from specrt.runtime.methods import jacobi, make_method  # noqa: E402
from specrt.runtime.methods.jacobi import JacobiDecoding  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402
from specrt.runtime.rounds import jacobi as jacobi_round, plan_round  # noqa: E402
from specrt.runtime.rounds.jacobi import JacobiRound  # noqa: E402
from specrt.runtime.sampling import SamplingParams, guidance_mix  # noqa: E402
from specrt.runtime.verification import coupling  # noqa: E402

# images a check decodes: maximal coupling's planted bug needs 4,000 to show, Gumbel's shows at 2,000 by far
MAXIMAL, GUMBEL = 4_000, 2_000
# the tiny GPT's rows under strong guidance are far apart from one context to the next, so what a kept
# draft's recorded row says matters (keeping the old row: chi2 ~75 against a critical ~48; the real ~34)
STRONG = SamplingParams(cfg_scale=4.0, temperature=1.0)
SPINE = {"branching": 2, "tree_depth": 2}
# (method, params, the round's sampling, images)
EXACT = [("sjd", {"window": 3, "coupling": "maximal"}, STRONG, MAXIMAL),
         ("sjd", {"window": 3, "coupling": "gumbel"}, PLAIN, GUMBEL),
         ("sjd-pac", {"window": 6, **SPINE, "coupling": "gumbel"}, PLAIN, GUMBEL)]
IDS = [f"{m}-{p['coupling']}" for m, p, _, _ in EXACT]


@pytest.mark.parametrize("method,params,sampling,samples", EXACT, ids=IDS)
def test_the_host_loops_coupled_drafts_are_exact(method, params, sampling, samples):
    statistic, critical = host_chi2(method, PLAIN, samples=samples, **params)
    assert statistic < critical, f"host {method} {params}: chi2 {statistic:.1f} >= {critical:.1f}"


@pytest.mark.parametrize("method,params,sampling,samples", EXACT, ids=IDS)
def test_the_rounds_coupled_drafts_are_exact(method, params, sampling, samples):
    if method == "sjd-pac":
        params = {**params, "window": 4}  # the round's 2x2 grid leaves at most 2 drafts to verify
    statistic, critical = chi2_of(pipeline(sampling), method, sampling, samples, **params)
    assert statistic < critical, f"round {method} {params}: chi2 {statistic:.1f} >= {critical:.1f}"


class KeepingTheOldRow(JacobiDecoding):
    """Broken on purpose: maximal coupling records the old row as the q of a kept draft."""

    def _next_levels(self, ctx, levels, p_rows, draws, route, accepted, rejected):
        new = super()._next_levels(ctx, levels, p_rows, draws, route, accepted, rejected)
        for j, level in enumerate(new):
            old = accepted + 1 + j
            # a re-tested draft that comes out as itself was kept: the residual has no mass there
            if old < len(levels) and level.candidates[0] == levels[old].candidates[0]:
                level.q = levels[old].q
        return new


def round_keeping_the_old_row(monkeypatch) -> None:
    """KeepingTheOldRow in the round."""
    next_window = JacobiRound._next_window

    def keeping(self, state, p_rows, n, accepted, steps):
        drafts, proposal = next_window(self, state, p_rows, n, accepted, steps)
        old_slot = accepted[:, None] + 1 + steps
        old = old_slot.clamp(max=self.width - 1)
        image = torch.arange(n.shape[0])[:, None]
        kept = (old_slot < self.width) & (drafts == self.drafts[image, old])
        return drafts, torch.where(kept[:, :, None], self.proposal[image, old], proposal)

    monkeypatch.setattr(JacobiRound, "_next_window", keeping)


def noise_shared_by_positions(monkeypatch) -> None:
    """Broken on purpose: one Gumbel noise for every position of an image, in both loops."""
    def shared(key, index, tokens):
        return coupling.position_noise(key, index * 0, tokens)

    def shared_on_the_host(key, index, rows):
        return coupling.host_gumbel_drafts(key, np.asarray(index) * 0, rows)

    monkeypatch.setattr(jacobi, "host_gumbel_drafts", shared_on_the_host)
    monkeypatch.setattr(jacobi_round, "position_noise", shared)


def test_the_host_loop_check_flags_broken_couplings(monkeypatch):
    statistic, critical = host_chi2(KeepingTheOldRow(window=3, coupling="maximal"), PLAIN, samples=MAXIMAL)
    assert statistic > critical, f"maximal keeping the old row passed: chi2 {statistic:.1f} < {critical:.1f}"
    noise_shared_by_positions(monkeypatch)
    statistic, critical = host_chi2("sjd", PLAIN, samples=GUMBEL, window=3, coupling="gumbel")
    assert statistic > critical, f"gumbel noise shared by positions passed: chi2 {statistic:.1f} < {critical:.1f}"


def test_the_round_check_flags_broken_couplings(monkeypatch):
    with monkeypatch.context() as patch:
        round_keeping_the_old_row(patch)
        statistic, critical = chi2_of(pipeline(STRONG), "sjd", STRONG, MAXIMAL, window=3, coupling="maximal")
    assert statistic > critical, f"maximal keeping the old row passed: chi2 {statistic:.1f} < {critical:.1f}"
    noise_shared_by_positions(monkeypatch)
    statistic, critical = chi2_of(pipeline(PLAIN), "sjd", PLAIN, GUMBEL, window=3, coupling="gumbel")
    assert statistic > critical, f"gumbel noise shared by positions passed: chi2 {statistic:.1f} < {critical:.1f}"


def test_a_gumbel_round_traces_whole_under_fullgraph_compile():
    """The noise is hashed from the state's seeds and indices on the device: nothing asks the host, so
    torch.compile(fullgraph=True) traces the round whole, and the compiled round gives the eager tokens.
    (sjd-pac's round draws its drafts with the same next_drafts and FreshDrafts: left out for time.)"""
    target, draft, vq = tiny_models(vocab=16, grid=4, classes=10)
    pipe = Pipeline.from_torch(target, draft, vq, max_window=16)
    rows = Decoding(pipe.target, None, PLAIN, [], None).condition_rows(pipe.conditions([3, 6]))
    method_ = make_method("sjd", coupling="gumbel", window=6)
    tokens = []
    for compiled in (False, True):
        round_ = plan_round(method_, pipe.target, pipe.draft, PLAIN, guidance_mix(2, PLAIN), None)
        with torch.inference_mode():
            state = round_.start(rows, [5, 6], pipe.target.spec.num_image_tokens)
            run_to_end(round_, state, compiled, pipe.target.spec.num_image_tokens)
            tokens.append(state.tokens[:, :16].clone())
    torch.testing.assert_close(tokens[1], tokens[0], rtol=0, atol=0)


def test_the_coupling_parameter_and_its_older_name():
    """sjd is independent by default and sjd-pac maximal (its adaptive continuation); adaptive_continuation
    stays the older name of maximal (true) and independent (false); both at once, or an unknown coupling,
    is one clear error."""
    assert make_method("sjd").coupling == "independent" and make_method("sjd-pac").coupling == "maximal"
    assert make_method("sjd", adaptive_continuation=True).coupling == "maximal"
    pac = make_method("sjd-pac", adaptive_continuation="false")
    assert (pac.coupling, pac.adaptive_continuation) == ("independent", False)
    gumbel = make_method("sjd-pac", coupling="gumbel")
    assert (gumbel.coupling, gumbel.adaptive_continuation) == ("gumbel", False)
    with pytest.raises(SpecrtError, match="not both"):
        make_method("sjd", coupling="gumbel", adaptive_continuation=True)
    with pytest.raises(SpecrtError, match="coupling"):
        make_method("sjd", coupling="copula")


def test_an_unchanged_row_redrafts_the_same_token_under_gumbel_coupling():
    """The point of the coupling: a position's noise is the same in every round, so the same row gives
    the same draft, and a nearby row mostly does; independent draws agree far less often."""
    vocab, positions = 64, np.arange(2_000)
    rng = np.random.default_rng(0)
    old = rng.dirichlet(np.full(vocab, 0.3), size=len(positions))
    new = 0.9 * old + 0.1 * rng.dirichlet(np.full(vocab, 0.3), size=len(positions))  # TV ≤ 0.1
    noise = coupling.position_noise(image_key(3, 0), positions, np.arange(vocab))
    again = coupling.position_noise(image_key(3, 0), positions, np.arange(vocab))
    np.testing.assert_array_equal(coupling.gumbel_drafts(old, noise), coupling.gumbel_drafts(old, again))
    same = np.mean(coupling.gumbel_drafts(old, noise) == coupling.gumbel_drafts(new, noise))
    other = np.mean(coupling.gumbel_drafts(old, noise) ==
                    coupling.gumbel_drafts(new, coupling.position_noise(image_key(4, 0), positions, np.arange(vocab))))
    # (1 − TV)/(1 + TV) ≥ 0.82 with TV ≤ 0.1; independent draws agree with Σ p·p' (~0.15 for these rows)
    assert same > 0.82 - 3 * np.sqrt(0.25 / len(positions)) and other < 0.3, (same, other)


def test_the_host_hashes_noise_only_where_a_row_has_mass_and_draws_the_same():
    """host_gumbel_drafts skips the hashes of zero-mass entries (top-k rows): the dense formula's draws."""
    rng = np.random.default_rng(1)
    vocab, positions = 300, np.arange(40, 52)
    rows = rng.random((len(positions), vocab))
    rows[rows < 0.9] = 0.0  # about 30 of 300 entries kept, as a top-k row
    rows /= rows.sum(axis=-1, keepdims=True)
    key = image_key(7, 0)
    dense = coupling.gumbel_drafts(rows, coupling.position_noise(key, positions, np.arange(vocab)))
    np.testing.assert_array_equal(coupling.host_gumbel_drafts(key, positions, rows), dense)
    assert all(rows[i, token] > 0 for i, token in enumerate(dense))
    full = rng.dirichlet(np.ones(vocab))  # one full row: the dense path
    assert coupling.host_gumbel_drafts(key, 9, full) == coupling.gumbel_drafts(
        full, coupling.position_noise(key, np.asarray(9), np.arange(vocab)))
