"""The per-token formulas of the speculative methods, each written once: normalisation,
acceptance, residuals, Cool-SD's G* and relaxation schedules, LANTERN's latent-neighbour relaxation.

Rows are float64 probability vectors over the vocabulary, produced by runtime.sampling (CFG,
temperature, top-k, top-p applied identically to P and Q); every function here works on host rows
and, where the rows live on a device, in their own array library (runtime.arrays).

Notation as in the Cool-SD paper: P target row, Q draft row, x̃ the drafted token,
f the acceptance probability, ω the relaxation weight, δ the relaxation budget.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.arrays import as_array, is_host, namespace
from specrt.runtime.sampling import draws_from_cdf


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
    `lantern_kept_prefix` sums one token's in Python floats, so both give the same bits.
    """
    xp = namespace(neighbour_mass)
    cumulative = xp.cumulative_sum(neighbour_mass, axis=-1)
    limit = tvd_budget if tvd_budget is not None else (ratio - 1.0) * xp.asarray(token_mass)[..., None]
    kept = cumulative <= limit
    if cumulative.shape[-1] == 0:  # no neighbours: nothing kept
        return kept, xp.zeros(cumulative.shape[:-1], dtype=cumulative.dtype)
    return kept, xp.max(xp.where(kept, cumulative, 0.0), axis=-1)


def lantern_kept_prefix(token_mass: float, neighbour_mass: Sequence[float], tvd_budget: Optional[float],
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
    token (a batch-1 rejection) finds the kept prefix in Python floats (lantern_kept_prefix), the same
    numbers as the block's. `neighbours` where p lives."""
    xp = namespace(p)
    moved = np.array(p, dtype=np.float64) if is_host(p) else xp.astype(p, xp.float64, copy=True)
    if moved.ndim == 1 and is_host(moved):
        token = int(tokens)
        nearest = neighbours[token]
        count, kept_mass = lantern_kept_prefix(moved.item(token), moved[nearest].tolist(), tvd_budget, ratio)
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
