"""Every acceptance and resampling formula of the speculative methods, each written once.

DESIGN.md "Methods" and the papers define them; the decoding methods (runtime/methods/)
only orchestrate model calls around these functions. Rows are float64 probability vectors
over the vocabulary, produced by runtime.sampling (CFG, temperature, top-k, top-p applied
identically to P and Q).

Notation as in the Cool-SD paper: P target row, Q draft row, x̃ the drafted token,
f the acceptance probability, ω the relaxation weight, δ the relaxation budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.sampling import sample

# ---- the basic building blocks ------------------------------------------------------------


def normalise(mass: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Norm(·): scale non-negative `mass` to sum 1; `fallback` when it has (numerically) none.

    A residual only has zero mass when its rejection branch has probability zero, so the
    fallback (the target row) is never sampled in exact arithmetic; it keeps rounding noise
    from producing NaNs.
    """
    if mass.ndim == 1:
        total = mass.sum()
        if total <= 1e-12:
            return fallback
        mass /= total  # callers hand over a fresh array: normalise it in place
        return mass
    total = mass.sum(axis=-1, keepdims=True)  # rows [..., V]: each falls back on its own
    empty = total[..., 0] <= 1e-12
    if empty.any():
        mass[empty], total[empty] = np.asarray(fallback)[empty], 1.0
    mass /= total
    return mass


def acceptance(target_mass: float | np.ndarray, draft_mass: float | np.ndarray) -> np.ndarray:
    """f = min(1, target_mass / draft_mass): SD (P), Cool-SD (ω·P) and LANTERN (p̃) alike.

    Where the draft has no mass the draft never proposes the token, so f there is irrelevant
    for the sampled path; it is set to 1, which makes Q·f = 0 in residuals as it must.
    """
    if not isinstance(target_mass, np.ndarray) and not isinstance(draft_mass, np.ndarray):
        # the per-token hot path, in Python floats: a few numpy calls cost more than the
        # arithmetic between two graph runs
        draft = float(draft_mass)
        return 1.0 if draft <= 0 else min(1.0, max(0.0, float(target_mass) / draft))
    target_mass = np.asarray(target_mass, dtype=np.float64)
    draft_mass = np.asarray(draft_mass, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(draft_mass > 0, target_mass / np.where(draft_mass > 0, draft_mass, 1.0), 1.0)
    return np.clip(ratio, 0.0, 1.0)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Vanilla SD resampling distribution G^van = Norm([P − Q]_+) (Cool-SD Eq. 2).

    One of the few places that reads whole rows: a device-resident row (DeviceRows) crosses
    to the host here, at a rejection, and not before."""
    mass = np.subtract(p, q, dtype=np.float64)
    return normalise(np.maximum(mass, 0.0, out=mass), p)


def g_star(p: np.ndarray, q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Cool-SD's optimal resampling G* = Norm([P − Q·f(·)]_+) with f at every vocab entry (Eq. 10)."""
    mass = np.subtract(p, np.multiply(q, f, dtype=np.float64), dtype=np.float64)
    return normalise(np.maximum(mass, 0.0, out=mass), p)


# ---- relaxation schedules (Cool-SD) --------------------------------------------------------


def exponential_schedule(draft_len: int, relaxation_budget: float, decay: float = 0.7) -> np.ndarray:
    """Cool-SD Eq. 16: ω_i = δ·exp(−ν·i − μ), μ such that Σ_{i=1..L} exp(−ν·i − μ) = L.

    So Σ ω_i = δ·L and ω_{i+1}/ω_i = e^−ν: relaxation is spent early, where the paper's
    Proposition 2 shows it distorts the output least.
    """
    i = np.arange(1, draft_len + 1, dtype=np.float64)
    mu = np.log(np.exp(-decay * i).sum() / draft_len)
    return relaxation_budget * np.exp(-decay * i - mu)


def linear_schedule(draft_len: int, relaxation_budget: float, slope_len: int = 8) -> np.ndarray:
    """Cool-SD Eq. 17: ω_i = δ·L·ω̃_i / Σ ω̃_i with ω̃_i = (ℓ − i) / (ℓ(ℓ + 1)), ℓ = 8.

    Positions i ≥ ℓ get ω ≤ 0, i.e. are never accepted (the paper pairs ℓ with short drafts).
    """
    i = np.arange(1, draft_len + 1, dtype=np.float64)
    raw = (slope_len - i) / (slope_len * (slope_len + 1))
    return relaxation_budget * draft_len * raw / raw.sum()


def uniform_schedule(draft_len: int, relaxation_budget: float) -> np.ndarray:
    """UniformRSD: ω_i = δ at every draft position."""
    return np.full(draft_len, float(relaxation_budget))


SCHEDULES = ("exp", "linear", "uniform")


def relaxation_schedule(name: str, draft_len: int, relaxation_budget: float, decay: float = 0.7,
                        slope_len: int = 8) -> np.ndarray:
    """ω_1..ω_L for a schedule name ('exp', 'linear', 'uniform'), exactly Eq. 16 / Eq. 17 / δ.

    What δ means depends on the schedule. Under 'uniform' (UniformRSD) every position gets
    ω_i = δ, so δ = 1 is vanilla SD. Under 'exp' and 'linear' δ is the mean weight (Σ ω_i = δ·L)
    that the schedule redistributes towards the first positions, so even δ = 1 relaxes the
    early positions and tightens the late ones (Eq. 16 at δ = 1, ν = 0.7, L = 4:
    ω ≈ (2.14, 1.07, 0.53, 0.26)); no δ makes them lossless. The weights are continuous in δ:
    there is no special case at δ = 1 (vanilla SD is `sd`, or 'uniform' with δ = 1).
    """
    if name == "exp":
        return exponential_schedule(draft_len, relaxation_budget, decay)
    if name == "linear":
        return linear_schedule(draft_len, relaxation_budget, slope_len)
    if name == "uniform":
        return uniform_schedule(draft_len, relaxation_budget)
    raise SpecrtError(f"unknown Cool-SD schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


# ---- LANTERN's latent-neighbour relaxation ------------------------------------------------


def lantern_neighbourhood(p: np.ndarray, neighbours: np.ndarray, token: int, *,
                          tvd_budget: Optional[float] = None, ratio: Optional[float] = None) -> np.ndarray:
    """A^{k,δ}(x̃) \\ {x̃}: the largest prefix of x̃'s k nearest neighbours whose mass stays in budget.

    Neighbours are taken nearest first; `neighbours` never lists the token itself, so k counts
    neighbours only (as LANTERN's code, whose table has V − 1 entries per token; LANTERN's paper
    text counts x̃ among its k). Exactly one of the two budgets is given:
    - LANTERN, tvd_budget δ: cumulative neighbour mass ≤ δ.
    - LANTERN++, ratio λ, in the convention of LANTERN's code (`cumsum <= (lantern_delta − 1)·px`):
      cumulative neighbour mass ≤ (λ − 1)·p(x̃), i.e. p̃(x̃) ≤ λ·p(x̃). The Cool-SD paper's Eq. 3-5
      writes the set with neighbour mass < λ·p(x̃), one off from this: its λ is our ratio − 1.
      Its Table 1 row "LANTERN++ (λ = 2, k = 10)" takes LANTERN++'s own values, so it is
      ratio=2, neighbours_k=10 here (the strict < differs only on exact ties).
    """
    nbrs = neighbours[token]
    cumulative = np.cumsum(p[nbrs])
    limit = tvd_budget if tvd_budget is not None else (ratio - 1.0) * p[token]
    return nbrs[: int(np.searchsorted(cumulative, limit, side="right"))]


def lantern_relaxed_mass(p: np.ndarray, neighbours: np.ndarray, *, tvd_budget: Optional[float] = None,
                         ratio: Optional[float] = None) -> np.ndarray:
    """p̃(x) = p(x) + mass of A^{k,δ}(x) \\ {x}, for every x at once ([V]); LANTERN Eq. 5's numerator."""
    mass = p[neighbours]  # [V, k]
    cumulative = np.cumsum(mass, axis=-1)
    limit = tvd_budget if tvd_budget is not None else (ratio - 1.0) * p[:, None]
    return p + np.where(cumulative <= limit, mass, 0.0).sum(axis=-1)


def lantern_moved_target(p: np.ndarray, neighbourhood: np.ndarray, token: int) -> np.ndarray:
    """P^{k,λ} of Cool-SD Eq. 4: the neighbourhood's mass moved onto x̃ (for Eq. 6's residual)."""
    moved = np.array(p, dtype=np.float64)
    moved[token] = moved[token] + moved[neighbourhood].sum()
    moved[neighbourhood] = 0.0
    return moved


# ---- acceptance rules: what one drafted position is verified with ---------------------------


class AcceptanceRule:
    """f_i and G_i of one draft position i (1-based), as the Cool-SD paper's Relaxed SD frames it.

    accept_probability(p, q, x̃) is f_i(x̃); acceptance_row(p, q) is f_i at every token (needed
    by G* and by the Theorem-2 quantities); resample(p, q, x̃) is the distribution sampled at a
    rejection of x̃. Subclasses set only what differs.
    """

    def acceptance_row(self, p: np.ndarray, q: np.ndarray, position: int) -> np.ndarray:
        raise NotImplementedError

    def accept_probability(self, p: np.ndarray, q: np.ndarray, token: int, position: int) -> float:
        return float(self.acceptance_row(p, q, position)[token])

    def resample(self, p: np.ndarray, q: np.ndarray, token: int, position: int) -> np.ndarray:
        return g_star(p, q, self.acceptance_row(p, q, position))

    @property
    def resample_depends_on_token(self) -> bool:
        """True when G depends on the rejected token (LANTERN's Eq. 6), outside Theorem 2's form."""
        return False


class VanillaRule(AcceptanceRule):
    """Lossless SD: f = min(1, P/Q), G = Norm([P − Q]_+)."""

    def acceptance_row(self, p, q, position):
        return acceptance(np.asarray(p), np.asarray(q))

    def accept_probability(self, p, q, token, position):
        return float(acceptance(p[token], q[token]))

    def resample(self, p, q, token, position):
        return residual(p, q)


VANILLA = VanillaRule()


@dataclass
class CoolRule(AcceptanceRule):
    """Relaxed SD with ω_i per draft position: f_i = min(1, ω_i·P/Q), G* resampling (Eq. 12, 10)."""

    weights: np.ndarray  # ω_1..ω_L

    def acceptance_row(self, p, q, position):
        return acceptance(self.weights[position - 1] * np.asarray(p), np.asarray(q))

    def accept_probability(self, p, q, token, position):
        return float(acceptance(self.weights[position - 1] * p[token], q[token]))


@dataclass
class LanternRule(AcceptanceRule):
    """LANTERN / LANTERN++: f = min(1, p̃(x̃)/q(x̃)); resample 'lantern' (Eq. 6) or 'gstar' (Eq. 10)."""

    neighbours: np.ndarray  # [V, k] nearest codebook entries, a token not its own neighbour
    tvd_budget: Optional[float] = None
    ratio: Optional[float] = None
    resampling: str = "lantern"

    def _budget(self) -> dict:
        return {"tvd_budget": self.tvd_budget, "ratio": self.ratio}

    def acceptance_row(self, p, q, position):
        return acceptance(lantern_relaxed_mass(np.asarray(p), self.neighbours, **self._budget()), np.asarray(q))

    def accept_probability(self, p, q, token, position):
        hood = lantern_neighbourhood(p, self.neighbours, token, **self._budget())
        return float(acceptance(p[token] + p[hood].sum(), q[token]))

    def resample(self, p, q, token, position):
        if self.resampling == "gstar":
            return g_star(p, q, self.acceptance_row(p, q, position))
        hood = lantern_neighbourhood(p, self.neighbours, token, **self._budget())
        return residual(lantern_moved_target(p, hood, token), q)

    @property
    def resample_depends_on_token(self) -> bool:
        return self.resampling != "gstar"


# ---- verifying a drafted chain (SD family) -----------------------------------------------------


@dataclass
class ChainOutcome:
    """accepted_length τ, the token sampled after the accepted prefix (resampled or bonus)."""

    accepted_length: int
    next_token: int


def verify_chain(p_rows: np.ndarray, q_rows: Sequence[np.ndarray], drafts: Sequence[int], rule: AcceptanceRule,
                 rng: np.random.Generator, bonus: int) -> ChainOutcome:
    """Cool-SD Alg. 1 lines 4-17: accept x̃_i while r_i ≤ f_i; at the first rejection sample G_i;
    if all L are accepted the token after them is `bonus`, a draw from P_{L+1} (the head's).

    p_rows [L+1, V] (row i predicts draft i; row L the bonus), q_rows [L, V]. Only the drafted
    tokens' entries are read until a rejection needs the two rows of one position.
    """
    for i, token in enumerate(drafts):
        if rng.random() <= rule.accept_probability(p_rows[i], q_rows[i], int(token), i + 1):
            continue
        return ChainOutcome(i, int(sample(rule.resample(p_rows[i], q_rows[i], int(token), i + 1), rng)))
    return ChainOutcome(len(drafts), int(bonus))


def verify_position(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator) -> tuple[bool, int]:
    """One lossless rejection-sampling test (SJD, SJD-PAC): keep x̃ with min(1, p/q), else Norm([p − q]_+)."""
    if rng.random() <= acceptance(p[token], q[token]):
        return True, int(token)
    return False, int(sample(residual(p, q), rng))


def stack_rows(rows: Sequence[np.ndarray]) -> np.ndarray:
    """n rows [V] as one block [n, V] that can be indexed like numpy.

    When some rows are device-resident views (a backend's `stack_rows` classmethod, e.g. the torch
    backend's DeviceRows) the block is stacked on the device, so reading one entry of each row is
    one transfer instead of n: on a GPU each transfer is a synchronisation."""
    backend = next((type(r) for r in rows if hasattr(type(r), "stack_rows")), None)
    if backend is not None:
        return backend.stack_rows(rows)
    return np.stack([np.asarray(r) for r in rows])


def verify_positions(p_block: np.ndarray, q_rows: Sequence[np.ndarray], tokens: Sequence[int],
                     rng: np.random.Generator) -> list[int]:
    """verify_position at several independent positions at once (SJD-PAC's adaptive continuation
    re-tests every stale draft against its new row): the kept or resampled token of each.

    p_block [n, V] holds the new rows (one gather from the step's output), q_rows the n old
    ones (stacked once, stack_rows). Each position uses its own uniforms, so this is the same
    test; only the tokens' entries are read until the rejected positions' residuals are formed
    and sampled as one [R, V] block instead of R small host calls.
    """
    count = len(tokens)
    index = np.arange(count), np.asarray(tokens)
    q_block = stack_rows(q_rows)
    p_at = np.asarray(p_block[index], dtype=np.float64)
    q_at = np.asarray(q_block[index], dtype=np.float64)
    out = [int(t) for t in tokens]
    rejected = np.flatnonzero(rng.random(count) > acceptance(p_at, q_at))
    if rejected.size:
        p_rejected = np.asarray(p_block[rejected], dtype=np.float64)
        q_rejected = np.asarray(q_block[rejected], dtype=np.float64)
        for i, token in zip(rejected, sample(residual(p_rejected, q_rejected), rng)):
            out[i] = int(token)
    return out


# ---- verifying sibling candidates drawn without replacement (SJD-PAC App. A.3) ------------------


def without_replacement(q: np.ndarray, taken: Sequence[int]) -> np.ndarray:
    """q^(k): the draft row with the already drawn candidates removed and renormalised (Eq. 7)."""
    if not len(taken):
        return q  # the first candidate is tested against q itself
    rest = np.array(q, dtype=np.float64)
    rest[list(taken)] = 0.0
    return normalise(rest, rest)


def draw_without_replacement(q: np.ndarray, count: int, rng: np.random.Generator,
                             first: Optional[int] = None) -> list[int]:
    """`count` distinct candidates, candidate k drawn from q^(k); `first` fixes candidate 1 when the
    caller already holds a draw from q (SJD-PAC keeps its adaptive-continuation token there)."""
    q = np.asarray(q)
    picked: list[int] = [] if first is None else [int(first)]
    while len(picked) < min(count, int(np.count_nonzero(q))):
        picked.append(int(sample(without_replacement(q, picked), rng)))
    return picked


def verify_siblings(p: np.ndarray, q: np.ndarray, candidates: Sequence[int],
                    rng: np.random.Generator) -> tuple[Optional[int], int]:
    """Sequential rejection sampling over candidates c_1..c_K drawn without replacement from q.

    Candidate k is tested against the residual target p^(k) with the adjusted draft q^(k)
    (p^(1) = p, p^(k+1) = Norm([p^(k) − q^(k)]_+)); returns (index accepted or None, token).
    On total rejection the token is drawn from p^(K+1). Exact for any K (SJD-PAC Theorem 2).
    """
    return verify_candidates(p, candidate_proposals(q, candidates, SAMPLED), VANILLA, 1, rng)


# ---- verifying a token tree (tree drafting for sd, cool-sd, lantern) -------------------------------

SAMPLED, TOP = "sampled", "top"  # how a node's children were drafted (runtime.tree)


def candidate_proposals(q: Any, candidates: Sequence[int], drawn: str,
                        vocab: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(token, the draft distribution it was drawn from) for the children c_1..c_K of one node, made
    lazily (verification stops at the first accepted child).

    SAMPLED: c_k was drawn from q^(k) = q without c_1..c_{k−1}, renormalised (sampling without
    replacement, EAGLE-1's and LANTERN's static trees, SJD-PAC's siblings).
    TOP: the children are the row's top-k tokens, a deterministic function of the draft's rows
    (EAGLE-2's dynamic trees), so c_k is a draw from the point mass on c_k. This is what EAGLE-2's
    evaluate_posterior does with `qx = 1.0` and `gtp[xi] = 0` on a rejection (the residual
    Norm([p − δ_x]_+) is p with x removed); testing the top-k tokens against q^(k) instead would not
    be exact, because they were never drawn from q.
    """
    for k, token in enumerate(candidates):
        if drawn == SAMPLED:
            yield int(token), without_replacement(q, candidates[:k])
        elif drawn == TOP:
            yield int(token), point_mass(int(token), vocab)
        else:
            raise ValueError(f"unknown drafting {drawn!r}")


def point_mass(token: int, vocab: int) -> np.ndarray:
    row = np.zeros(vocab, dtype=np.float64)
    row[token] = 1.0
    return row


def verify_candidates(p: np.ndarray, proposals: Iterable[tuple[int, np.ndarray]], rule: AcceptanceRule,
                      position: int, rng: np.random.Generator) -> tuple[Optional[int], int]:
    """Recursive rejection sampling over the sibling candidates of one tree node (SpecInfer; EAGLE's
    evaluate_posterior): candidate k, drawn from q_k, is kept with the rule's f(p^(k), q_k, c_k); on a
    rejection the target becomes the rule's resampling distribution G(p^(k), q_k, c_k) and the next
    sibling is tried; after the last, the token is drawn from what remains. (index or None, token).

    For VanillaRule (f = min(1, p/q), G = Norm([p − q]_+)) this is exactly lossless whenever q_k is
    the distribution c_k was really drawn from given c_1..c_{k−1} (candidate_proposals): each step
    is one SD step from p^(k) with proposal q_k, which returns a draw from p^(k) when it accepts
    and a draw from p^(k+1) in the rejecting branch, so by induction over k the result is a draw
    from p (SJD-PAC Theorem 2 for draws without replacement; point masses are the K = 1 case of
    each step). With K = 1 it is verify_chain's step. The relaxed rules are applied the same way,
    to the current residual p^(k) at every sibling: neither the Cool-SD paper nor LANTERN's
    defines multi-candidate verification; LANTERN's code (evaluate_posterior, _v1) likewise
    computes the relaxed p̃ on the residual at each sibling. Cool-SD's ω is that of the siblings'
    depth (draft position `position`, 1-based).
    """
    target = p
    for k, (token, q) in enumerate(proposals):
        if rng.random() <= rule.accept_probability(target, q, token, position):
            return k, int(token)
        target = rule.resample(target, q, token, position)
    return None, int(sample(np.asarray(target), rng))


@dataclass
class TreeOutcome:
    """The accepted path (window slots from the root), its drafted tokens, and the token after them."""

    path: list[int]
    accepted: list[int]
    next_token: int


def verify_tree(p_rows: Any, tree: Any, rule: AcceptanceRule, rng: np.random.Generator, bonus: Any) -> TreeOutcome:
    """Walk a token tree (runtime.tree.TokenTree) from the root: at each node verify its children in
    order (verify_candidates with the draft distributions they were drawn from); an accepted child
    becomes the next node; a total rejection ends the walk with the resampled token; at a node
    without children the token after it is `bonus[node]`, the head's draw from that node's row.

    p_rows [W, V]: the target's rows by window slot (= node); only the tested tokens' entries and
    the rows of a rejection's residual are read.
    """
    node, path, accepted = 0, [0], []
    while tree.children[node]:
        kids = tree.children[node]
        proposals = candidate_proposals(tree.rows.get(node), [tree.tokens[c] for c in kids], tree.drawn,
                                        p_rows.shape[-1])
        index, token = verify_candidates(p_rows[node], proposals, rule, tree.depths[node] + 1, rng)
        if index is None:
            return TreeOutcome(path, accepted, token)
        node = kids[index]
        path.append(node)
        accepted.append(token)
    return TreeOutcome(path, accepted, int(bonus[node]))


# ---- Theorem 2 (Cool-SD): expected accepted length and TV bound --------------------------------


def accepted_mass(q: np.ndarray, f: np.ndarray) -> float:
    """Σ_x Q(x)·f(x): the probability that one draft position is accepted (the inner sum of Eq. 7)."""
    return float(np.dot(np.asarray(q), f))


def tv_bound_term(p: np.ndarray, q: np.ndarray, f: np.ndarray, g: np.ndarray) -> float:
    """½ Σ_x |Q(x)f(x) − P(x) + G(x)·Σ_y (1 − f(y))Q(y)| for one position (the summand of Eq. 8-9)."""
    p, q = np.asarray(p), np.asarray(q)
    return 0.5 * float(np.abs(q * f - p + g * np.dot(1.0 - f, q)).sum())


@dataclass
class RoundEstimate:
    """Unbiased one-sample estimates of Theorem 2's E[τ+1] and TV bound along the drafted path."""

    expected_accepted_length: float
    tv_bound: float


def theorem2_along_path(p_rows: np.ndarray, q_rows: np.ndarray, drafts: Sequence[int],
                        rule: AcceptanceRule) -> RoundEstimate:
    """Eq. 7 and Eq. 8-9 estimated from the rows one round computes.

    Both are expectations over the drafted prefix x̃ ~ Q of products Π f_k; the drafted path is
    one such sample, so Π_{k<i} f_k(x̃_k) times the exact per-position term is an unbiased
    estimate. Averaged over rounds (Stats) they approximate the theorem's quantities. The TV
    term needs G independent of the rejected token, so LANTERN's Eq.-6 resampling gives NaN.
    """
    length, prefix_product, tv = 1.0, 1.0, 0.0
    for i, token in enumerate(drafts):
        f = rule.acceptance_row(p_rows[i], q_rows[i], i + 1)
        length += prefix_product * accepted_mass(q_rows[i], f)
        if rule.resample_depends_on_token:
            tv = float("nan")
        else:
            g = rule.resample(p_rows[i], q_rows[i], int(token), i + 1)
            tv += prefix_product * tv_bound_term(p_rows[i], q_rows[i], f, g)
        prefix_product *= f[int(token)]
    return RoundEstimate(length, tv)
