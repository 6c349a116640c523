"""Decoding methods of the continuous family: `ar` (the target alone) and `cspd` (paper 002).

They mirror methods/base.py's shape (PARAMS checked by specrt.validation, `generate(ctx,
class_ids)`), but return continuous tokens [N, seq_len, C] and drive ContinuousRunners; the
formulas are runtime/continuous.py's. One image at a time (the discrete methods decode whole batches; this family does not yet).
"""
from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime import continuous
from specrt.runtime.continuous_runner import ContinuousRunner
from specrt.runtime.methods.base import Method
from specrt.validation import Float, Int, number

MAX_DRAFT = 256


@dataclass
class ContinuousStats:
    """Counters of one generate call: what speed-up and acceptance are computed from."""

    tokens: int = 0
    target_passes: int = 0          # target transformer steps
    drafted: int = 0
    accepted: int = 0
    residual_proposals: int = 0     # target chains drawn by the acceptance-rejection loop

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0


@dataclass
class ContinuousDecoding:
    """The models, temperature, random stream and counters of one generate call."""

    target: ContinuousRunner
    draft: Optional[ContinuousRunner]
    rng: np.random.Generator
    temperature: float = 1.0
    cfg_scale: float = 1.0
    cfg_schedule: str = "constant"   # MAR's: "constant" or "linear" (continuous.cfg_scales)
    stats: ContinuousStats = field(default_factory=ContinuousStats)

    def __post_init__(self) -> None:
        self.temperature = number("temperature", self.temperature, low=0, low_open=True)
        self.cfg_scale = number("cfg_scale", self.cfg_scale, low=0)
        if self.cfg_schedule not in continuous.CFG_SCHEDULES:
            raise SpecrtError(f"cfg_schedule must be one of {', '.join(continuous.CFG_SCHEDULES)}, "
                              f"got {self.cfg_schedule!r}")
        if self.draft is not None:
            t, d = self.target.spec, self.draft.spec
            same_chain = np.array_equal(t.diffusion().betas, d.diffusion().betas)
            if not same_chain or (t.token_dim, t.seq_len) != (d.token_dim, d.seq_len):
                raise SpecrtError("draft and target must share token_dim, seq_len and the diffusion schedule "
                                  f"(target {t.token_dim}/{t.seq_len}/{t.schedule}:{t.diffusion_steps}, "
                                  f"draft {d.token_dim}/{d.seq_len}/{d.schedule}:{d.diffusion_steps})")

    def start(self, runner: ContinuousRunner, class_id: int) -> None:
        """Begin an image on `runner`: empty cache, the CFG rows this call samples with."""
        runner.start(class_id, self.cfg_scale)

    def scales(self, positions) -> Optional[np.ndarray]:
        """Guidance scales [R] of the token positions sampled or scored together (None: the
        image's constant scale). Both models get the same scales at the same positions."""
        if self.cfg_schedule == "constant" or self.cfg_scale == 1.0:
            return None
        return continuous.cfg_scales(self.cfg_scale, self.cfg_schedule, positions, self.target.spec.seq_len)

    def noise(self, rows: int) -> np.ndarray:
        spec = self.target.spec
        return continuous.draw_noise(self.rng, rows, spec.token_dim, spec.diffusion_steps)


class ContinuousMethod(Method):
    """A decoding strategy for continuous models: PARAMS parsed as every Method's, but the
    context is a ContinuousDecoding and the result continuous tokens."""

    def generate(self, ctx: ContinuousDecoding, class_ids: np.ndarray) -> np.ndarray:  # type: ignore[override]
        """Continuous tokens [N, seq_len, C] for these class ids."""
        if self.needs_draft and ctx.draft is None:
            raise SpecrtError(f"method {self.name!r} needs a draft model")
        return np.stack([self.generate_one(ctx, int(c)) for c in class_ids])

    @abstractmethod
    def generate_one(self, ctx: ContinuousDecoding, class_id: int) -> np.ndarray:
        """Tokens [seq_len, C] of one image."""


def target_token(ctx: ContinuousDecoding, z: np.ndarray, position: int) -> np.ndarray:
    """Token `position` [C] from the target's condition z [B,D] with fresh noise."""
    x0, _ = ctx.target.sample(z[:, None], ctx.noise(1), ctx.temperature, ctx.scales([position]))
    return x0[0]


class ContinuousAR(ContinuousMethod):
    """The target alone: one transformer step and one denoising chain per token."""

    name = "ar"

    def generate_one(self, ctx: ContinuousDecoding, class_id: int) -> np.ndarray:
        spec = ctx.target.spec
        tokens = np.zeros((spec.seq_len, spec.token_dim), dtype=np.float32)
        ctx.start(ctx.target, class_id)
        previous = np.zeros((1, spec.token_dim), dtype=np.float32)  # position 0's input is the class
        for n in range(spec.seq_len):
            z = ctx.target.step(previous)
            ctx.target.commit(1)
            ctx.stats.target_passes += 1
            tokens[n] = target_token(ctx, z[:, -1], n)
            previous = tokens[n : n + 1]
        ctx.stats.tokens += spec.seq_len
        return tokens


class CSpD(ContinuousMethod):
    """Continuous speculative decoding (002 Alg. 1): draft `draft_len` tokens, verify them in one
    target pass with trajectory-aligned density ratios, resample the first rejected token from
    the residual by acceptance-rejection (M = 1/Z), or take a bonus token when all are accepted.
    The first ceil(prefill_ratio · seq_len) tokens come from the target alone (token pre-filling).
    """

    name = "cspd"
    needs_draft = True
    PARAMS = {
        "draft_len": Int(4, low=1, high=MAX_DRAFT, symbol="γ"),
        "prefill_ratio": Float(0.05, low=0.0, high=1.0),
        "residual_batch": Int(4, low=1, high=1024),
    }
    draft_len: int
    prefill_ratio: float
    residual_batch: int

    # Hooks the tests replace to plant known bugs (they must be caught).
    accept_probability = staticmethod(continuous.accept_probability)
    residual_acceptance = staticmethod(continuous.residual_acceptance)

    def verification_noise(self, ctx: ContinuousDecoding, draft_noise: np.ndarray) -> np.ndarray:
        """The noise the target's chains use to score drafted tokens: the draft's own (alignment)."""
        return draft_noise

    def generate_one(self, ctx: ContinuousDecoding, class_id: int) -> np.ndarray:
        spec = ctx.target.spec
        seq_len, channels = spec.seq_len, spec.token_dim
        inputs = np.zeros((seq_len + 1, channels), dtype=np.float32)  # inputs[j + 1] = token j
        target, draft, stats = ctx.target, ctx.draft, ctx.stats
        ctx.start(target, class_id)
        ctx.start(draft, class_id)
        prefilled = min(seq_len, math.ceil(self.prefill_ratio * seq_len))
        n = 0
        while n < seq_len:
            if n < prefilled:
                z = target.step(inputs[target.length : n + 1])
                target.commit(z.shape[1])
                stats.target_passes += 1
                inputs[n + 1] = target_token(ctx, z[:, -1], n)
                n += 1
                continue
            count = min(self.draft_len, seq_len - n)
            # Draft `count` tokens, keeping each one's condition z_q and noise.
            z_draft = np.zeros((len(draft.class_ids), count, draft.spec.hidden), np.float32)
            mean_q = np.zeros((count, channels), np.float32)
            noise = ctx.noise(count)
            for i in range(count):
                z = draft.step(inputs[draft.length : n + i + 1])
                draft.commit(z.shape[1])
                z_draft[:, i] = z[:, -1]
                x0, mean = draft.sample(z[:, -1:], noise[:, i : i + 1], ctx.temperature, ctx.scales([n + i]))
                inputs[n + i + 1], mean_q[i] = x0[0], mean[0]
            drafted = inputs[n + 1 : n + count + 1].copy()
            # One target pass over the pending inputs and the drafts: conditions for n .. n+count.
            start = target.length
            z_target = target.step(inputs[start : n + count + 1])[:, n - start :]
            stats.target_passes += 1
            stats.drafted += count
            # Score every draft on the target's chain with the same noise as the draft's.
            score_noise = self.verification_noise(ctx, noise)
            _, mean_p = target.sample(z_target[:, :count], score_noise, ctx.temperature,
                                      ctx.scales(np.arange(n, n + count)))
            log_p = continuous.last_step_logpdf(drafted, mean_p, target.schedule, ctx.temperature)
            log_q = continuous.last_step_logpdf(drafted, mean_q, target.schedule, ctx.temperature)
            accept = ctx.rng.random(count) < self.accept_probability(log_p, log_q)
            accepted = int(np.argmin(accept)) if not accept.all() else count
            stats.accepted += accepted
            if accepted < count:
                inputs[n + accepted + 1] = self.residual_token(ctx, z_target[:, accepted], z_draft[:, accepted],
                                                               n + accepted)
            elif n + count < seq_len:
                inputs[n + count + 1] = target_token(ctx, z_target[:, count], n + count)
            new_n = min(seq_len, n + accepted + 1)
            target.commit(n + accepted + 1 - start)
            draft.truncate(n + accepted + 1)
            n = new_n
        stats.tokens += seq_len
        return inputs[1:].copy()

    def residual_token(self, ctx: ContinuousDecoding, z_p: np.ndarray, z_q: np.ndarray, position: int) -> np.ndarray:
        # z_p, z_q: [B,D], the two models' conditions (CFG rows) of the rejected position
        """A token from Norm([p − q]_+) by acceptance-rejection with the target as proposal:
        propose x ~ p on fresh noise u, run the draft's chain on the same u, accept with
        α_s = max(0, 1 − q/p). Proposals go `residual_batch` at a time; the first accepted wins."""
        rows = self.residual_batch
        scales = ctx.scales(np.full(rows, position))
        while True:
            noise = ctx.noise(rows)
            x0, mean_p = ctx.target.sample(np.repeat(z_p[:, None], rows, 1), noise, ctx.temperature, scales)
            _, mean_q = ctx.draft.sample(np.repeat(z_q[:, None], rows, 1), noise, ctx.temperature, scales)
            log_p = continuous.last_step_logpdf(x0, mean_p, ctx.target.schedule, ctx.temperature)
            log_q = continuous.last_step_logpdf(x0, mean_q, ctx.target.schedule, ctx.temperature)
            keep = ctx.rng.random(rows) < self.residual_acceptance(log_p, log_q)
            hits = np.flatnonzero(keep)
            ctx.stats.residual_proposals += int(hits[0]) + 1 if len(hits) else rows
            if len(hits):
                return x0[hits[0]]


CONTINUOUS_METHODS: dict[str, type[ContinuousMethod]] = {cls.name: cls for cls in (ContinuousAR, CSpD)}


def make_continuous_method(name: str, **params: Any) -> ContinuousMethod:
    """The strategy object for `name` on a continuous bundle (SpecrtError on mistakes)."""
    if not isinstance(name, str) or name not in CONTINUOUS_METHODS:
        raise SpecrtError(f"unknown method {name!r} for a continuous model; choose one of {', '.join(CONTINUOUS_METHODS)}")
    return CONTINUOUS_METHODS[name](**params)
