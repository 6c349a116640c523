"""The acceptance rules: what one drafted position is verified with (SD, Cool-SD, LANTERN).

A rule bundles a method's f_i and G_i from runtime.verification.formulas, so every verification
routine (chains, siblings, trees, the device rounds) tests any method's drafts the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from specrt.runtime.arrays import Constants, as_array, is_host, namespace
from specrt.runtime.verification.formulas import (
    acceptance, g_star, lantern_columns, lantern_kept_prefix, lantern_moved_target, lantern_relaxed,
    lantern_relaxed_mass, normalise, residual,
)


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
    `reads_rows`: f(x̃) reads whole rows (GSD's cluster follows the ranking of P, so no fixed
    columns hold it): the verifiers call accept_rows(P rows, Q rows, x̃, i) instead of gathering columns.
    """

    scalar_tests = False
    reads_rows = False

    def columns(self, tokens: Any) -> np.ndarray:
        return (np.asarray(tokens) if is_host(tokens) else tokens)[..., None]

    def accept_probabilities(self, p_at: np.ndarray, q_at: np.ndarray, positions: Any) -> np.ndarray:
        raise NotImplementedError

    def acceptance_row(self, p: np.ndarray, q: np.ndarray, position: Any) -> np.ndarray:
        raise NotImplementedError

    def accept_rows(self, p: Any, q: Any, tokens: Any, positions: Any) -> Any:
        """f_i(x̃) from whole rows p, q [..., V] and tokens [...] (a rule with `reads_rows`)."""
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
        largest host cost. Equal to that form up to rounding (tests/runtime/test_verification_rules.py)."""
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
        return acceptance(token_mass + lantern_kept_prefix(token_mass, neighbour_mass, self.tvd_budget, self.ratio)[1],
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
