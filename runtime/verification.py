"""Every acceptance and resampling formula of the speculative methods, each written once.

DESIGN.md "Methods" and the papers define them; the decoding methods (runtime/methods/)
only orchestrate model calls around these functions. Rows are float64 probability vectors
over the vocabulary, produced by runtime.sampling (CFG, temperature, top-k, top-p applied
identically to P and Q).

Notation as in the Cool-SD paper: P target row, Q draft row, x̃ the drafted token,
f the acceptance probability, ω the relaxation weight, δ the relaxation budget.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator, Iterable, Iterator, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.arrays import Constants, as_array, is_host, namespace
from specrt.runtime.sampling import draw_from_cdf, draws_from_cdf, inverse_cdf, sample

# ---- the basic building blocks ------------------------------------------------------------


def normalise(mass: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Norm(·): scale non-negative `mass` to sum 1; `fallback` when it has (numerically) none.

    A residual only has zero mass when its rejection branch has probability zero, so the
    fallback (the target row) is never sampled in exact arithmetic; it keeps rounding noise
    from producing NaNs.
    """
    if mass.ndim == 1 and is_host(mass):
        total = mass.sum()
        if total <= 1e-12:
            return fallback
        mass /= total  # callers hand over a fresh array: normalise it in place
        return mass
    xp = namespace(mass)  # rows [..., V]: each falls back on its own
    total = xp.sum(mass, axis=-1, keepdims=True)
    empty = total <= 1e-12
    if is_host(mass) and not empty.any():  # the fallback (perhaps device rows) is not read at all
        return mass / total
    # on the device no test waits for it: the fallback rows are chosen where they live
    return xp.where(empty, xp.astype(as_array(fallback), xp.float64), mass / xp.where(empty, 1.0, total))


def acceptance(target_mass: float | np.ndarray, draft_mass: float | np.ndarray) -> np.ndarray:
    """f = min(1, target_mass / draft_mass): SD (P), Cool-SD (ω·P) and LANTERN (p̃) alike.

    Where the draft has no mass the draft never proposes the token, so f there is irrelevant
    for the sampled path; it is set to 1, which makes Q·f = 0 in residuals as it must.
    """
    if not isinstance(target_mass, np.ndarray) and not isinstance(draft_mass, np.ndarray) and \
            is_host(target_mass) and is_host(draft_mass):
        # the per-token hot path, in Python floats: a few numpy calls cost more than the
        # arithmetic between two graph runs
        draft = float(draft_mass)
        return 1.0 if draft <= 0 else min(1.0, max(0.0, float(target_mass) / draft))
    target_mass, draft_mass = as_array(target_mass), as_array(draft_mass)
    xp = namespace(draft_mass if is_host(target_mass) else target_mass)
    target_mass, draft_mass = xp.astype(target_mass, xp.float64), xp.astype(draft_mass, xp.float64)
    # the ratio only where the draft has more mass than the target (so some): 1 everywhere else,
    # which is min(1, ratio) for the non-negative masses every rule hands over
    relaxed = draft_mass > target_mass
    return xp.where(relaxed, target_mass / xp.where(relaxed, draft_mass, 1.0), 1.0)


def residual_mass(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """[P − Q]_+ in float64, not normalised: the residual's shape (Cool-SD Eq. 2)."""
    if is_host(p):  # the host's rows (a rejection's, at batch 1 the hot path): one float64 array
        mass = np.subtract(p, q, dtype=np.float64)
        return np.maximum(mass, 0.0, out=mass)
    xp = namespace(p)
    return xp.maximum(xp.astype(p, xp.float64) - xp.astype(q, xp.float64), 0.0)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Vanilla SD resampling distribution G^van = Norm([P − Q]_+) (Cool-SD Eq. 2).

    One of the few places that reads whole rows: a device-resident row (DeviceRows) crosses
    to the host here, at a rejection, and not before."""
    return normalise(residual_mass(p, q), p)


def draw_masses(mass: Any, fallback: Any, uniforms: Any) -> Any:
    """One draw from Norm(mass) for each row [R, V] with the uniforms [R] given, without normalising
    first: the inverse CDF scales its uniform by each row's total anyway (sampling.inverse_cdf), so
    the division is skipped; a row with (numerically) no mass draws from its fallback row, as
    normalise would. In the rows' own array library (runtime.arrays): on the host a row without
    mass reads its fallback row alone; where the rows live on a device every fallback CDF is formed
    and picked where needed, since choosing rows there would make the host wait. The same draws
    either way."""
    xp = namespace(mass)
    cdf = xp.cumulative_sum(mass, axis=-1)
    empty = cdf[:, -1] <= 1e-12
    if is_host(mass):
        if empty.any():
            cdf[empty] = np.cumsum(np.asarray(fallback, dtype=np.float64)[empty], axis=-1)
    else:
        cdf = xp.where(empty[:, None], xp.cumulative_sum(xp.astype(fallback, xp.float64), axis=-1), cdf)
    return draws_from_cdf(cdf, uniforms)


def g_star(p: np.ndarray, q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Cool-SD's optimal resampling G* = Norm([P − Q·f(·)]_+) with f at every vocab entry (Eq. 10)."""
    p, q = as_array(p), as_array(q)
    xp = namespace(p)
    return normalise(xp.maximum(xp.astype(p, xp.float64) - xp.astype(q, xp.float64) * f, 0.0), p)


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


def lantern_kept(neighbour_mass: np.ndarray, token_mass: Any, *, tvd_budget: Optional[float] = None,
                 ratio: Optional[float] = None) -> tuple[np.ndarray, np.ndarray]:
    """A^{k,δ}(x̃) \\ {x̃} as a mask over x̃'s k nearest neighbours, the largest prefix whose mass
    stays in budget, and that mass ([..., k] and [...]).

    neighbour_mass [..., k] is P at the neighbours, nearest first; token_mass [...] is P(x̃). The
    table never lists a token as its own neighbour, so k counts neighbours only (as LANTERN's code,
    whose table has V − 1 entries per token; LANTERN's paper text counts x̃ among its k). Exactly
    one of the two budgets is given:
    - LANTERN, tvd_budget δ: cumulative neighbour mass ≤ δ.
    - LANTERN++, ratio λ, in the convention of LANTERN's code (`cumsum <= (lantern_delta − 1)·px`):
      cumulative neighbour mass ≤ (λ − 1)·p(x̃), i.e. p̃(x̃) ≤ λ·p(x̃). The Cool-SD paper's Eq. 3-5
      writes the set with neighbour mass < λ·p(x̃), one off from this: its λ is our ratio − 1.
      Its Table 1 row "LANTERN++ (λ = 2, k = 10)" takes LANTERN++'s own values, so it is
      ratio=2, neighbours_k=10 here (the strict < differs only on exact ties).
    Masses are non-negative, so the cumulative sum only grows and the kept entries are a prefix;
    their mass is the cumulative sum at the last of them (the largest kept one), summed in order as
    `_kept_prefix` sums one token's in Python floats, so both give the same bits.
    """
    xp = namespace(neighbour_mass)
    cumulative = xp.cumulative_sum(neighbour_mass, axis=-1)
    limit = tvd_budget if tvd_budget is not None else (ratio - 1.0) * xp.asarray(token_mass)[..., None]
    kept = cumulative <= limit
    if cumulative.shape[-1] == 0:  # no neighbours: nothing kept
        return kept, xp.zeros(cumulative.shape[:-1], dtype=cumulative.dtype)
    return kept, xp.max(xp.where(kept, cumulative, 0.0), axis=-1)


def _kept_prefix(token_mass: float, neighbour_mass: Sequence[float], tvd_budget: Optional[float],
                 ratio: Optional[float]) -> tuple[int, float]:
    """lantern_kept for one token in Python floats: (how many nearest neighbours are kept, their
    mass). One position's test reads k + 1 numbers; a block evaluation would cost a dozen numpy
    calls, each 5-15 µs between two graph runs."""
    limit = tvd_budget if tvd_budget is not None else (ratio - 1.0) * token_mass
    count, cumulative, kept = 0, 0.0, 0.0
    for mass in neighbour_mass:
        cumulative += mass
        if cumulative > limit:
            break
        count, kept = count + 1, cumulative
    return count, kept


def lantern_columns(neighbours: np.ndarray, tokens: Any) -> np.ndarray:
    """[..., 1 + k]: each token, then its k nearest neighbours (the entries of P its p̃ reads);
    neighbours and tokens in one array library."""
    tokens = np.asarray(tokens) if is_host(tokens) else tokens
    return namespace(tokens).concat([tokens[..., None], neighbours[tokens]], axis=-1)


def lantern_relaxed(columns_mass: np.ndarray, *, tvd_budget: Optional[float] = None,
                    ratio: Optional[float] = None) -> np.ndarray:
    """p̃(x) = p(x) + mass of A^{k,δ}(x) \\ {x} (LANTERN Eq. 5's numerator) from P at lantern_columns(x),
    [..., 1 + k] -> [...]."""
    token_mass, neighbour_mass = columns_mass[..., 0], columns_mass[..., 1:]
    return token_mass + lantern_kept(neighbour_mass, token_mass, tvd_budget=tvd_budget, ratio=ratio)[1]


def lantern_relaxed_mass(p: np.ndarray, neighbours: np.ndarray, *, tvd_budget: Optional[float] = None,
                         ratio: Optional[float] = None) -> np.ndarray:
    """p̃ at every token of rows p [..., V] at once ([..., V]; G* needs f everywhere); `neighbours`
    where p lives."""
    p = as_array(p)
    xp = namespace(p)
    p = xp.astype(p, xp.float64)
    every = np.arange(p.shape[-1]) if is_host(p) else xp.arange(p.shape[-1], device=p.device)
    columns = lantern_columns(neighbours, every)  # [V, 1 + k]
    return lantern_relaxed(p[..., columns], tvd_budget=tvd_budget, ratio=ratio)


def lantern_moved_target(p: np.ndarray, neighbours: np.ndarray, tokens: Any, *, tvd_budget: Optional[float] = None,
                         ratio: Optional[float] = None) -> np.ndarray:
    """P^{k,λ} of Cool-SD Eq. 4 for rows p [..., V] and the rejected tokens x̃ [...]: the mass of
    A^{k,δ}(x̃) \\ {x̃} moved onto x̃ (for Eq. 6's residual); a fresh float64 array. One row with one
    token (a batch-1 rejection) finds the kept prefix in Python floats (_kept_prefix), the same
    numbers as the block's. `neighbours` where p lives."""
    xp = namespace(p)
    moved = np.array(p, dtype=np.float64) if is_host(p) else xp.astype(p, xp.float64, copy=True)
    if moved.ndim == 1 and is_host(moved):
        token = int(tokens)
        nearest = neighbours[token]
        count, kept_mass = _kept_prefix(moved.item(token), moved[nearest].tolist(), tvd_budget, ratio)
        moved[nearest[:count]] = 0.0
        moved[token] += kept_mass
        return moved
    rows = moved.reshape(-1, moved.shape[-1])  # a view: [R, V]
    tokens = (np.asarray(tokens) if is_host(tokens) else tokens).reshape(-1)
    at = np.arange(len(tokens)) if is_host(tokens) else xp.arange(tokens.shape[0], device=tokens.device)
    nearest = at[:, None], neighbours[tokens]  # row r's k neighbour columns (one fancy index, no *_along_axis)
    token_mass = rows[at, tokens]
    mass = rows[nearest]
    kept, kept_mass = lantern_kept(mass, token_mass, tvd_budget=tvd_budget, ratio=ratio)
    rows[nearest] = xp.where(kept, 0.0, mass)  # x̃ is not its own neighbour; a row's neighbours are distinct
    rows[at, tokens] = token_mass + kept_mass
    return moved


# ---- acceptance rules: what one drafted position is verified with ---------------------------


class AcceptanceRule:
    """f_i and G_i of one draft position i (1-based), as the Cool-SD paper's Relaxed SD frames it.

    Every method takes rows [..., V] with tokens and positions [...] (one row, or a block of rows
    with a token and a position each) unless it says otherwise:
    - columns(x̃) [..., c]: the entries of P that f_i(x̃) reads (x̃ itself first); a batch gathers
      them for every drafted token in one indexing op;
    - accept_probabilities(P at columns, Q(x̃), i) is f_i(x̃) from those entries;
      accept_probability(p, q, x̃, i) the same for one row (a float);
    - acceptance_row(p, q, i) is f_i at every token (needed by G* and by the Theorem-2 quantities);
    - resample(p, q, x̃, i) is the distribution sampled at a rejection of x̃.
    Subclasses set only what differs; accept_probability and accept_probabilities must agree
    (a batch of one image is tested with the first where `scalar_tests`, larger ones with the
    second). `scalar_tests`: accept_probability is a few Python float operations (SD's,
    Cool-SD's, LANTERN's k + 1 entries), cheaper position by position than one block evaluation.
    """

    scalar_tests = False

    def columns(self, tokens: Any) -> np.ndarray:
        return (np.asarray(tokens) if is_host(tokens) else tokens)[..., None]

    def accept_probabilities(self, p_at: np.ndarray, q_at: np.ndarray, positions: Any) -> np.ndarray:
        raise NotImplementedError

    def acceptance_row(self, p: np.ndarray, q: np.ndarray, position: Any) -> np.ndarray:
        raise NotImplementedError

    def accept_probability(self, p: np.ndarray, q: np.ndarray, token: int, position: int) -> float:
        p_at = np.asarray(p[self.columns(int(token))], dtype=np.float64)
        return float(self.accept_probabilities(p_at, np.float64(q[int(token)]), position))

    def resample(self, p: np.ndarray, q: np.ndarray, token: Any, position: Any) -> np.ndarray:
        return g_star(p, q, self.acceptance_row(p, q, position))

    @property
    def resample_depends_on_token(self) -> bool:
        """True when G depends on the rejected token (LANTERN's Eq. 6), outside Theorem 2's form."""
        return False

    def prepare(self, like: Any) -> None:
        """Copy the rule's tables to `like`'s device now (the device round calls it before its first
        round): made inside a traced round, the copy would be a host tensor in the graph."""


class VanillaRule(AcceptanceRule):
    """Lossless SD: f = min(1, P/Q), G = Norm([P − Q]_+)."""

    scalar_tests = True

    def accept_probabilities(self, p_at, q_at, positions):
        return acceptance(p_at[..., 0], q_at)

    def acceptance_row(self, p, q, position):
        return acceptance(np.asarray(p), np.asarray(q))

    def accept_probability(self, p, q, token, position):
        return float(acceptance(p[token], q[token]))  # Python floats: tree siblings test one at a time

    def resample(self, p, q, token, position):
        return residual(p, q)


VANILLA = VanillaRule()


@dataclass
class CoolRule(AcceptanceRule):
    """Relaxed SD with ω_i per draft position: f_i = min(1, ω_i·P/Q), G* resampling (Eq. 12, 10)."""

    weights: np.ndarray  # ω_1..ω_L
    scalar_tests = True
    _on_device: Constants = field(default_factory=Constants, init=False, repr=False, compare=False)

    def __post_init__(self):
        # ω ≤ 0 (the linear schedule's positions past ℓ) means never accept: f = 0, as the scalar
        # test's clamp of ω·P/Q reads it. Held at 0 here so every form agrees; a negative ω·P over
        # Q = 0 made the array form's f −inf and G* NaN.
        self.weights = np.maximum(np.asarray(self.weights, dtype=np.float64), 0.0)

    def omega(self, positions: Any) -> np.ndarray:
        """ω_i at 1-based draft positions (any shape; one int position gives a number)."""
        if isinstance(positions, (int, np.integer)):  # a tree node, a batch-1 rejection: no arrays
            return self.weights[positions - 1]
        if not is_host(positions):  # device positions: ω where they live (copied once per device)
            return self._on_device.get("weights", lambda: self.weights, positions)[positions - 1]
        return np.asarray(self.weights)[np.asarray(positions) - 1]

    def accept_probabilities(self, p_at, q_at, positions):
        return acceptance(self.omega(positions) * p_at[..., 0], q_at)

    def prepare(self, like: Any) -> None:
        self._on_device.get("weights", lambda: self.weights, like)

    def acceptance_row(self, p, q, position):
        omega = self.omega(position)
        omega = omega[..., None] if getattr(omega, "ndim", 0) else omega  # ω_i per row, or one number
        p = as_array(p)
        xp = namespace(p)
        return acceptance(omega * xp.astype(p, xp.float64), q)  # float64 for float32 rows too

    def accept_probability(self, p, q, token, position):
        return float(acceptance(self.omega(position) * p[token], q[token]))  # Python floats, as SD's

    def resample(self, p, q, token, position):
        """G* (Eq. 10) in closed form: Q·f = min(Q, ω·P), so P − Q·f = max(P − Q, (1 − ω)·P), whose
        second term is ≥ 0 for ω ≤ 1 and ≤ 0 for ω ≥ 1 (G* is then vanilla SD's residual): three
        array operations where g_star(p, q, acceptance_row(...)) takes eight, a batch-1 rejection's
        largest host cost. Equal to that form up to rounding (tests/runtime/test_verification.py)."""
        omega = self.omega(position)
        if not getattr(omega, "ndim", 0):  # one number: a batch-1 rejection
            mass = np.subtract(p, q, dtype=np.float64)
            kept = np.multiply(p, 1.0 - omega, dtype=np.float64) if omega < 1.0 else 0.0
            return normalise(np.maximum(mass, kept, out=mass), p)
        p, q = as_array(p), as_array(q)  # ω per row of a block
        xp = namespace(p)
        p64 = xp.astype(p, xp.float64)
        return normalise(xp.maximum(p64 - xp.astype(q, xp.float64), p64 * xp.maximum(1.0 - omega, 0.0)[..., None]), p)


@dataclass
class LanternRule(AcceptanceRule):
    """LANTERN / LANTERN++: f = min(1, p̃(x̃)/q(x̃)); resample 'lantern' (Eq. 6) or 'gstar' (Eq. 10)."""

    neighbours: np.ndarray  # [V, k] nearest codebook entries, a token not its own neighbour
    tvd_budget: Optional[float] = None
    ratio: Optional[float] = None
    resampling: str = "lantern"
    scalar_tests = True
    _columns: Optional[np.ndarray] = field(default=None, init=False, repr=False, compare=False)
    _on_device: Constants = field(default_factory=Constants, init=False, repr=False, compare=False)

    def _budget(self) -> dict:
        return {"tvd_budget": self.tvd_budget, "ratio": self.ratio}

    def columns(self, tokens):
        # every token's columns, built once per rule (a generate call): one row lookup per test
        # instead of lantern_columns' four numpy calls, at [V, 1 + k] integers
        return self._on_device.get("columns", self._host_columns, tokens)[tokens]

    def _host_columns(self) -> np.ndarray:
        if self._columns is None:
            self._columns = lantern_columns(self.neighbours, np.arange(len(self.neighbours)))
        return self._columns

    def _neighbours(self, like: Any) -> Any:
        """The neighbour table where `like` lives."""
        return self._on_device.get("neighbours", lambda: self.neighbours, like)

    def prepare(self, like: Any) -> None:
        self.columns(like[:0])
        self._neighbours(like)

    def accept_probabilities(self, p_at, q_at, positions):
        return acceptance(lantern_relaxed(p_at, **self._budget()), q_at)

    def accept_probability(self, p, q, token, position):
        # Python floats from the k + 1 entries p̃ reads: the block's numbers (lantern_kept)
        # (tolist gives float32 entries as the same numbers in Python floats: no float64 copy first)
        token_mass, *neighbour_mass = p[self.columns(int(token))].tolist()
        return acceptance(token_mass + _kept_prefix(token_mass, neighbour_mass, self.tvd_budget, self.ratio)[1],
                          q[token])

    def acceptance_row(self, p, q, position):
        return acceptance(lantern_relaxed_mass(p, self._neighbours(p), **self._budget()), q)

    def resample(self, p, q, token, position):
        if self.resampling == "gstar":
            return g_star(p, q, self.acceptance_row(p, q, position))
        return residual(lantern_moved_target(p, self._neighbours(p), token, **self._budget()), q)

    @property
    def resample_depends_on_token(self) -> bool:
        return self.resampling != "gstar"


# ---- verifying drafted chains (SD family), a batch of images at once ------------------------------


@dataclass
class ChainOutcomes:
    """Per image of a batch: the accepted length τ, and the token sampled after the accepted prefix
    (resampled at the first rejection, or the bonus token). Python ints: the loop reads them as such."""

    accepted_lengths: list[int]
    next_tokens: list[int]


def verify_chains(p_block: Any, q_block: Any, drafts: Sequence[Sequence[int]], rule: AcceptanceRule,
                  rngs: Sequence[np.random.Generator], draws: Any) -> ChainOutcomes:
    """Cool-SD Alg. 1 lines 4-17 for every image of a batch: accept x̃_i while r_i ≤ f_i; at the first
    rejection sample G_i; if all of an image's drafts are accepted its next token is the head's
    draw from its P_{L+1} (the bonus token).

    p_block [images, ≥ L+1, V] with draws [images, ≥ L+1], the target step's rows and the head's
    draw from each: image b's row i predicts its draft i + 1, and draws[b, L_b] is its bonus token.
    q_block [L, images, V]: row (i, b) is the draft distribution image b's draft i + 1 was drawn
    from (one draft pass per position, over the batch; rows_by_position builds it from per-image
    lists). Chains may differ in length, down to none (the bonus token, no uniforms drawn); rows
    past an image's own chain are never used. Rows may be device-resident (`gather`).

    As array operations over the batch padded to the longest chain L: P and Q at the drafted tokens
    (and whatever else the rule's f reads, rule.columns) in one gather each, every f_i at once, the
    first rejection per image as the count of leading passes; then the resampling rows of the
    rejected images only, as one [R, V] block sampled by inverse CDF. The only whole rows read are
    the two of each rejection.

    Random streams: image b draws L_b + 1 uniforms from rngs[b] up front (L_b tests, then the draw
    from G at a rejection), so what it consumes depends on its own chain alone and an image is the
    same alone or in any batch. As exact as testing position by position with fresh uniforms: the
    tests' uniforms are independent, and the resampling uniform is independent of them.

    A batch of one image on host rows goes position by position instead (_verify_one_chain); device
    rows (the PyTorch backend's DeviceRows) are verified here like host rows, the tested entries
    gathered and a rejection's rows read back. The device round verifies where the rows live
    instead, with verify_chain_block.
    """
    if len(drafts) == 1 and isinstance(p_block, np.ndarray) and isinstance(q_block, (np.ndarray, type(None))):
        return _verify_one_chain(p_block, q_block, drafts[0], rule, rngs[0], draws)
    count, sizes = len(drafts), [len(chain) for chain in drafts]
    lengths, images = np.array(sizes, dtype=np.int64), np.arange(count)
    longest = max(sizes, default=0)
    if longest == 0:
        return ChainOutcomes([0] * count, np.asarray(draws)[images, lengths].tolist())
    tokens = np.array([[*chain, *[0] * (longest - len(chain))] for chain in drafts], dtype=np.int64)  # pads: 0
    uniforms = np.zeros((count, longest + 1))
    for size, rng, row in zip(sizes, rngs, uniforms):
        if size:
            rng.random(out=row[: size + 1])
    next_tokens = np.asarray(draws)[images, lengths].astype(np.int64, copy=False)  # bonus tokens; rejections below
    steps = np.arange(longest)
    q_at, p_at = gathers((q_block, (steps, images[:, None], tokens)),  # [images, L]
                         (p_block, (images[:, None, None], steps[:, None], rule.columns(tokens))))  # [images, L, c]
    passed = np.zeros((count, longest + 1), dtype=bool)  # a failed test after the last: argmin finds one
    np.less_equal(uniforms[:, :longest], rule.accept_probabilities(p_at, q_at, steps + 1), out=passed[:, :longest])
    accepted = np.minimum(passed.argmin(axis=1), lengths)  # leading passes within the chain: τ
    rejected = np.flatnonzero(accepted < lengths)
    if rejected.size:
        at = accepted[rejected]
        p_rows, q_rows = gathers((p_block, (rejected, at)), (q_block, (at, rejected)))  # [R, V]: a rejection's two rows
        resampled = rule.resample(p_rows, q_rows, tokens[rejected, at], at + 1)
        next_tokens[rejected] = inverse_cdf(resampled, uniforms[rejected, lengths[rejected]])
    return ChainOutcomes(accepted.tolist(), next_tokens.tolist())


def verify_chain_block(p: Any, q: Any, drafted: Any, limits: Any, coins: Any, next_uniforms: Any,
                       rule: AcceptanceRule) -> tuple[Any, Any]:
    """verify_chains as the device round runs it: every image's chain at once, in the rows' own array
    library, with no array shape that depends on an outcome (finding the rejected images would make
    the host wait). (accepted τ [I], next token [I]).

    p [I, L + 1, V]: row j predicts draft j + 1 (row L the bonus position); q [I, L, V] the rows the
    drafts drafted [I, L] were drawn from; limits [I]: how many of an image's drafts may count (fewer
    near the image's end, 0 for none); coins [I, L] the tests' uniforms, next_uniforms [I] the one
    draw after the accepted prefix. Every image's pair of rows at its first failed test is resampled
    from rule.resample and its bonus row drawn from, and the one that applies is kept: the same
    tests and draws as verify_chains makes with the same uniforms (tests/runtime/test_verification.py)."""
    xp = namespace(p)
    count, longest = drafted.shape
    images, steps = xp.arange(count, device=p.device), xp.arange(longest, device=p.device)
    q_at = xp.astype(q[images[:, None], steps, drafted], xp.float64)  # [I, L]
    p_at = xp.astype(p[images[:, None, None], steps[:, None], rule.columns(drafted)], xp.float64)  # [I, L, c]
    passed = (coins <= rule.accept_probabilities(p_at, q_at, steps + 1)) & (steps < limits[:, None])
    accepted = xp.sum(xp.astype(xp.cumulative_sum(xp.astype(~passed, xp.int64), axis=1) == 0, xp.int64), axis=1)
    stop = xp.minimum(accepted, longest - 1)
    resampled = inverse_cdf(rule.resample(p[images, stop], q[images, stop], drafted[images, stop], stop + 1),
                            next_uniforms)
    bonus = inverse_cdf(p[images, accepted], next_uniforms)
    return accepted, xp.where(accepted < limits, resampled, bonus)


def _verify_one_chain(p_block: np.ndarray, q_block: Optional[np.ndarray], chain: Sequence[int], rule: AcceptanceRule,
                      rng: np.random.Generator, draws: np.ndarray) -> ChainOutcomes:
    """verify_chains for a batch of one image on host rows: the same uniforms, tests and
    resampling, position by position in Python floats (rule.accept_probability, the tree
    siblings' test; a rule without scalar_tests evaluates the chain's f in one block). Between
    two graph runs the caches are cold and each distinct numpy call costs 5-15 us, several times
    its warm cost; the batch path's twenty-odd calls were half of a batch-1 round's host work.
    Identical outcomes: tests/runtime compare it with the batch path and the per-position
    definition."""
    size = len(chain)
    if size == 0:
        return ChainOutcomes([0], [int(draws[0, 0])])
    uniforms = rng.random(size + 1).tolist()  # as the batch path: L tests, then the resampling draw
    p_rows, q_rows = p_block[0], q_block[:, 0]
    if not rule.scalar_tests:  # f of every position in one block evaluation (a rule without a scalar test)
        steps, tokens = np.arange(size), np.array(chain)
        f = rule.accept_probabilities(gather(p_rows, (steps[:, None], rule.columns(tokens))),
                                      gather(q_rows, (steps, tokens)), steps + 1).tolist()
    for i, token in enumerate(chain):
        p, q = p_rows[i], q_rows[i]
        if uniforms[i] > (rule.accept_probability(p, q, token, i + 1) if rule.scalar_tests else f[i]):
            # G from the two rows as they are (float32 from a graph): every rule's resample computes
            # in float64, as it does for the batch path's [R, V] block, so the bits are the same
            resampled = rule.resample(p, q, token, i + 1)
            return ChainOutcomes([i], [inverse_cdf(resampled, uniforms[size])])
    return ChainOutcomes([size], [int(draws[0, size])])


def rows_by_position(rows: Sequence[Sequence[Any]]) -> Any:
    """Per-image sequences of draft rows (rows[b][i]: image b's draft i + 1; a list, or one host
    block [L, V], which a batch of one image uses as it is) as verify_chains' q_block
    [L, images, V], stacked where the rows live (stack_rows); a shorter chain is padded with a row
    that is never read. None when no image drafted."""
    longest = max(map(len, rows), default=0)
    if longest == 0:
        return None
    if len(rows) == 1 and isinstance(rows[0], np.ndarray):  # one image's rows as one block [L, V]: a view
        return rows[0][:, None]
    if len(rows) == 1 and all(isinstance(row, np.ndarray) for row in rows[0]):  # one image's host rows: one stack
        return stack_rows(rows[0])[:, None]
    filler = next(row for chain in rows for row in chain)
    by_position = [[chain[i] if i < len(chain) else filler for chain in rows] for i in range(longest)]
    if not any(hasattr(type(row), "stack_rows") for chain in rows for row in chain):  # host rows: one C-level copy
        return np.array(by_position)
    return stack_rows([stack_rows(block) for block in by_position])


def by_position(block: Any, count: int) -> Any:
    """One pass's rows [images, ≥ count, V] (a draft chain's: image b's draft i + 1 drawn from row
    (b, i)) as verify_chains' q_block [count, images, V]: a view of a host array, stacked where
    the rows live otherwise (stack_rows)."""
    if isinstance(block, np.ndarray):
        return block[:, :count].swapaxes(0, 1)
    return stack_rows([block[:, i] for i in range(count)])


def _gathers_in_place(block: Any) -> bool:
    """A host array, or a device view that gathers where it lives (it has a `stack_rows`, as the
    torch backend's DeviceRows: advanced indexing runs on the device)."""
    return isinstance(block, np.ndarray) or hasattr(type(block), "stack_rows")


def take(block: Any, index: tuple) -> Any:
    """block[index] for integer arrays that broadcast together (entries, or rows when the index
    names fewer axes than the block has), kept where the block lives when it gathers in place (a
    copy either way: later steps may reuse the block's buffer); other views (TensorRT's
    DeviceProbs, which reads a whole view for any array index) are read one entry or row at a time
    to the host, never a whole block (a slice in the index: what it names, read once)."""
    if _gathers_in_place(block):
        return block[index]
    if any(isinstance(part, slice) for part in index):  # whole rows (host_rows): the view read once
        return np.asarray(block[index])
    arrays = np.broadcast_arrays(*[np.asarray(part) for part in index])
    out = np.empty(arrays[0].shape + tuple(block.shape[len(index):]))
    for at in np.ndindex(*arrays[0].shape):
        out[at] = block[tuple(int(part[at]) for part in arrays)]
    return out


def gather(block: Any, index: tuple) -> np.ndarray:
    """take(block, index) on the host as float64: for device rows the gathered numbers alone cross,
    in one transfer."""
    return np.asarray(take(block, index), dtype=np.float64)


def gathers(*pairs: tuple[Any, tuple]) -> list[np.ndarray]:
    """gather(block, index) of each (block, index) pair. Where a block's backend gathers several
    at once (its `gather_all` classmethod, as the torch backend's DeviceRows has), all go there:
    on a GPU, a round's P and Q entries, or a rejection's two rows, then cost one index copy and
    one read back (two synchronisations) instead of one of each per block."""
    together = next((type(block).gather_all for block, _ in pairs if hasattr(type(block), "gather_all")), None)
    if together is not None:
        return together(pairs)
    return [gather(block, index) for block, index in pairs]


def verify_position(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator,
                    entries: Optional[tuple[float, float]] = None) -> tuple[bool, int]:
    """One lossless rejection-sampling test (SJD, SJD-PAC): keep x̃ with min(1, p/q), else Norm([p − q]_+).
    `entries`: P(x̃) and Q(x̃) when the caller read them ahead (device rows, a whole chain's at once)."""
    return read_in_waves({0: position_walk(p, q, token, rng, entries)})[0]


def position_walk(p: Any, q: Any, token: int, rng: np.random.Generator,
                  entries: Optional[tuple[float, float]] = None) -> Generator[list, list, tuple[bool, int]]:
    """verify_position as a walk (read_in_waves): a rejection asks for the two rows whole where
    either is not on the host."""
    if rng.random() <= acceptance(*(entries if entries is not None else (p[token], q[token]))):
        return True, int(token)
    rows = [p, q] if isinstance(p, np.ndarray) and isinstance(q, np.ndarray) else (yield [_whole(p), _whole(q)])
    return False, int(sample(residual(*rows), rng))


def host_rows(*rows: Any) -> list[np.ndarray]:
    """Whole rows on the host: host arrays as they are, device rows read back together (one transfer)."""
    if all(isinstance(row, np.ndarray) for row in rows):
        return list(rows)
    return gathers(*[(row, (slice(None),)) for row in rows])


def stack_rows(rows: Sequence[np.ndarray]) -> np.ndarray:
    """n rows [V] as one block [n, V] that can be indexed like numpy.

    When some rows are device-resident views (a backend's `stack_rows` classmethod, e.g. the torch
    backend's DeviceRows) the block is stacked on the device, so reading one entry of each row is
    one transfer instead of n: on a GPU each transfer is a synchronisation."""
    backend = next((type(r) for r in rows if hasattr(type(r), "stack_rows")), None)
    if backend is not None:
        return backend.stack_rows(rows)
    return np.array([np.asarray(r) for r in rows])  # one C-level copy (np.stack reshapes each row in Python)


def verify_positions(p_block: np.ndarray, q_rows: Sequence[np.ndarray], tokens: Sequence[int],
                     rng: np.random.Generator) -> list[int]:
    """verify_position at several independent positions at once (SJD-PAC's adaptive continuation
    re-tests every stale draft against its new row): the kept or resampled token of each.

    p_block [n, V] holds the new rows (one gather from the step's output), q_rows the n old
    ones (stacked once, stack_rows). Each position uses its own uniforms, so this is the same
    test; only the tokens' entries are read until the rejected positions' residuals are formed
    and sampled as one [R, V] block instead of R small host calls.

    Random stream: 2n uniforms up front, n tests then position i's resampling draw (used where it
    is rejected), so what a call consumes does not depend on its outcomes.
    """
    return read_in_waves({0: positions_walk(p_block, np.arange(len(tokens)), q_rows, tokens, rng)})[0]


def positions_walk(p_rows: Any, slots: np.ndarray, q_rows: Sequence[Any], tokens: Sequence[int],
                   rng: np.random.Generator) -> Generator[list, list, list[int]]:
    """verify_positions as a walk (read_in_waves) over the new rows p_rows[slots] (on device rows
    indexed inside the reads: no index copy of their own): host rows are read in place; device rows
    ask for the tokens' entries, then for the rejected positions' rows."""
    count = len(tokens)
    uniforms = rng.random(2 * count)  # n tests, then each position's resampling draw
    index = np.arange(count), np.asarray(tokens)
    on_host = isinstance(p_rows, np.ndarray) and all(isinstance(row, np.ndarray) for row in q_rows)
    # host rows: read q at each token in place and copy only the rejected rows below; device rows
    # (DeviceRows): one stacked block, read with P's (one request: one transfer each way)
    q_block = None if on_host else stack_rows(q_rows)
    if not on_host and _verifies_in_place(p_rows, q_block):
        return (yield from _positions_in_place(p_rows, slots, q_block, index[1], uniforms))
    if on_host:
        p_at = np.asarray(p_rows[slots, index[1]], dtype=np.float64)
        q_at = np.array([row.item(t) for row, t in zip(q_rows, tokens)], dtype=np.float64)
    else:
        p_at, q_at = yield [(p_rows, (slots, index[1])), (q_block, index)]
    out = [int(t) for t in tokens]
    rejected = np.flatnonzero(uniforms[:count] > acceptance(p_at, q_at))
    if rejected.size:
        if on_host:  # np.array copies a list of rows in C, where np.stack reshapes each row in Python first
            p_rejected = np.asarray(p_rows[slots[rejected]], dtype=np.float64)
            q_rejected = np.array([q_rows[i] for i in rejected])
        else:
            p_rejected, q_rejected = yield [(p_rows, (slots[rejected],)), (q_block, (rejected,))]
        drawn = draw_masses(residual_mass(p_rejected, q_rejected), p_rejected, uniforms[count + rejected])
        for i, token in zip(rejected.tolist(), drawn.tolist()):
            out[i] = token
    return out


def _verifies_in_place(*blocks: Any) -> bool:
    """Blocks whose backend computes where they live (a `send` to their device and a `receive`
    from it, as the torch backend's DeviceRows has), all of one kind."""
    kinds = {type(block) for block in blocks}
    return len(kinds) == 1 and hasattr(next(iter(kinds)), "send")


def _positions_in_place(p_rows: Any, slots: np.ndarray, q_block: Any, tokens: np.ndarray,
                        uniforms: np.ndarray) -> Generator[list, list, list[int]]:
    """positions_walk where the rows live (the host loop's SJD-PAC on a GPU): slots, tokens and
    uniforms go there in one copy, retest_block runs there, and the walk asks for the n tokens alone,
    where reading back would cost each rejected position's two whole rows."""
    count = len(tokens)
    sent = p_rows.send(np.concatenate([slots, tokens, uniforms]).astype(np.float64), "continuation")
    xp = namespace(sent)
    ints = xp.astype(sent[: 2 * count], xp.int64)  # slots and token ids are exact in float64
    at, drafted, u = ints[:count], ints[count:], sent[2 * count:]
    out = retest_block(p_rows.array[at], q_block.array, drafted, u[:count], u[count:])
    return (yield [(p_rows.holding(out), (slice(None),))])[0].astype(np.int64).tolist()


def retest_block(p: Any, q: Any, drafted: Any, coins: Any, draw_uniforms: Any) -> Any:
    """verify_positions as the device round runs it (SJD-PAC's adaptive continuation): each old draft
    drafted [R] re-tested against its new row p [R, V] with the row q [R, V] it was drawn from, kept
    where coins [R] pass, else drawn from Norm([p − q]_+) with draw_uniforms [R]. Every row's residual
    is drawn and the applicable token kept: no shape depends on an outcome."""
    xp = namespace(p)
    rows = xp.arange(drafted.shape[0], device=p.device)
    kept = coins <= acceptance(p[rows, drafted], q[rows, drafted])
    drawn = draw_masses(residual_mass(p, q), p, draw_uniforms)
    return xp.where(kept, drafted, xp.astype(drawn, xp.int64))


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
    caller already holds a draw from q (SJD-PAC keeps its adaptive-continuation token there, and
    keeps it even from a row without mass). One row of draws_without_replacement."""
    if first is None:
        return draws_without_replacement([q], [count], rng)[0]
    return draws_without_replacement([q], [count], rng, [first])[0] or [int(first)]


def draws_without_replacement(rows: Any, counts: Sequence[int], rng: np.random.Generator,
                              firsts: Optional[Sequence[int]] = None) -> list[list[int]]:
    """draw_without_replacement(rows[r], counts[r], rng) for each row in turn (a tree level's nodes):
    min(counts[r], support) distinct candidates of row r, candidate k the inverse CDF of q^(k), the
    row without candidates 1..k − 1 (Eq. 7), not renormalised: its uniform is scaled by the mass
    left instead; a row whose mass runs out (≤ 1e-12 left) stops, so a row's support caps its
    candidates (no uniform is drawn for the rest). `firsts[r]`, where given, is candidate 1 of row
    r, a draw from q the caller holds (the draft head's, made with its own uniform in the pass
    that computed the row): no host uniform or search for it, and no CDF at all for a level
    whose rows want one candidate each (a narrow planned tree's).

    Every row's CDF is made once, in one block operation; q^(k)'s CDF is never formed: it is the
    row's CDF less the masses of the candidates at or before each entry, so a draw is a binary
    search of the row's CDF (_search_without). Recomputing the CDF's tail after each candidate cost
    a pass over V per candidate: at LlamaGen's V = 16384 a level of 4 rows and 11 candidates took
    464 µs that way and takes 259 µs now (of which 228 µs is the four rows' one cumsum)."""
    if firsts is not None and max(counts, default=0) <= 1:  # one child each: the held draws
        return [[int(first)] if count and np.asarray(row).sum() > 1e-12 else []
                for row, count, first in zip(rows, counts, firsts)]
    # [R, V]; a float64 copy first: cumsum casting float32 rows as it goes is ~3x slower (numpy 1.26);
    # entries are read from the copy (the same numbers): device rows are read back once, stacked
    if not isinstance(rows, np.ndarray) and not all(isinstance(row, np.ndarray) for row in rows):
        rows = stack_rows(rows)
    rows = np.asarray(rows, dtype=np.float64)  # a copy unless the caller's block is float64 already
    cdf = rows.cumsum(axis=1)
    random = rng.random
    picked: list[list[int]] = []
    for r, (row, row_cdf, total, count) in enumerate(zip(rows, cdf, cdf[:, -1].tolist(), counts)):
        if total <= 1e-12 or not count:
            picked.append([])
            continue
        # nothing drawn yet: the held draw, or the row's own inverse CDF
        tokens = [int(firsts[r]) if firsts is not None else draw_from_cdf(row_cdf, random())]
        if count > 1:
            drawn = [(tokens[0], float(row[tokens[0]]))]  # (candidate, its mass in q), in draw order
            left = total - drawn[0][1]
            while left > 1e-12 and len(tokens) < count:
                token = _search_without(row, row_cdf, random() * left, drawn)
                tokens.append(token)
                drawn.append((token, float(row[token])))
                left = total - sum(m for _, m in drawn)
        picked.append(tokens)
    return picked


def _search_without(row: np.ndarray, cdf: np.ndarray, target: float, drawn: Sequence[tuple[int, float]]) -> int:
    """The inverse CDF of `row` (q, its CDF `cdf`) without the `drawn` candidates at `target` (an
    unnormalised u·mass): the first entry i whose CDF without them, cdf[i] − Σ_{c ≤ i} q_c, exceeds
    target, capped at V − 1 (with nothing drawn, sampling.draw_from_cdf's search).

    A search of cdf at target + the mass removed below the last answer finds it: the answer only
    moves right, each move past a drawn candidate adds that mass, so it settles within
    len(drawn) + 1 searches. Rounding that lands on a drawn candidate (a zero-mass entry; ~1e-16)
    falls back to the CDF recomputed without them."""
    shift = 0.0
    while True:
        token = int(cdf.searchsorted(target + shift, side="right"))
        below = sum(m for c, m in drawn if c <= token)
        if below == shift:
            break
        shift = below
    token = min(token, len(cdf) - 1)
    if any(c == token for c, _ in drawn):
        rest = np.array(row, dtype=np.float64)
        rest[[c for c, _ in drawn]] = 0.0
        fresh = np.cumsum(rest)
        token = min(int(fresh.searchsorted(target, side="right")), len(cdf) - 1)
    return token


def verify_siblings(p: np.ndarray, q: np.ndarray, candidates: Sequence[int],
                    rng: np.random.Generator) -> tuple[Optional[int], int]:
    """Sequential rejection sampling over candidates c_1..c_K drawn without replacement from q.

    Candidate k is tested against the residual target p^(k) with the adjusted draft q^(k)
    (p^(1) = p, p^(k+1) = Norm([p^(k) − q^(k)]_+)); returns (index accepted or None, token).
    On total rejection the token is drawn from p^(K+1). Exact for any K (SJD-PAC Theorem 2).
    """
    return verify_candidates(p, candidate_proposals(q, candidates, SAMPLED), VANILLA, 1, rng)


def siblings_walk(p: Any, q: np.ndarray, candidates: Sequence[int],
                  rng: np.random.Generator) -> Generator[list, list, tuple[Optional[int], int]]:
    """verify_siblings as a walk (read_in_waves): a device row `p` is read whole at the first rejection."""
    return (yield from _candidates(p, candidate_proposals(q, candidates, SAMPLED), VANILLA, 1, rng))


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
    each step). With K = 1 it is one position of verify_chains. The relaxed rules are applied the
    same way, to the current residual p^(k) at every sibling: neither the Cool-SD paper nor
    LANTERN's defines multi-candidate verification; LANTERN's code (evaluate_posterior, _v1)
    likewise computes the relaxed p̃ on the residual at each sibling. Cool-SD's ω is that of the
    siblings' depth (draft position `position`, 1-based).
    """
    return read_in_waves({0: _candidates(p, proposals, rule, position, rng)})[0]


def _candidates(p: Any, proposals: Iterable[tuple[int, np.ndarray]], rule: AcceptanceRule, position: int,
                rng: np.random.Generator) -> Generator[list, list, tuple[Optional[int], int]]:
    """verify_candidates as a walk (read_in_waves): where `p` is not a host row (entries read ahead,
    a device row) it is only indexed for the tests' entries, and the whole row, which the residual
    needs, is asked for at the first rejection; a host row asks for nothing."""
    target = p
    for k, (token, q) in enumerate(proposals):
        if rng.random() <= rule.accept_probability(target, q, token, position):
            return k, int(token)
        if not isinstance(target, np.ndarray):
            target = (yield [_whole(target)])[0]
        target = rule.resample(target, q, token, position)
    return None, int(sample(np.asarray(target), rng))


def _whole(row: Any) -> tuple[Any, tuple]:
    """A read request (read_in_waves) for the whole of `row` (of entries read ahead: of the row they
    come from): no index array to send."""
    return (row.row if isinstance(row, _RowEntries) else row), (slice(None),)


def read_in_waves(walks: dict[Any, Generator]) -> dict[Any, Any]:
    """Run walks that read what they need of device rows by yielding read requests (lists of
    (block, index) pairs, as `gathers` takes them) and are sent the host arrays; each walk's return
    value, by key. The requests of every walk still running go in one `gathers` call a wave, so
    the images of a batch read together (on device rows: one index copy and one read back) what
    each would read alone, while each runs its own code with its own stream."""
    results: dict[Any, Any] = {}
    asking: dict[Any, list] = {}

    def advance(key: Any, answer: Optional[list]) -> None:
        try:
            asking[key] = next(walks[key]) if answer is None else walks[key].send(answer)
        except StopIteration as done:
            results[key] = done.value

    for key in walks:
        advance(key, None)
    while asking:
        waiting, asking = asking, {}
        read = gathers(*[pair for requests in waiting.values() for pair in requests])
        at = 0
        for key, requests in waiting.items():
            advance(key, read[at:at + len(requests)])
            at += len(requests)
    return results


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
    the rows of a rejection's residual are read. verify_trees does a round's images together.
    """
    return read_in_waves({0: _tree_walk(p_rows, tree, rule, rng, bonus)})[0]


def verify_trees(p_block: Any, trees: Sequence[Optional[Any]], rule: AcceptanceRule,
                 rngs: Sequence[np.random.Generator], bonus: Any) -> list[Optional[TreeOutcome]]:
    """verify_tree for each image p of a round (trees[p]; None: no tree, no outcome) with p_block[p]
    its rows and bonus[p] its draws, each image with its own stream, the same outcomes.

    What the batch reads of device rows (a backend that gathers several blocks at once: the torch
    backend's DeviceRows) goes in a few transfers for all images instead of a few per image and
    node: the images walk their trees in lockstep (read_in_waves), first asking for the entries
    every node's children are tested at (rule.columns of their tokens: one gather for the batch),
    then for the whole rows their rejections need (a wave per depth at most). Host rows are read
    where they are."""
    ahead = not isinstance(p_block, np.ndarray) and hasattr(type(p_block), "gather_all")
    outcomes = read_in_waves({p: _tree_walk(p_block[p], tree, rule, rngs[p], bonus[p], ahead)
                              for p, tree in enumerate(trees) if tree is not None})
    return [outcomes.get(p) for p in range(len(trees))]


def _tree_walk(p_rows: Any, tree: Any, rule: AcceptanceRule, rng: np.random.Generator, bonus: Any,
               ahead: bool = False) -> Generator[list, list, TreeOutcome]:
    """verify_tree's walk (read_in_waves) over p_rows [W, V] (host or device rows). `ahead`: first ask
    for the entries each node's children are tested at, which then stand for the rows in the tests."""
    entries = (yield from rows_ahead(p_rows, {
        node: np.unique(rule.columns(np.array([tree.tokens[c] for c in kids]))).tolist()
        for node, kids in enumerate(tree.children) if kids})) if ahead else {}
    node, path, accepted = 0, [0], []
    while tree.children[node]:
        kids = tree.children[node]
        proposals = candidate_proposals(tree.rows.get(node), [tree.tokens[c] for c in kids], tree.drawn,
                                        p_rows.shape[-1])
        row, position = entries.get(node, p_rows[node]), tree.depths[node] + 1
        if isinstance(row, np.ndarray):  # a host row: nothing to ask for
            index, token = verify_candidates(row, proposals, rule, position, rng)
        else:
            index, token = yield from _candidates(row, proposals, rule, position, rng)
        if index is None:
            return TreeOutcome(path, accepted, token)
        node = kids[index]
        path.append(node)
        accepted.append(token)
    return TreeOutcome(path, accepted, int(bonus[node]))


class _RowEntries:
    """Entries of one target row read ahead (column -> P), indexed like the row by a token or an
    array of tokens: what a node's first tests read; a column not read ahead raises KeyError (a
    rule whose test reads more than its `columns`). `row`: the row they come from, read whole at a
    rejection."""

    def __init__(self, row: Any) -> None:
        self.row = row
        self.values: dict[int, float] = {}

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            return self.values[int(index)]
        tokens = np.asarray(index)
        return np.array([self.values[int(t)] for t in tokens.reshape(-1)]).reshape(tokens.shape)


def rows_ahead(p_rows: Any, wanted: dict[int, Sequence[int]]) -> Generator[list, list, dict[int, _RowEntries]]:
    """A walk (read_in_waves) asking, in one request, for p_rows[slot] at the columns `wanted` names
    for each slot: per slot, those entries standing for the row in a test (read whole, through the
    row itself, at a rejection)."""
    slots = [slot for slot, columns in wanted.items() for _ in columns]
    columns = [column for slot_columns in wanted.values() for column in slot_columns]
    if not columns:
        return {}
    values = (yield [(p_rows, (np.array(slots), np.array(columns)))])[0].tolist()
    ahead: dict[int, _RowEntries] = {}
    for slot, column, value in zip(slots, columns, values):
        if slot not in ahead:
            ahead[slot] = _RowEntries(p_rows[slot])
        ahead[slot].values[column] = value
    return ahead


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
