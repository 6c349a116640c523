"""Decoding methods of the continuous family: `ar` (the target alone) and `cspd` (paper 002).

They mirror methods/base.py's shape (PARAMS checked by specrt.validation, `generate(ctx,
class_ids)`), but return continuous tokens [N, seq_len, C] and drive ContinuousRunners; the
formulas are runtime/families/continuous/formulas.py's. Like the discrete methods they decode all images of a
call together: every transformer step and every denoising chain runs the unfinished images
at once, each image with its own window and committed length (ragged acceptance), and
finished images leave the batch (methods.base.Batched). Everything random about an image (chain
noise, acceptance coins, residual proposals) is a counter uniform of its seed, its round and the
draw's own coordinates (draws.py), keyed exactly as the device round (rounds.py) keys the same
draw: for a seed both loops give the same tokens, and an image is the same alone or in any batch
(up to float rounding of the batched graphs). One image is a batch of one.
"""
from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

import specrt.runtime.families.continuous.formulas as continuous
from specrt.errors import SpecrtError
from specrt.runtime.counter_random import seed_halves
from specrt.runtime.families.continuous import draws
from specrt.runtime.families.continuous.draws import (DRAFT_NOISE, PROPOSAL_NOISE, PROPOSAL_TEST,
                                                      RESIDUAL_PROPOSALS, TEST)
from specrt.runtime.families.continuous.runner import ContinuousRunner, ContinuousWindows
from specrt.runtime.methods.base import Batched, Method, settings_grid
from specrt.validation import Float, Int, number

MAX_DRAFT = 256


@dataclass
class ContinuousStats:
    """Counters of one generate call: what speed-up and acceptance are computed from.

    `target_passes` counts target transformer steps (graph runs: a step over a batch of 8
    images counts 1); `target_forwards` counts them per image (that step counts 8), so tokens
    per target forward is the per-image figure whatever the batch."""

    tokens: int = 0
    target_passes: int = 0          # target transformer steps (graph runs)
    target_forwards: int = 0        # images those steps advanced, summed
    drafted: int = 0
    accepted: int = 0
    residual_proposals: int = 0     # target chains drawn by the acceptance-rejection loop
    host_syncs: Optional[int] = None  # host reads of device results (counted by the device round's loop)
    round_seconds: float = 0.0      # time inside device rounds (model passes and verification together)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Tokens per target step of one image (accepted drafts + the one the target adds)."""
        return self.tokens / self.target_forwards if self.target_forwards else 0.0


@dataclass(frozen=True)
class DrawRows:
    """Which draws, one row per chain or coin: the image's batch position, the token index the draw
    decides, the image's round and the draw's part (a block of noise, a coin's number) — what
    draws.py keys a number by, besides the image's seed and the kind of draw."""

    images: np.ndarray   # [R] batch positions
    index: np.ndarray    # [R] token indices
    rounds: np.ndarray   # [R] the images' rounds
    part: Any = 0        # an int, or [R]


@dataclass
class ContinuousDecoding:
    """The models, sampling distribution, random coordinates and counters of one generate call.

    `seeds` holds each image's seed, in batch order (one int: a one-image call); `rounds` each
    image's round, which the methods advance as the device round does (draws.py); `retain` keeps
    both in step with the runners when finished images leave.
    """

    target: ContinuousRunner
    draft: Optional[ContinuousRunner]
    seeds: list[int]
    temperature: float = 1.0
    cfg_scale: float = 1.0
    cfg_schedule: str = "constant"   # MAR's: "constant" or "linear" (continuous.cfg_scales)
    stats: ContinuousStats = field(default_factory=ContinuousStats)
    rounds: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if isinstance(self.seeds, (int, np.integer)):
            self.seeds = [self.seeds]
        self.seeds = [int(seed) for seed in self.seeds]
        halves = np.array([seed_halves(seed) for seed in self.seeds], dtype=np.int64).reshape(-1, 2)
        self._seed_low, self._seed_high = halves[:, 0], halves[:, 1]
        self.rounds = np.zeros(len(self.seeds), dtype=np.int64)
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

    def start(self, runner: ContinuousRunner, class_ids: np.ndarray) -> None:
        """Begin the batch on `runner`: empty caches, the CFG rows this call samples with."""
        runner.start(class_ids, self.cfg_scale)

    def scales(self, positions) -> Optional[np.ndarray]:
        """Guidance scales [R] of the token positions sampled or scored together (None: the
        batch's constant scale). Both models get the same scales at the same positions."""
        if self.cfg_schedule == "constant" or self.cfg_scale == 1.0:
            return None
        return continuous.cfg_scales(self.cfg_scale, self.cfg_schedule, positions, self.target.spec.seq_len)

    def rows(self, images: np.ndarray, index: np.ndarray, later_rounds: Any = 0, part: Any = 0) -> DrawRows:
        """Draws of the images at batch positions `images` [R] deciding token indices `index` [R] in
        their current round (plus `later_rounds`: a residual draw's proposals past the first K)."""
        images = np.asarray(images, dtype=np.int64)
        return DrawRows(images, np.asarray(index, dtype=np.int64), self.rounds[images] + later_rounds, part)

    def noise(self, rows: DrawRows, kind: int) -> np.ndarray:
        """The chains' noise [T+1, R, C] of draws `kind` at `rows` (draws.normals, draws.chain_noise)."""
        spec = self.target.spec
        normals = draws.normals(self._seed_low[rows.images], self._seed_high[rows.images], rows.rounds, rows.index,
                                kind, (spec.diffusion_steps + 1) * spec.token_dim, rows.part)
        return draws.chain_noise(normals, spec.diffusion_steps, spec.token_dim)

    def uniforms(self, rows: DrawRows, kind: int) -> np.ndarray:
        """The coins [R] float64 of draws `kind` at `rows`."""
        return draws.uniforms(self._seed_low[rows.images], self._seed_high[rows.images], rows.rounds, rows.index,
                              kind, rows.part)

    def reseed(self, image: int, seed: int) -> None:
        """Batch position `image` holds a new image from its first round on, drawing from `seed`
        (in-flight batching: a finished image's place refilled between rounds)."""
        self.seeds[image] = int(seed)
        self._seed_low[image], self._seed_high[image] = seed_halves(int(seed))
        self.rounds[image] = 0

    def step_target(self, windows: ContinuousWindows) -> np.ndarray:
        """One target step over these windows, counted (stats), as [pairs, N, W, D]."""
        z = self.target.step(windows)
        self.stats.target_passes += 1
        self.stats.target_forwards += self.target.images if isinstance(windows, np.ndarray) else \
            sum(w is not None and len(w) > 0 for w in windows)
        return self.target.by_image(z)

    def retain(self, images: Sequence[int]) -> None:
        """Keep only these images (positions in the batch) in the runners, seeds and rounds."""
        for runner in (self.target, self.draft):
            if runner is not None:
                runner.retain(images)
        keep = np.asarray(images, dtype=np.int64)
        self.seeds = [self.seeds[i] for i in keep]
        self._seed_low, self._seed_high, self.rounds = self._seed_low[keep], self._seed_high[keep], self.rounds[keep]


@dataclass(frozen=True)
class RoundCounts:
    """What one cspd round did for each of its images, in their order: drafts tested, drafts
    accepted, residual proposals drawn (0 where none was rejected)."""

    drafted: np.ndarray
    accepted: np.ndarray
    proposals: np.ndarray


class ContinuousMethod(Method):
    """A decoding strategy for continuous models: PARAMS parsed as every Method's, but the
    context is a ContinuousDecoding and the result continuous tokens."""

    def generate(self, ctx: ContinuousDecoding, class_ids: np.ndarray) -> np.ndarray:  # type: ignore[override]
        """Continuous tokens [N, seq_len, C] for these class ids, decoded together."""
        if self.needs_draft and ctx.draft is None:
            raise SpecrtError(f"method {self.name!r} needs a draft model")
        ids = np.atleast_1d(np.asarray(class_ids, dtype=np.int64))
        if len(ids) != len(ctx.seeds):
            raise ValueError(f"{len(ids)} images but {len(ctx.seeds)} seeds: one seed per image")
        if not len(ids):
            spec = ctx.target.spec
            return np.zeros((0, spec.seq_len, spec.token_dim), dtype=np.float32)
        tokens = self.decode(ctx, ids)
        ctx.stats.tokens += int(tokens.shape[0] * tokens.shape[1])
        return tokens

    @abstractmethod
    def decode(self, ctx: ContinuousDecoding, class_ids: np.ndarray) -> np.ndarray:
        """Tokens [N, seq_len, C] of a batch (one seed per image in ctx.seeds)."""

    def prefilled(self, seq_len: int) -> int:
        """How many of an image's first tokens the target decodes alone, one a step (target_alone)."""
        return seq_len


def target_tokens(ctx: ContinuousDecoding, z: np.ndarray, rows: DrawRows) -> np.ndarray:
    """Tokens [R,C] from the target's conditions z [pairs,R,D], one chain each on the noise of its
    first proposal at `rows` (draws.py: how the device round keys the target's own token)."""
    x0, _ = ctx.target.sample(z, ctx.noise(rows, PROPOSAL_NOISE), ctx.temperature, ctx.scales(rows.index))
    return x0


def batch_positions(ctx: ContinuousDecoding, images: np.ndarray, at: Optional[np.ndarray]) -> np.ndarray:
    """Where `images` sit in the runners' batch: `at`, or (None) the runners hold exactly these, in order."""
    return np.arange(len(images)) if at is None else np.asarray(at, dtype=np.int64)


def target_alone(ctx: ContinuousDecoding, inputs: np.ndarray, decided: np.ndarray, images: np.ndarray,
                 at: Optional[np.ndarray] = None) -> None:
    """One token from the target alone for each of `images` (rows of inputs and decided) at batch
    positions `at` (batch_positions): its next position through the target, the token from one
    chain (target_tokens), its round advanced. Every step of ar and cspd's token pre-filling; the
    runners' other images sit the step out (no window, nothing committed)."""
    at = batch_positions(ctx, images, at)
    n = decided[images]
    windows: list[Optional[np.ndarray]] = [None] * ctx.target.images
    for position, image, length in zip(at.tolist(), images.tolist(), n.tolist()):
        windows[position] = inputs[image, length : length + 1]  # position 0's input is the class: a row it ignores
    z = ctx.step_target(windows)[:, at, 0]
    ctx.target.commit(np.isin(np.arange(ctx.target.images), at).astype(np.int64))
    inputs[images, n + 1] = target_tokens(ctx, z, ctx.rows(at, n))
    ctx.rounds[at] += 1
    decided[images] += 1


class ContinuousAR(ContinuousMethod):
    """The target alone: one transformer step and one denoising chain per token, all images in step."""

    name = "ar"
    lossless = True
    auto_settings = ({},)

    def decode(self, ctx: ContinuousDecoding, class_ids: np.ndarray) -> np.ndarray:
        spec, images = ctx.target.spec, len(class_ids)
        inputs = np.zeros((images, spec.seq_len + 1, spec.token_dim), dtype=np.float32)  # inputs[i, j + 1] = token j
        ctx.start(ctx.target, class_ids)
        decided, everyone = np.zeros(images, dtype=np.int64), np.arange(images)
        for _ in range(spec.seq_len):
            target_alone(ctx, inputs, decided, everyone)
        return inputs[:, 1:].copy()


class CSpD(ContinuousMethod):
    """Continuous speculative decoding (002 Alg. 1): draft `draft_len` tokens, verify them in one
    target pass with trajectory-aligned density ratios, resample the first rejected token from
    the residual by acceptance-rejection (M = 1/Z), or take a bonus token when all are accepted.
    The first ceil(prefill_ratio · seq_len) tokens come from the target alone (token pre-filling).

    A round runs the whole batch: up to draft_len draft steps (an image whose own draft is
    shorter, near its end, sits the extra steps out), one target step over every image's
    [pending inputs, drafts], one scoring chain over every draft, each image's coins keyed by its
    seed and round (draws.py), and one acceptance-rejection loop for the images that rejected;
    each image commits its own accepted prefix and its round advances as the device round's.
    """

    name = "cspd"
    needs_draft = True
    lossless = True  # the residual is rejection-sampled exactly (M = 1/Z): the target's distribution
    auto_settings = settings_grid(draft_len=(2, 4, 8))
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

    def prefilled(self, seq_len: int) -> int:
        """Token pre-filling: the first ceil(prefill_ratio · seq_len) tokens are the target's alone."""
        return min(seq_len, math.ceil(self.prefill_ratio * seq_len))

    def verification_noise(self, ctx: ContinuousDecoding, draft_noise: np.ndarray, rows: DrawRows) -> np.ndarray:
        """The noise the target's chains use to score the drafts at `rows`: the draft's own
        (alignment)."""
        return draft_noise

    def decode(self, ctx: ContinuousDecoding, class_ids: np.ndarray) -> np.ndarray:
        spec = ctx.target.spec
        seq_len, channels, images = spec.seq_len, spec.token_dim, len(class_ids)
        inputs = np.zeros((images, seq_len + 1, channels), dtype=np.float32)  # inputs[i, j + 1] = token j of image i
        target, draft = ctx.target, ctx.draft
        ctx.start(target, class_ids)
        ctx.start(draft, class_ids)
        decided, everyone = np.zeros(images, dtype=np.int64), np.arange(images)  # tokens decided per image
        for _ in range(self.prefilled(seq_len)):  # token pre-filling: the target alone, every image in step
            target_alone(ctx, inputs, decided, everyone)
        batch = Batched(images)
        while batch.drop(ctx, decided == seq_len):
            self.draft_verify_round(ctx, inputs, decided, np.array(batch.images))
        return inputs[:, 1:].copy()

    def draft_verify_round(self, ctx: ContinuousDecoding, inputs: np.ndarray, decided: np.ndarray, images: np.ndarray,
                           at: Optional[np.ndarray] = None, pre_filling: Optional[np.ndarray] = None) -> RoundCounts:
        """One draft-verify round of the unfinished `images` (rows of inputs and decided) at batch
        positions `at` (batch_positions; the runners' other images sit it out): each image's drafts,
        accepted drafts and residual proposals. Where `pre_filling` [images] holds, an image still
        in its token pre-filling drafts nothing and takes the target's token alone from the same
        target pass (its bonus token: target_alone's step, keyed alike)."""
        target, draft, stats = ctx.target, ctx.draft, ctx.stats
        at = batch_positions(ctx, images, at)
        seq_len = target.spec.seq_len
        n = decided[images]
        counts = np.minimum(self.draft_len, seq_len - n)        # every unfinished image drafts ≥ 1 ...
        if pre_filling is not None:
            counts[pre_filling] = 0                              # ... but one pre-filling
        owner = np.repeat(np.arange(len(images)), counts)        # draft row -> image p (images[p], at[p])
        offsets = np.cumsum(counts) - counts                     # image p's draft rows start here
        depth = np.arange(len(owner)) - offsets[owner]           # draft row -> its index in the image's draft
        draft_rows = ctx.rows(at[owner], n[owner] + depth)
        noise = ctx.noise(draft_rows, DRAFT_NOISE)
        # Draft every image's tokens, keeping each one's condition z_q, last-step mean and token.
        z_draft = np.zeros((draft.pairs, len(owner), draft.spec.hidden), np.float32)
        mean_q = np.zeros((len(owner), inputs.shape[2]), np.float32)
        for i in range(int(counts.max())):
            live = np.flatnonzero(counts > i)
            windows: list[Optional[np.ndarray]] = [None] * draft.images
            for p in live.tolist():
                windows[at[p]] = inputs[images[p], draft.lengths[at[p]] : n[p] + i + 1]
            sizes = np.array([0 if w is None else len(w) for w in windows])
            z = draft.by_image(draft.step(windows))[:, at[live], sizes[at[live]] - 1]
            draft.commit(sizes)
            rows = offsets[live] + i
            x0, mean = draft.sample(z, noise[:, rows], ctx.temperature, ctx.scales(n[live] + i))
            inputs[images[live], n[live] + i + 1] = x0
            z_draft[:, rows], mean_q[rows] = z, mean
        drafted = inputs[images[owner], n[owner] + depth + 1]
        # One target pass over each image's pending inputs and drafts: conditions for n .. n+count.
        start = target.lengths[at]
        windows = [None] * target.images
        for p, image in enumerate(images.tolist()):
            windows[at[p]] = inputs[image, start[p] : n[p] + counts[p] + 1]
        z_target = ctx.step_target(windows)[:, at]
        stats.drafted += int(counts.sum())
        first = n - start                                        # image p's slot of position n
        accepted, drafting = np.zeros(len(images), dtype=np.int64), np.flatnonzero(counts)
        if len(drafting):  # score every draft on the target's chain with the same noise as the draft's
            score_noise = self.verification_noise(ctx, noise, draft_rows)
            _, mean_p = target.sample(z_target[:, owner, first[owner] + depth], score_noise, ctx.temperature,
                                      ctx.scales(n[owner] + depth))
            log_p = continuous.last_step_logpdf(drafted, mean_p, target.schedule, ctx.temperature)
            log_q = continuous.last_step_logpdf(drafted, mean_q, target.schedule, ctx.temperature)
            passes = ctx.uniforms(draft_rows, TEST) < self.accept_probability(log_p, log_q)
            # accepted length: the depth of each image's first rejection (its count when none)
            accepted[drafting] = np.minimum.reduceat(np.where(passes, counts[owner], depth), offsets[drafting])
        stats.accepted += int(accepted.sum())
        rejected = np.flatnonzero(accepted < counts)
        used = np.zeros(len(images), dtype=np.int64)
        if len(rejected):
            index = n[rejected] + accepted[rejected]
            inputs[images[rejected], index + 1], used[rejected] = self.residual_tokens(
                ctx, z_target[:, rejected, first[rejected] + accepted[rejected]],
                z_draft[:, offsets[rejected] + accepted[rejected]], index, at[rejected])
        bonus = np.flatnonzero((accepted == counts) & (n + counts < seq_len))
        if len(bonus):
            index = n[bonus] + counts[bonus]
            z_bonus = z_target[:, bonus, first[bonus] + counts[bonus]]
            inputs[images[bonus], index + 1] = target_tokens(ctx, z_bonus, ctx.rows(at[bonus], index))
        # a residual draw past K proposals spans the rounds the device round's would (draws.py)
        ctx.rounds[at] += 1 + np.maximum(used - 1, 0) // RESIDUAL_PROPOSALS
        committed = np.zeros(target.images, dtype=np.int64)
        committed[at] = n + accepted + 1 - start
        target.commit(committed)
        limits = draft.lengths.copy()
        limits[at] = n + accepted + 1
        draft.truncate(limits)
        decided[images] = np.minimum(seq_len, n + accepted + 1)
        return RoundCounts(counts, accepted, used)

    def residual_tokens(self, ctx: ContinuousDecoding, z_p: np.ndarray, z_q: np.ndarray, positions: np.ndarray,
                        who: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens [U,C] from Norm([p − q]_+), one for each rejecting image (batch positions `who`,
        increasing; z_p, z_q [pairs,U,D]: the two models' conditions of its rejected position),
        and the proposals each used [U], by acceptance-rejection with the target as proposal:
        propose x ~ p on fresh noise u, run the draft's chain on the same u, accept with
        α_s = max(0, 1 − q/p). Every image still waiting draws `residual_batch` proposals a batch,
        all images' chains run together; an image's first accepted proposal wins. Proposal m is
        keyed by (round + m // K, group m mod K), K = RESIDUAL_PROPOSALS (draws.py): the device
        round's K a round, so both loops take the same one whatever residual_batch is."""
        rows, k = self.residual_batch, RESIDUAL_PROPOSALS
        out = np.zeros((len(who), ctx.target.spec.token_dim), dtype=np.float32)
        used = np.zeros(len(who), dtype=np.int64)
        waiting, tried = np.arange(len(who)), 0
        while len(waiting):
            proposal = np.tile(tried + np.arange(rows), len(waiting))  # each waiting image's next `rows`
            draw = ctx.rows(np.repeat(who[waiting], rows), np.repeat(positions[waiting], rows),
                            later_rounds=proposal // k, part=proposal % k)
            noise, scales = ctx.noise(draw, PROPOSAL_NOISE), ctx.scales(draw.index)
            x0, mean_p = ctx.target.sample(np.repeat(z_p[:, waiting], rows, 1), noise, ctx.temperature, scales)
            _, mean_q = ctx.draft.sample(np.repeat(z_q[:, waiting], rows, 1), noise, ctx.temperature, scales)
            log_p = continuous.last_step_logpdf(x0, mean_p, ctx.target.schedule, ctx.temperature)
            log_q = continuous.last_step_logpdf(x0, mean_q, ctx.target.schedule, ctx.temperature)
            keep = ctx.uniforms(draw, PROPOSAL_TEST) < self.residual_acceptance(log_p, log_q)
            keep = keep.reshape(len(waiting), rows)
            hit, pick = keep.any(1), keep.argmax(1)
            ctx.stats.residual_proposals += int(np.where(hit, pick + 1, rows).sum())
            out[waiting[hit]] = x0.reshape(len(waiting), rows, -1)[hit, pick[hit]]
            used[waiting[hit]] = tried + pick[hit] + 1
            waiting, tried = waiting[~hit], tried + rows
        return out, used


CONTINUOUS_METHODS: dict[str, type[ContinuousMethod]] = {cls.name: cls for cls in (ContinuousAR, CSpD)}


def make_continuous_method(name: str, **params: Any) -> ContinuousMethod:
    """The strategy object for `name` on a continuous bundle (SpecrtError on mistakes)."""
    if name == "gsd":
        from specrt.runtime.families.continuous import GSD_REFUSAL

        raise SpecrtError(GSD_REFUSAL)
    if not isinstance(name, str) or name not in CONTINUOUS_METHODS:
        from specrt.runtime.family_registry import where_method_runs

        raise SpecrtError(f"unknown method {name!r} for a continuous model; choose one of "
                          f"{', '.join(CONTINUOUS_METHODS)}" + where_method_runs(name, "continuous"))
    return CONTINUOUS_METHODS[name](**params)
