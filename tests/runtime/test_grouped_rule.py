"""GSD's grouped acceptance rule (runtime/verification/grouped.py) against its definition.

The cluster is checked against a plain-Python reference (sort by p, take ranks ±G/2, filter by the
probability gap and the embedding distance) on random rows with ties and zeros, on numpy and torch;
the limits that make it plain SD's test (G < 2, δ = 0, d = 0); the mediant bound that says when
grouping raises acceptance (and a row where it lowers it: not a bug, the documented behaviour); the
resampling; and the one-step output law through the real chain verifier, where a chi-square test
tells GSD's law from the target's (and G = 0's law matches the target's).
"""
from __future__ import annotations

import numpy as np
import pytest

from _toy_exact import chi_square
from specrt.runtime.verification.chains import verify_chain_block, verify_chains
from specrt.runtime.verification.formulas import acceptance, residual
from specrt.runtime.verification.grouped import GroupedRule

VOCAB, DIM = 24, 5


def random_case(rng: np.random.Generator, ties: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """A target row p and a proposal row q; with `ties`, p holds repeated values and zeros (top-k)."""
    p = rng.dirichlet(np.full(VOCAB, 0.5))
    q = rng.dirichlet(np.full(VOCAB, 0.5))
    if ties:
        p[rng.choice(VOCAB, 6, replace=False)] = 0.0
        p[3] = p[7] = p[11]
        p /= p.sum()
    return p, q


def reference_cluster(p: np.ndarray, token: int, embeddings: np.ndarray, group: int, gap: float,
                      radius: float) -> list[int]:
    """C(x) from its definition, in Python: ranks by (−p, token id), ±group // 2 around x, then the filters."""
    order = sorted(range(len(p)), key=lambda v: (-p[v], v))
    rank, half = order.index(token), group // 2
    candidates = order[max(rank - half, 0): rank + half + 1]
    return [v for v in candidates if abs(p[v] - p[token]) <= gap
            and float(((embeddings[v].astype(np.float64) - embeddings[token]) ** 2).sum()) <= radius]


@pytest.fixture(scope="module")
def embeddings() -> np.ndarray:
    return np.random.default_rng(3).normal(size=(VOCAB, DIM)).astype(np.float32)


@pytest.mark.parametrize("group,gap,radius", [(14, 0.15, 6.0), (4, 1.0, 1e9), (30, 0.05, 12.0), (7, 0.3, 3.0)])
def test_the_cluster_is_its_definition_on_numpy_and_torch(embeddings, group, gap, radius):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(group)
    rule = GroupedRule(embeddings, group=group, gap=gap, radius=radius)
    for _ in range(20):
        p, q = random_case(rng)
        f = rule.acceptance_row(p, q, 1)
        on_torch = rule.acceptance_row(torch.tensor(p), torch.tensor(q), 1).numpy()
        for token in range(VOCAB):
            cluster = reference_cluster(p, token, embeddings, group, gap, radius)
            assert token in cluster
            assert f[token] == pytest.approx(acceptance(p[cluster].sum(), q[cluster].sum()), abs=1e-12)
        np.testing.assert_allclose(on_torch, f, rtol=0, atol=1e-12)
        # a block of rows with one token each (the chain verifiers' form) gives the same numbers
        tokens = rng.integers(0, VOCAB, size=3)
        block = rule.accept_rows(np.stack([p] * 3), np.stack([q] * 3), tokens, np.arange(1, 4))
        np.testing.assert_allclose(block, f[tokens], rtol=0, atol=1e-15)


@pytest.mark.parametrize("limit", [{"group": 0}, {"group": 1}, {"gap": 0.0}, {"radius": 0.0}])
def test_a_cluster_of_the_token_alone_is_plain_sds_test(embeddings, limit):
    rule = GroupedRule(embeddings, **{"group": 14, "gap": 0.5, "radius": 1e9, **limit})
    rng = np.random.default_rng(5)
    for _ in range(20):
        p, q = random_case(rng, ties=False)  # distinct probabilities and embeddings: nothing else qualifies
        np.testing.assert_array_equal(rule.acceptance_row(p, q, 1), acceptance(p, q))


def test_grouping_raises_acceptance_exactly_where_the_mediant_says(embeddings):
    """Σp/Σq over C(x) lies between the members' own ratios (a mediant): at least SD's min(1, p(x)/q(x))
    when every other member has p/q ≥ p(x)/q(x). Not token by token in general: a neighbour the
    proposal over-weights lowers x's odds (such rows are common; one is asserted to exist)."""
    rule = GroupedRule(embeddings, group=10, gap=0.3, radius=1e9)
    rng = np.random.default_rng(9)
    covered = lowered = 0
    for _ in range(200):
        p, q = random_case(rng, ties=False)
        f, sd = rule.acceptance_row(p, q, 1), acceptance(p, q)
        for token in range(VOCAB):
            cluster = reference_cluster(p, token, embeddings, 10, 0.3, 1e9)
            ratios = p[cluster] / q[cluster]
            assert min(1.0, ratios.min()) - 1e-12 <= f[token] <= min(1.0, ratios.max()) + 1e-12
            if (ratios >= p[token] / q[token]).all():
                covered += len(cluster) > 1
                assert f[token] >= sd[token] - 1e-12
            lowered += f[token] < sd[token] - 1e-9
    assert covered > 50 and lowered > 0


def test_a_rejection_resamples_the_residual(embeddings):
    rule = GroupedRule(embeddings, group=14, gap=0.15, radius=6.0)
    p, q = random_case(np.random.default_rng(2))
    np.testing.assert_array_equal(rule.resample(p, q, 4, 1), residual(p, q))


def output_law(rule: GroupedRule, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """One verified draft's token law: x ~ q kept with f(x), else a draw from Norm([p − q]_+)."""
    f = rule.acceptance_row(p, q, 1)
    return q * f + (1.0 - q @ f) * residual(p, q)


def verified_tokens(rule: GroupedRule, p: np.ndarray, q: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """`samples` single drafts x ~ q verified by verify_chains (the host loop's verifier) against p."""
    rng = np.random.default_rng(seed)
    drafts = [[int(x)] for x in rng.choice(VOCAB, size=samples, p=q)]
    p_block = np.broadcast_to(p, (samples, 2, VOCAB))
    q_block = np.broadcast_to(q, (1, samples, VOCAB))
    bonus = np.zeros((samples, 2), dtype=np.int64)  # never used: a one-draft chain is accepted or resampled
    outcomes = verify_chains(p_block, q_block, drafts, rule, rng.random((samples, 1)), rng.random(samples), bonus)
    return np.array([d[0] if kept else t for d, kept, t in zip(drafts, outcomes.accepted_lengths,
                                                                 outcomes.next_tokens)])


def test_the_relaxation_is_measurable_and_g0_is_exact(embeddings):
    """The tokens GSD keeps follow its own one-step law (chi-square passes) and not the target's (it
    rejects); with no grouping (G = 0) they follow the target's. Planted bug: a rule that resamples from
    p instead of the residual fails the check against its own law. 20,000 draws, level 1e-4."""
    rng = np.random.default_rng(17)
    p = rng.dirichlet(np.full(VOCAB, 1.0))
    q = 0.5 * p + 0.5 * rng.dirichlet(np.full(VOCAB, 1.0))
    samples = 20_000
    exact = {(v,): float(mass) for v, mass in enumerate(p)}
    grouped = GroupedRule(embeddings, group=14, gap=0.2, radius=1e9)
    law = output_law(grouped, p, q)
    assert 0.5 * np.abs(law - p).sum() > 0.05  # the relaxation itself, exactly
    tokens = verified_tokens(grouped, p, q, samples, seed=1)[:, None]
    statistic, critical = chi_square(tokens, {(v,): float(m) for v, m in enumerate(law)})
    assert statistic < critical
    statistic, critical = chi_square(tokens, exact)
    assert statistic > critical
    statistic, critical = chi_square(verified_tokens(GroupedRule(embeddings, group=0), p, q, samples, 2)[:, None],
                                     exact)
    assert statistic < critical

    class FromTarget(GroupedRule):
        def resample(self, p, q, token, position):
            return p

    broken = verified_tokens(FromTarget(embeddings, group=14, gap=0.2, radius=1e9), p, q, samples, seed=1)
    statistic, critical = chi_square(broken[:, None], {(v,): float(m) for v, m in enumerate(law)})
    assert statistic > critical


def test_the_device_verifier_makes_the_host_verifiers_decisions(embeddings):
    """verify_chain_block (the device round's, on torch) against verify_chains on the same rows and uniforms."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    images, length = 5, 4
    rule = GroupedRule(embeddings, group=8, gap=0.3, radius=8.0)
    p = rng.dirichlet(np.full(VOCAB, 0.7), size=(images, length + 1))
    q = rng.dirichlet(np.full(VOCAB, 0.7), size=(images, length))
    drafted = rng.integers(0, VOCAB, size=(images, length))
    coins, next_uniforms = rng.random((images, length)), rng.random(images)
    bonus = np.array([[int(np.searchsorted(np.cumsum(row), u, side="right")) for row in p[b]]
                      for b, u in enumerate(next_uniforms)])
    host = verify_chains(p, q.swapaxes(0, 1), drafted.tolist(), rule, coins, next_uniforms, bonus)
    accepted, next_token = verify_chain_block(torch.tensor(p), torch.tensor(q), torch.tensor(drafted),
                                              torch.full((images,), length), torch.tensor(coins),
                                              torch.tensor(next_uniforms), rule)
    assert accepted.tolist() == host.accepted_lengths
    assert next_token.tolist() == host.next_tokens
