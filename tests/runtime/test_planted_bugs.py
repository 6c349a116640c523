"""Deliberately broken variants of the subtle parts of SJD-PAC, Cool-SD and tree drafting, which the
exactness checks must flag (a chi-square against an independent enumeration, tests/runtime/_toy_exact.py;
_tree_exact.py for tree drafting's rounds, relaxed ones included).

Each variant is the real method with one piece swapped (monkeypatched function or subclass), run
through the public Pipeline.generate on the toy family, in a setting where the real method passes
the same check with the same number of images. The SJD-PAC variants use 4,000 images, fewer than
test_losslessness's 20,000: a check that flags a variant with fewer samples flags it with more.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from _toy_exact import chi_square, exact_distribution, next_token_row, one_torch_thread  # noqa: F401 (autouse fixture)
from _tree_exact import exp_weights, tree_distribution
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.methods import jacobi
from specrt.runtime.methods.jacobi import SJDPAC
from specrt.runtime.methods.speculative import CoolSD
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.counter_random import CANDIDATE
from specrt.runtime.sampling import SamplingParams, draw_from_cdf
from specrt.runtime.tree import STATIC_TREES
from specrt.runtime.verification import trees as tree_verification
from specrt.runtime.verification.formulas import normalise, residual
from specrt.runtime.verification.positions import verify_positions
from specrt.runtime.verification.rules import CoolRule
from specrt.runtime.verification.siblings import (
    SAMPLED, candidate_proposals, draw_without_replacement, without_replacement,
)

SJD_SAMPLES, COOL_SAMPLES = 4_000, 10_000
CLASS_ID, GRID = 1, 2
PLAIN = SamplingParams(cfg_scale=1.0)
# 4 tokens over a vocabulary of 4 with sharp rows (scale 3): the stale rows SJD-PAC drafts from
# are far from the new ones, so proactive trees are frequent and each swapped piece shows
SJD_TOY = {"vocab_size": 4, "seed": 4, "scale": 3.0}
COOL_TOY = {"vocab_size": 3, "seed": 4}


def chi2(method, samples: int, toy: dict, **params) -> tuple[float, float]:
    """Chi-square of `samples` images of `method` (a name or a Method instance) against the exact
    distribution it must reproduce: the target's for SJD-PAC, Cool-SD's own (COOL) for cool-sd."""
    target, draft, vq = toy_models(grid_size=GRID, num_classes=2, **toy)
    pipe = Pipeline(target, vq, draft, sampling_defaults=vars(PLAIN), max_images=256)  # batched sample runs
    tokens = pipe.generate([CLASS_ID] * samples, method=method, seed=11, **params).tokens
    name = method if isinstance(method, str) else method.name
    exact = cool_sd_distribution(target.lm, draft.lm, toy["vocab_size"], **COOL) if name == "cool-sd" \
        else exact_distribution(target.lm, CLASS_ID, 2, toy["vocab_size"], GRID * GRID, PLAIN)
    return chi_square(tokens, exact)


# ---- SJD-PAC -----------------------------------------------------------------------------------

def sample(row, uniform):
    """A draw from `row` (unnormalised) with `uniform`."""
    return draw_from_cdf(np.cumsum(np.asarray(row, dtype=np.float64)), uniform)


def siblings_without_q_adjustment(p, q, candidates, coins, next_uniform):
    """Broken: every sibling is tested against q itself, not q^(k) (the drawn ones removed)."""
    target = p
    for k, token in enumerate(candidates):
        if coins[k] * q[token] <= target[token]:
            return k, int(token)
        target = residual(target, q)
    return None, sample(target, next_uniform)


def siblings_without_residual_update(p, q, candidates, coins, next_uniform):
    """Broken: p^(k) stays p for every sibling instead of Norm([p^(k−1) − q^(k−1)]_+)."""
    for k, token in enumerate(candidates):
        draft = without_replacement(q, candidates[:k])
        if coins[k] * draft[token] <= p[token]:
            return k, int(token)
    return None, sample(residual(p, without_replacement(q, candidates)), next_uniform)


def continuation_against_new_rows(p_block, q_rows, tokens, coins, draw_uniforms):
    """Broken: adaptive continuation tests each stale draft against the new row as its q."""
    return verify_positions(p_block, [np.asarray(row) for row in np.asarray(p_block)], tokens, coins, draw_uniforms)


class ContinuationTokenLast(SJDPAC):
    """Broken: the adaptive-continuation token joins the siblings last instead of first."""

    def _proactive(self, new, ctx, rejected, offset):
        if self.proactive_drafting and rejected:
            for depth, level in enumerate(new[: self.tree_depth]):
                kept = level.candidates[0]
                uniforms = [ctx.key.uniform(offset + depth, CANDIDATE, k) for k in range(self.branching)]
                fresh = [c for c in draw_without_replacement(level.q, self.branching, uniforms) if c != kept]
                level.candidates = fresh[: self.branching - 1] + [kept]
        return new


SJD_PAC_TREE = {"window": 8, "branching": 3, "tree_depth": 2}


@pytest.mark.parametrize("params", [SJD_PAC_TREE, {"window": 8, "branching": 2, "tree_depth": 2, "tree": "full"}],
                         ids=["spine", "full-tree"])
def test_sjd_pac_is_exact_in_the_planted_bug_setting(params):
    """The setting the broken variants below are run in: the real SJD-PAC passes there."""
    statistic, critical = chi2("sjd-pac", SJD_SAMPLES, SJD_TOY, **params)
    assert statistic < critical, f"sjd-pac {params}: chi2 {statistic:.1f} >= {critical:.1f}"


def test_full_tree_must_fit_the_window_and_window_counts_drafts():
    from specrt.errors import SpecrtError
    from specrt.runtime.methods import DEFAULT_MAX_WINDOW, make_method

    with pytest.raises(SpecrtError, match="more than window"):
        make_method("sjd-pac", tree="full")  # the paper's K = 4, D = 3: 84 nodes > L = 64
    assert make_method("sjd-pac", tree="full", branching=2, tree_depth=3, window=14).max_window == 15
    assert make_method("sjd-pac").max_window == DEFAULT_MAX_WINDOW == 65  # L = 64 drafts + the pending token


@pytest.mark.parametrize("patch,method", [
    (("verify_siblings", siblings_without_q_adjustment), "sjd-pac"),
    (("verify_siblings", siblings_without_residual_update), "sjd-pac"),
    (("verify_positions", continuation_against_new_rows), "sjd-pac"),
    (None, ContinuationTokenLast(**SJD_PAC_TREE)),
], ids=["no-q^(k)-adjustment", "p^(k)-not-updated", "continuation-against-new-q", "continuation-token-not-first"])
def test_broken_sjd_pac_variants_are_flagged(monkeypatch, patch, method):
    if patch:
        monkeypatch.setattr(jacobi, *patch)
    params = SJD_PAC_TREE if isinstance(method, str) else {}
    statistic, critical = chi2(method, SJD_SAMPLES, SJD_TOY, **params)
    assert statistic > critical, f"broken variant passed: chi2 {statistic:.1f} < {critical:.1f}"


# ---- Cool-SD: the exact distribution of the relaxed pipeline, enumerated independently ----------

COOL = {"draft_len": 2, "relaxation_budget": 1.5, "schedule": "exp", "decay": 0.7}


def cool_sd_distribution(target_lm, draft_lm, vocab: int, draft_len: int, relaxation_budget: float, schedule: str,
                         decay: float) -> dict[tuple[int, ...], float]:
    """P(x_1..x_N) of Cool-SD's output (Alg. 1 with G*), by enumerating every round from the
    reference rows in float64: written from the paper's formulas, sharing only g_star's name."""
    assert schedule == "exp"
    i = np.arange(1, draft_len + 1)
    omega = relaxation_budget * draft_len * np.exp(-decay * i) / np.exp(-decay * i).sum()  # Eq. 16
    length = GRID * GRID
    P = lambda prefix: next_token_row(target_lm, CLASS_ID, 2, tuple(prefix), PLAIN)  # noqa: E731
    Q = lambda prefix: next_token_row(draft_lm, CLASS_ID, 2, tuple(prefix), PLAIN)  # noqa: E731
    out: dict[tuple[int, ...], float] = {}

    def rounds(prefix: tuple[int, ...], weight: float) -> None:
        if len(prefix) == length:
            out[prefix] = out.get(prefix, 0.0) + weight
            return
        drafts = min(draft_len, length - len(prefix) - 1)
        for path in itertools.chain.from_iterable(itertools.product(range(vocab), repeat=n) for n in range(drafts + 1)):
            accepted = 1.0  # Π Q(x_i) f_i(x_i) over the accepted drafts
            for k, token in enumerate(path):
                p, q = P(prefix + path[:k]), Q(prefix + path[:k])
                accepted *= q[token] * min(1.0, omega[k] * p[token] / q[token])
            context = prefix + path
            p = P(context)
            if len(path) == drafts:  # every draft accepted: the bonus token from P
                nxt = p
            else:  # rejection at position len(path) + 1: G* = Norm([P − Q·f]_+), f at every token
                q = Q(context)
                f = np.minimum(1.0, omega[len(path)] * p / q)
                accepted *= float(np.dot(q, 1.0 - f))
                mass = np.maximum(p - q * f, 0.0)
                nxt = mass / mass.sum()
            for token in range(vocab):
                if accepted * nxt[token] > 0:
                    rounds(context + (token,), weight * accepted * nxt[token])

    first = P(())
    for token in range(vocab):
        rounds((token,), first[token])
    return out


def test_cool_sd_matches_its_exact_distribution():
    target, draft, _ = toy_models(grid_size=GRID, num_classes=2, **COOL_TOY)
    assert abs(sum(cool_sd_distribution(target.lm, draft.lm, COOL_TOY["vocab_size"], **COOL).values()) - 1) < 1e-9
    statistic, critical = chi2("cool-sd", COOL_SAMPLES, COOL_TOY, **COOL)
    assert statistic < critical, f"cool-sd: chi2 {statistic:.1f} >= {critical:.1f}"


class GStarAtDraftedToken(CoolRule):
    """Broken: G = Norm([P − Q·f(x̃)]_+) with f of the rejected token only, not f at every token."""

    def resample(self, p, q, token, position):  # rows [..., V], tokens and positions [...] (verify_chains' block)
        at = lambda rows: np.take_along_axis(np.asarray(rows, dtype=np.float64),  # noqa: E731
                                             np.asarray(token)[..., None], -1)
        f = self.accept_probabilities(at(p), at(q)[..., 0], position)[..., None]  # f(x̃) of each row's x̃ only
        mass = np.subtract(p, np.asarray(q, dtype=np.float64) * f)
        return normalise(np.maximum(mass, 0.0), p)


class BrokenCoolSD(CoolSD):
    def rule(self, ctx):
        return GStarAtDraftedToken(self.weights())


def test_cool_sd_with_gstar_at_the_drafted_token_only_is_flagged():
    statistic, critical = chi2(BrokenCoolSD(**COOL), COOL_SAMPLES, COOL_TOY)
    assert statistic > critical, f"broken G* passed: chi2 {statistic:.1f} < {critical:.1f}"



# ---- tree drafting (sd): the sibling residual -----------------------------------------------------

TREE_SAMPLES = 2_000
TREE_TOY = {"vocab_size": 3, "seed": 3, "max_window": 26}  # test_losslessness's toy: sd trees pass there


def siblings_keep_the_target(p, proposals, rule, position, coins, next_uniform):
    """Broken: every sibling is tested against p itself; p is never replaced by Norm([p − q_k]_+)
    between siblings (only the final draw, after all are rejected, comes from a residual)."""
    for k, (token, q) in enumerate(proposals):
        if coins[k] <= rule.accept_probability(p, q, token, position):
            return k, int(token)
    return None, sample(rule.resample(p, q, token, position), next_uniform)


def test_tree_verification_without_the_sibling_residual_is_flagged(monkeypatch):
    """The static tree of test_losslessness (EAGLE-1's mc_sim_7b_63), with p not updated between
    siblings: far outside the chi-square quantile at 2,000 images, where the real one passes."""
    monkeypatch.setattr(tree_verification, "verify_candidates", siblings_keep_the_target)
    statistic, critical = chi2("sd", TREE_SAMPLES, TREE_TOY, tree="static")
    assert statistic > critical, f"broken sibling residual passed: chi2 {statistic:.1f} < {critical:.1f}"


real_proposals = candidate_proposals


def top_k_children_as_if_sampled(q, candidates, drawn, vocab=0):
    """Broken: a dynamic tree's top-k children are tested against q^(k), as if drawn from q; they
    are a deterministic function of q, drawn from point masses (EAGLE-2's qx = 1)."""
    return real_proposals(q, candidates, SAMPLED, vocab)


def test_dynamic_tree_children_tested_against_the_draft_row_are_flagged(monkeypatch):
    """test_losslessness's dynamic tree (unguided here), verified against q instead of point masses:
    chi2 ~640 against a critical ~51 at 500 images."""
    monkeypatch.setattr(tree_verification, "candidate_proposals", top_k_children_as_if_sampled)
    statistic, critical = chi2("sd", 500, TREE_TOY, tree="dynamic", total_tokens=6, depth=3, tree_top_k=2)
    assert statistic > critical, f"top-k children against q passed: chi2 {statistic:.1f} < {critical:.1f}"


# ---- tree drafting alone: siblings against q^(k), and Cool-SD's ω by depth ---------------------------
# Against tree_distribution (tests/runtime/_tree_exact.py), every round enumerated from the definitions.
# TREE_TOY's draft is close to its target (noise 1): a node's first child is mostly accepted, so what
# its later siblings are tested against barely shows (every sibling against q: chi2 57 against a
# critical 85 at 2,000 images, enumerated non-centrality 11). With a draft far from the target
# (noise 3) first children are mostly rejected and the siblings carry the output.

TREE_FAR_TOY = {"vocab_size": 3, "seed": 0, "draft_noise": 3.0, "max_window": 26}
TREE_COOL = {"relaxation_budget": 1.5, "schedule": "exp", "decay": 0.7}  # ω by depth 3.89, 1.93, 0.96, ...
DYNAMIC = {"total_tokens": 6, "depth": 3, "tree_top_k": 2}  # test_losslessness's dynamic tree
TREES = {"static": {"tree": "static"}, "dynamic": {"tree": "dynamic", **DYNAMIC}}


def tree_shape(tree: str) -> dict:
    """tree_distribution's description of a TREES entry (the static one is the default mc_sim_7b_63)."""
    if tree == "static":
        return {"static": STATIC_TREES["mc_sim_7b_63"]}
    return {"dynamic": {"depth": DYNAMIC["depth"], "top_k": DYNAMIC["tree_top_k"],
                        "total_tokens": DYNAMIC["total_tokens"]}}


def tree_chi2(method, tree: str, omega=None, **params) -> tuple[tuple[float, float], tuple[float, float]]:
    """TREE_SAMPLES images of `method` (a name with its `params`, or a Method) drafting `tree` on
    TREE_FAR_TOY: chi-square against tree drafting's exact distribution with ω_d = omega[d − 1] (None:
    SD, the target's P), and against the target's P."""
    target, draft, vq = toy_models(grid_size=GRID, num_classes=2, **TREE_FAR_TOY)
    pipe = Pipeline(target, vq, draft, sampling_defaults=vars(PLAIN), max_images=256)
    params = {**TREES[tree], **params} if isinstance(method, str) else params
    tokens = pipe.generate([CLASS_ID] * TREE_SAMPLES, method=method, seed=11, **params).tokens
    vocab = TREE_FAR_TOY["vocab_size"]
    exact_p = exact_distribution(target.lm, CLASS_ID, 2, vocab, GRID * GRID, PLAIN)
    exact = exact_p if omega is None else tree_distribution(target.lm, draft.lm, CLASS_ID, 2, vocab, GRID * GRID,
                                                             PLAIN, omega=omega, **tree_shape(tree))
    return chi_square(tokens, exact), chi_square(tokens, exact_p)


def test_tree_enumeration_reproduces_sd_and_separates_siblings_against_q():
    """The enumerator gives SD's P for both tree kinds (so its sibling walk is right), and every
    static sibling against q is far from P on TREE_FAR_TOY (non-centrality ~5,400 at 2,000 images)."""
    target, draft, _ = toy_models(grid_size=GRID, num_classes=2, **TREE_FAR_TOY)
    args = (target.lm, draft.lm, CLASS_ID, 2, TREE_FAR_TOY["vocab_size"], GRID * GRID, PLAIN)
    exact = exact_distribution(target.lm, CLASS_ID, 2, TREE_FAR_TOY["vocab_size"], GRID * GRID, PLAIN)
    for tree in TREES:
        enumerated = tree_distribution(*args, **tree_shape(tree))
        assert max(abs(enumerated[s] - exact[s]) for s in exact) < 1e-12, tree
    broken = tree_distribution(*args, **tree_shape("static"), siblings_against_q=True)
    noncentrality = TREE_SAMPLES * sum((broken[s] - exact[s]) ** 2 / exact[s] for s in exact)
    assert noncentrality > 1_000, f"siblings against q barely change the output here: {noncentrality:.0f}"


def test_sd_static_tree_is_exact_with_a_far_draft():
    """The setting of the planted bug below: the real static tree passes there (chi2 ~35 < ~68)."""
    (statistic, critical), _ = tree_chi2("sd", "static")
    assert statistic < critical, f"sd static tree: chi2 {statistic:.1f} >= {critical:.1f}"


def siblings_against_q(q, candidates, drawn, vocab=0):
    """Broken: every sibling of a static tree is tested against q itself, not q^(k) (q with its
    earlier siblings removed and renormalised), though it was drawn without replacement."""
    if drawn != SAMPLED:
        yield from real_proposals(q, candidates, drawn, vocab)
        return
    for token in candidates:
        yield int(token), q


def test_static_tree_siblings_tested_against_q_are_flagged(monkeypatch):
    """sd with tree=static alone (no SJD-PAC), at TREE_SAMPLES: chi2 ~5,500 against a critical ~68."""
    monkeypatch.setattr(tree_verification, "candidate_proposals", siblings_against_q)
    (statistic, critical), _ = tree_chi2("sd", "static")
    assert statistic > critical, f"siblings against q passed: chi2 {statistic:.1f} < {critical:.1f}"


def tree_weights(tree: str) -> np.ndarray:
    """ω_1..ω_L over the tree's depth (mc_sim_7b_63: 5; the dynamic tree: DYNAMIC's depth), Eq. 16."""
    depth = max(map(len, STATIC_TREES["mc_sim_7b_63"])) if tree == "static" else DYNAMIC["depth"]
    return exp_weights(depth, TREE_COOL["relaxation_budget"], TREE_COOL["decay"])


@pytest.mark.parametrize("tree", TREES)
def test_cool_sd_trees_match_their_exact_distribution(tree):
    """Cool-SD's siblings at depth d use ω_d: the pipeline matches the enumeration (chi2 ~18 < ~63
    static, ~21 < ~54 dynamic) and is far from P (chi2 in the thousands), so the check has power."""
    (statistic, critical), (from_p, critical_p) = tree_chi2("cool-sd", tree, tree_weights(tree), **TREE_COOL)
    assert statistic < critical, f"cool-sd {tree} tree: chi2 {statistic:.1f} >= {critical:.1f}"
    assert from_p > critical_p, f"cool-sd {tree} tree is not relaxed here: chi2 to P {from_p:.1f} < {critical_p:.1f}"


class DepthShiftedCoolSD(CoolSD):
    """Broken: the siblings at depth d are verified with the schedule's weight of depth d + shift
    (clamped to ω_1..ω_L), not ω_d."""

    shift = 1

    def weights(self) -> np.ndarray:
        omega = super().weights()
        return omega[np.clip(np.arange(len(omega)) + self.shift, 0, len(omega) - 1)]


class DepthShiftedDown(DepthShiftedCoolSD):
    shift = -1


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("broken", [DepthShiftedCoolSD, DepthShiftedDown], ids=["omega_d+1", "omega_d-1"])
def test_cool_sd_trees_with_a_depth_shifted_schedule_are_flagged(tree, broken):
    """Enumerated non-centralities at 2,000 images: static 2,234 (ω_{d+1}) and 492 (ω_{d−1}, ω_1 at
    depth 1), dynamic 338 and 699, against critical values ~54-63."""
    (statistic, critical), _ = tree_chi2(broken(**TREE_COOL, **TREES[tree]), tree, tree_weights(tree))
    assert statistic > critical, f"{broken.__name__} on a {tree} tree passed: chi2 {statistic:.1f} < {critical:.1f}"
