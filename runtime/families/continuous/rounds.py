"""The continuous family's device rounds: `ar` and `cspd` (paper 002) as functions of device tensors.

Why: on a GPU the host loop (methods.py) pays a round trip at every stage of a cspd round — each
draft step, the target pass, the scoring chains, every acceptance-rejection batch of the residual
— while the models themselves are small. Here a round is one function `round(state)` of the
state's tensors (round_state.py) and the models' buffers (device_model.py): no host read inside,
shapes fixed per (batch, window), random numbers from counters, so a GPU captures it as one CUDA
graph and replays it (runtime.rounds.CapturedRound) and a CPU runs it eagerly. The formulas are
formulas.py's, the same functions the host loop calls.

A cspd round, every image at once (its decided length n, its limit: the drafts it may accept):
  1. the draft catches up on positions n − 1 and n (the two its cache may lack) and drafts L tokens,
     one transformer step and one denoising chain each;
  2. the target runs positions n .. n + L ([token n − 1, drafts]) in one pass, writing its cache;
  3. the target's chains score the drafts on the drafts' own noise (trajectory alignment) and the
     acceptance tests min(1, p/q) accept a prefix a ≤ limit;
  4. K proposals from the target at position n + a, scored by the draft's chain on the same noise:
     where a < limit (a rejection) the first with u < max(0, 1 − q/p) is the residual token
     (acceptance-rejection with M = 1/Z); where a = limit (every allowed draft accepted) the first
     proposal is the bonus token;
  5. the state commits a drafts and, where a proposal was taken, the next token.
The first ceil(prefill_ratio · seq_len) tokens are the target's alone (token pre-filling): an image
there has limit 0, so its round takes the bonus token, an ar step.

The residual draw is an acceptance-rejection loop, unbounded in the host loop. Here a round draws K
proposals in parallel and takes the first accepted; an image whose K all fail keeps its accepted
drafts and leaves the draw open (`pending`): its next round accepts no draft and draws K more
proposals from the same two conditions (the target's and the draft's at that position, recomputed
from the same committed tokens), with fresh numbers. A loop split across rounds is the same loop,
so the draw stays exact; that image's other work in such a round (drafts, target slots past its
position) writes only columns later rounds overwrite. The host loop keys its proposal m of the same
draw by (round + m // K, group m mod K) (draws.py), so both loops take the same proposal.

K = RESIDUAL_PROPOSALS = 8, from the residual's acceptance measured on the MAR demo (host loop,
cspd draft_len 4, its sampling defaults, 40 images, 1,701 residual draws, each draw's Z estimated
from 64 proposals): a proposal is accepted with probability Z, the total variation between target
and draft at the rejected position, whose mean over the draws was 0.81 (median 0.90, 10th
percentile 0.45). A draw leaves K proposals all rejected with probability E[(1 − Z)^K]: 19% at K = 1,
2.7% at 4, 0.6% at 8, 0.07% at 16. Each open draw costs its image a whole round; the proposals are
rows of one batch of chains (K rows an image for the target's head and the draft's), not steps,
which a GPU runs at small batches for about the time of one row. K = 8 keeps open draws to 1 in
160 for 8 rows an image; 4 would make them 4× as frequent, 16 would double the rows to save half a
point. A sharper draft shifts Z down at its rejections (the tiny random pair of the tests needs 4.4
proposals a draw), which K = 8 still absorbs in most draws.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

import specrt.runtime.families.continuous.formulas as continuous
from specrt.runtime.families.continuous.device_model import ContinuousDeviceModel
from specrt.runtime.families.continuous.draws import (DRAFT_NOISE, PROPOSAL_NOISE, PROPOSAL_TEST,
                                                      RESIDUAL_PROPOSALS, TEST, chain_noise)
from specrt.runtime.families.continuous.round_state import ContinuousRoundState


@dataclass(frozen=True)
class ContinuousSampling:
    """What both models sample with: MAR's noise temperature and guidance (scale, schedule)."""

    temperature: float = 1.0
    cfg_scale: float = 1.0
    cfg_schedule: str = "constant"

    def scales(self, positions: Any, seq_len: int) -> Optional[Any]:
        """The guidance scales of rows at token positions [R] (None: the call's one scale)."""
        if self.cfg_schedule == "constant" or self.cfg_scale == 1.0:
            return None
        return continuous.cfg_scales(self.cfg_scale, self.cfg_schedule, positions, seq_len)


def at_slot(z: Any, slot: Any) -> Any:
    """Each image's condition at its own slot: z [pairs, I, S, D], slot [I] -> [pairs, I, D]."""
    index = slot[None, :, None, None].expand(z.shape[0], -1, 1, z.shape[3])
    return z.gather(2, index)[:, :, 0]


class ContinuousRound:
    """What both rounds share: the target's device model, the sampling, the state made on the first
    call and restarted in place on later ones (a captured round replays over the same buffers)."""

    target: ContinuousDeviceModel
    draft: Optional[ContinuousDeviceModel] = None
    sampling: ContinuousSampling
    window: int
    state: Optional[ContinuousRoundState] = None

    def start(self, class_ids: np.ndarray, seeds: Sequence[int]) -> ContinuousRoundState:
        """The state of a call's images (class ids, seeds), every image at its class token."""
        for model in (self.target, self.draft):
            if model is not None:
                model.restart(np.asarray(class_ids, dtype=np.int64))
        if self.state is None:
            self.state = ContinuousRoundState.start(self.target.device, seeds, self.target.seq_len, self.window,
                                                    self.target.mar.cfg.token_dim)
        else:
            self.state.restart(seeds)
        return self.state

    def admit(self, image: int, class_id: int, seed: int) -> None:
        """A new image (class id, seed) in the free image slot `image` of the running state, between
        two rounds (in-flight batching, runtime/scheduling/continuous_round_slots.py): its rows in
        both models, its counter coordinates and its progress reset in place, in the buffers a
        captured round replays over. Its prefill, the class token at position 0, is its window in
        the next round, as in a call's first round."""
        for model in (self.target, self.draft):
            if model is not None:
                model.admit(image, class_id)
        self.state.admit(image, seed)

    def chains(self, model: ContinuousDeviceModel, z: Any, normals: Any, positions: Any) -> tuple[Any, Any]:
        """Chains of `model` from conditions z [pairs, R, D] on normals [I, J, groups, (T+1)·C] (R rows,
        in their order), each row at its token position positions [R]: (x_0, last-step mean)."""
        steps, channels = model.schedule.steps, model.mar.cfg.token_dim
        return model.sample(z, chain_noise(normals, steps, channels), self.sampling.temperature,
                            self.sampling.scales(positions, model.seq_len))

    def noise_size(self) -> int:
        return (self.target.schedule.steps + 1) * self.target.mar.cfg.token_dim


class ContinuousArRound(ContinuousRound):
    """The target alone as a round: position n through the target, token n from one chain."""

    window = 1

    def __init__(self, target: ContinuousDeviceModel, sampling: ContinuousSampling):
        self.target, self.sampling = target, sampling

    def __call__(self, state: ContinuousRoundState) -> None:
        n = state.length
        positions = n[:, None]
        z = self.target.window(state.inputs(positions), positions)[:, :, 0]
        # the target's token is its first proposal (draws.py), as a cspd round's pre-filled and bonus tokens
        token, _ = self.chains(self.target, z, state.normals(positions, PROPOSAL_NOISE, self.noise_size()), n)
        accepted = torch.zeros_like(n)
        state.commit(accepted, state.tokens[:, :0], token, accepted == 0)


class CSpDRound(ContinuousRound):
    """One cspd round (see the module docstring)."""

    # Hooks the tests replace to plant known bugs (they must be caught).
    accept_probability = staticmethod(continuous.accept_probability)
    residual_acceptance = staticmethod(continuous.residual_acceptance)

    def __init__(self, target: ContinuousDeviceModel, draft: ContinuousDeviceModel, sampling: ContinuousSampling,
                 draft_len: int, prefill_ratio: float, proposals: int = RESIDUAL_PROPOSALS):
        self.target, self.draft, self.sampling = target, draft, sampling
        self.draft_len, self.proposals = draft_len, proposals
        self.window = draft_len + 1
        self.prefilled = min(target.seq_len, math.ceil(prefill_ratio * target.seq_len))

    def __call__(self, state: ContinuousRoundState) -> None:
        n, longest = state.length, self.draft_len
        steps = torch.arange(longest, device=n.device)
        limit = (state.total - n).clamp(min=0, max=longest)
        limit = limit.where(~state.pending & (n >= self.prefilled), torch.zeros_like(limit))
        draft_normals = state.normals(n[:, None] + steps, DRAFT_NOISE, self.noise_size())  # [I, L, 1, N]
        drafted, mean_q, z_q = self._draft(state, n, draft_normals)
        positions = n[:, None] + torch.arange(longest + 1, device=n.device)
        z_p = self.target.window(torch.cat([state.inputs(n[:, None]), drafted], dim=1), positions)
        # score every draft on the target's chain with the draft's own noise (alignment)
        pairs, images, _, width = z_p.shape
        rows = images * longest
        _, mean_p = self.chains(self.target, z_p[:, :, :longest].reshape(pairs, rows, width), draft_normals,
                                positions[:, :longest].reshape(rows))
        schedule, temperature = self.target.schedule, self.sampling.temperature
        flat = drafted.reshape(rows, -1)
        log_p = continuous.last_step_logpdf(flat, mean_p, schedule, temperature).reshape(images, longest)
        log_q = continuous.last_step_logpdf(flat, mean_q.reshape(rows, -1), schedule, temperature)
        passes = state.uniforms(n[:, None] + steps, TEST) < self.accept_probability(log_p, log_q.reshape(images, longest))
        accepted = torch.minimum(passes.to(torch.int64).cumprod(dim=1).sum(dim=1), limit)
        bonus = (accepted == limit) & ~state.pending
        token, drew, used = self._next_token(state, n + accepted, at_slot(z_p, accepted),
                                             at_slot(z_q, accepted.clamp(max=longest - 1)), bonus)
        live = (~state.finished).to(torch.int64)
        state.drafted += limit * live
        state.accepted += accepted * live
        state.proposals += used.where(~bonus, torch.zeros_like(used)) * live
        state.commit(accepted, drafted, token, drew)

    def _draft(self, state: ContinuousRoundState, n: Any, normals: Any) -> tuple[Any, Any, Any]:
        """L drafts [I, L, C], their chains' last-step means [I, L, C] and the draft's conditions
        [pairs, I, L, D]: the catch-up pass over positions n − 1 and n, then one pass per further draft."""
        catch_up = torch.stack([(n - 1).clamp(min=0), n], dim=1)
        z = self.draft.window(state.inputs(catch_up), catch_up)[:, :, 1]
        drafts, means, conditions = [], [], []
        for j in range(self.draft_len):
            if j:
                z = self.draft.window(drafts[-1][:, None], (n + j)[:, None])[:, :, 0]
            token, mean = self.chains(self.draft, z, normals[:, j:j + 1], n + j)
            drafts.append(token)
            means.append(mean)
            conditions.append(z)
        return torch.stack(drafts, dim=1), torch.stack(means, dim=1), torch.stack(conditions, dim=2)

    def _next_token(self, state: ContinuousRoundState, index: Any, z_p: Any, z_q: Any,
                    bonus: Any) -> tuple[Any, Any, Any]:
        """K target proposals at token index [I] from conditions z_p [pairs, I, D], scored by the draft
        (z_q) on the same noise: (the first accepted [I, C], whether one was, proposals used [I]).
        A bonus image accepts its first."""
        k = self.proposals
        normals = state.normals(index[:, None], PROPOSAL_NOISE, self.noise_size(), groups=k)  # [I, 1, K, N]
        at = index.repeat_interleave(k)
        x0, mean_p = self.chains(self.target, z_p.repeat_interleave(k, dim=1), normals, at)
        _, mean_q = self.chains(self.draft, z_q.repeat_interleave(k, dim=1), normals, at)
        schedule, temperature = self.target.schedule, self.sampling.temperature
        alpha = self.residual_acceptance(continuous.last_step_logpdf(x0, mean_p, schedule, temperature),
                                         continuous.last_step_logpdf(x0, mean_q, schedule, temperature))
        alpha = alpha.reshape(-1, k).where(~bonus[:, None], torch.ones_like(alpha.reshape(-1, k)))
        keep = state.uniforms(index[:, None], PROPOSAL_TEST, torch.arange(k, device=index.device)[None]) < alpha
        drew = keep.any(dim=1)
        pick = keep.to(torch.int32).argmax(dim=1)
        token = x0.reshape(len(index), k, -1).gather(1, pick[:, None, None].expand(-1, 1, x0.shape[1]))[:, 0]
        return token, drew, (pick + 1).where(drew, torch.full_like(pick, k))
