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


# ---- the host side's economies give the same numbers -------------------------------------------------


def whole_row_masses(p: np.ndarray, q: np.ndarray, tokens: np.ndarray, embeddings: np.ndarray, half: int,
                     gap: float, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """The cluster masses computed the straightforward way: both rows widened to float64, each row sorted
    whole, every candidate's embedding distance measured (the arithmetic the rule keeps, entry by entry)."""
    p, q = p.astype(np.float64), q.astype(np.float64)
    rows = np.arange(len(p))[:, None]
    order = np.argsort(-p, axis=-1, kind="stable")
    ranks = np.argsort(order, axis=-1, kind="stable")
    at = ranks[rows, tokens][..., None] + np.arange(-half, half + 1)
    inside = (at >= 0) & (at < p.shape[1])
    members = order[rows[..., None], np.clip(at, 0, p.shape[1] - 1)]
    p_members, q_members = p[rows[..., None], members], q[rows[..., None], members]
    offset = embeddings[members].astype(np.float64) - embeddings[tokens].astype(np.float64)[..., None, :]
    kept = inside & (np.abs(p_members - p[rows, tokens][..., None]) <= gap) & ((offset * offset).sum(-1) <= radius)
    return np.where(kept, p_members, 0.0).sum(-1), np.where(kept, q_members, 0.0).sum(-1)


def test_the_masses_are_bit_for_bit_the_straightforward_ones():
    """numpy's rule sorts the rows as they come (float32 or float64), widens only what it reads and
    measures distances only where the rank and probability tests passed: the same bits as the
    whole-row computation, on rows with ties, zeros and repeated embeddings, with radii on the
    distance of a pair. Control: a rule that breaks ties the other way changes some masses on these rows."""
    from specrt.runtime.verification.grouped import grouped_masses

    rng = np.random.default_rng(23)
    reversed_ties = 0
    for trial in range(150):
        vocab, count, per_row = int(rng.integers(2, 60)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
        p = rng.dirichlet(np.full(vocab, 0.4), size=count)
        if trial % 2:  # ties and zeros, as top-k and quantized rows have
            p = np.round(p * 6) / 6 + 1e-3 * (np.arange(vocab) == 0)
            p /= p.sum(-1, keepdims=True)
        q = rng.dirichlet(np.full(vocab, 0.4), size=count)
        dtype = (np.float32, np.float64)[trial % 3 == 0]
        p, q = p.astype(dtype), q.astype(dtype)
        table = rng.normal(size=(vocab, 4)).astype(np.float32)
        table[1 % vocab] = table[0]
        tokens = rng.integers(0, vocab, size=(count, per_row))
        half = int(rng.integers(0, 12))
        gap, radius = float(rng.choice([0.0, 0.1, 0.3, 1.0])), float(rng.choice([0.0, 4.0, 1e9]))
        if trial % 4 == 1:  # a radius on a pair's distance: the test's boundary, where arithmetic shows
            pair = rng.integers(0, vocab, size=2)
            radius = float(((table[pair[0]].astype(np.float64) - table[pair[1]].astype(np.float64)) ** 2).sum())
        got = grouped_masses(p, q, tokens, table, half, gap, radius)
        expected = whole_row_masses(p, q, tokens, table, half, gap, radius)
        for mass, reference in zip(got, expected):
            assert mass.dtype == np.float64
            np.testing.assert_array_equal(mass, reference)
        flipped = whole_row_masses(p[:, ::-1], q[:, ::-1], vocab - 1 - tokens, table[::-1], half, gap, radius)
        reversed_ties += not all(np.array_equal(a, b) for a, b in zip(got, flipped))
    assert reversed_ties > 10


def test_rows_after_the_first_rejection_are_never_tested(embeddings):
    """verify_chains with GSD's rule tests each image's positions a few at a time up to its first
    rejection: the outcomes are those of testing every position (f on every row, leading passes,
    the residual at the first rejection), batched and one image alone, while fewer rows are read."""
    rng = np.random.default_rng(31)
    tested = []

    class Counting(GroupedRule):
        def accept_rows(self, p, q, tokens, positions):
            tested.append(np.size(tokens))
            return super().accept_rows(p, q, tokens, positions)

    rule = Counting(embeddings, group=10, gap=0.3, radius=1e9)
    reference = GroupedRule(embeddings, group=10, gap=0.3, radius=1e9)
    saved = total = 0
    for trial in range(30):
        images, longest = int(rng.integers(1, 5)), int(rng.integers(1, 14))
        p = rng.dirichlet(np.full(VOCAB, 0.6), size=(images, longest + 1)).astype(np.float32)
        q = rng.dirichlet(np.full(VOCAB, 0.6), size=(longest, images)).astype(np.float32)
        lengths = rng.integers(0, longest + 1, size=images)
        lengths[0] = longest
        drafts = [rng.integers(0, VOCAB, size=n).tolist() for n in lengths]
        coins, next_uniforms = rng.random((images, longest)) ** 0.3, rng.random(images)
        bonus = rng.integers(0, VOCAB, size=(images, longest + 1))
        tested.clear()
        got = verify_chains(p, q, drafts, rule, coins, next_uniforms, bonus)
        for b, chain in enumerate(drafts):
            f = [float(reference.accept_rows(p[b, i], q[i, b], np.array(x), i + 1)) for i, x in enumerate(chain)]
            accepted = next((i for i, value in enumerate(f) if coins[b, i] > value), len(chain))
            if accepted < len(chain):
                row = residual(p[b, accepted], q[accepted, b])
                token = int(np.searchsorted(np.cumsum(row), next_uniforms[b], side="right"))
            else:
                token = int(bonus[b, accepted])
            assert (got.accepted_lengths[b], got.next_tokens[b]) == (accepted, token)
        saved += sum(lengths) - sum(tested)
        total += sum(lengths)
    assert 0 < saved < total
