"""Rounds of plain AR and of drafted chains (SD, Cool-SD, LANTERN with a draft model or an EAGLE head).

A chain round, all on the device, fixed shapes: the draft catches up (runtime/rounds/drafts.py: a
draft model on the two tokens it may not have cached, a head on the last round's committed pairs)
and drafts L tokens; the target scores [pending, drafts] in one
pass; runtime.verification.chains.verify_chain_block accepts a prefix and draws the next token with the
method's rule; the state commits it. Keys/values sit at their tokens' columns (the models'
ColumnCache), so nothing is copied at a commit: a rejected draft's columns are overwritten later.
Near an image's end it may accept only the drafts that fit (`limits`), which leaves every draw the
distribution it is in the host loop.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from specrt.runtime.conditions import Conditions
from specrt.runtime.rounds.state import DRAFT, NEXT, TEST, RoundState
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.chains import verify_chain_block
from specrt.runtime.verification.rules import AcceptanceRule


def start_state(round_: Any, rows: Conditions, seeds: Sequence[int], total: int) -> RoundState:
    """Prefill the round's target and draw each image's token 0: the round's state, made on its first
    call and restarted in place on later ones (a captured round replays over the same buffers)."""
    first_rows = round_.target.prefill(rows)
    state = getattr(round_, "state", None)
    if state is None:
        state = round_.state = RoundState.start(first_rows.device, seeds, total, round_.window)
    else:
        state.restart(seeds)
    state.tokens[:, 0] = inverse_cdf(first_rows, state.uniforms(torch.zeros_like(state.length), NEXT))
    return state


def admit_images(round_: Any, images: Sequence[int], rows: Conditions, seeds: Sequence[int]) -> None:
    """New images in the free image slots `images` of the round's running state, between two rounds
    (in-flight batching, runtime/scheduling/round_slots.py): their condition rows (twin-major, as
    condition_rows makes them) prefilled into their model rows in one pass, their counter
    coordinates, each one's token 0 drawn as start_state draws it, and the round's own per-image
    state reset (`refill`) — all in place, in the buffers a captured round replays over, so nothing
    is planned, traced or captured again."""
    state = round_.state
    first = round_.target.prefill(rows, images=images)  # [len(images), V]
    for image, seed in zip(images, seeds, strict=True):
        state.admit(image, seed)
    chosen = torch.as_tensor(list(images), device=state.length.device)
    uniform = state.uniforms(torch.zeros_like(state.length), NEXT)[chosen]
    state.tokens[chosen, 0] = inverse_cdf(first, uniform)
    round_.refill(state, list(images), rows)


class ArRound:
    """Plain AR as a round: the pending token through the target, the next token drawn."""

    window = 1
    passes = {"target": 1, "draft": 0}

    def __init__(self, target: Any):
        self.target = target

    def start(self, rows: Conditions, seeds: Sequence[int], total: int) -> RoundState:
        return start_state(self, rows, seeds, total)

    def refill(self, state: RoundState, images: list[int], rows: Conditions) -> None:
        """Nothing of AR's is kept per image beyond the state (admit_images)."""

    def __call__(self, state: RoundState) -> None:
        n = state.length
        rows = self.target.window(state.pending()[:, None], (n - 1)[:, None])[:, 0]
        nothing = state.tokens[:, :0]
        state.commit(torch.zeros_like(n), nothing, inverse_cdf(rows, state.uniforms(n, NEXT)))


class DraftedRound:
    """What every drafted round shares: the target and the draft (runtime/rounds/drafts.py: a model
    or an EAGLE head) started and the rule's tables on the device at the start."""

    target: Any
    draft: Any
    rule: AcceptanceRule

    def start(self, rows: Conditions, seeds: Sequence[int], total: int) -> RoundState:
        state = start_state(self, rows, seeds, total)
        self.draft.start(rows)
        self.rule.prepare(state.length)
        return state

    def refill(self, state: RoundState, images: list[int], rows: Conditions) -> None:
        """The draft started for the images admitted (admit_images); the rule keeps nothing per image."""
        self.draft.start(rows, images)


class ChainRound(DraftedRound):
    """One draft-then-verify round of chains (see the module docstring)."""

    def __init__(self, target: Any, draft: Any, rule: AcceptanceRule, draft_len: int):
        self.target, self.draft, self.rule, self.draft_len = target, draft, rule, draft_len
        self.window = draft_len + 1
        self.passes = {"target": 1, "draft": draft_len}

    def __call__(self, state: RoundState) -> None:
        n, longest = state.length, self.draft_len
        steps = torch.arange(longest, device=n.device)
        drafts, q_rows = self._draft(state, n, steps)
        target_index = (n - 1)[:, None] + torch.arange(longest + 1, device=n.device)
        p_rows = self.target.window(torch.cat([state.pending()[:, None], drafts], dim=1), target_index)
        limits = (state.total - n - 1).clamp(min=0, max=longest)
        accepted, next_token = verify_chain_block(p_rows, q_rows, drafts, limits,
                                                  state.uniforms(n[:, None] + steps, TEST), state.uniforms(n, NEXT),
                                                  self.rule)
        self.draft.verified(n)
        state.commit(accepted, drafts, next_token)

    def _draft(self, state: RoundState, n: Any, steps: Any) -> tuple[Any, Any]:
        """L drafts [I, L] and the rows they were drawn from [I, L, V]: the catch-up pass, then one
        pass per further draft."""
        uniforms = state.uniforms(n[:, None] + steps, DRAFT)
        rows = self.draft.catch_up(state)
        drafts, q_rows = [], []
        for j in range(self.draft_len):
            if j:
                rows = self.draft.extend(drafts[-1], n - 1 + j)
            q_rows.append(rows)
            drafts.append(inverse_cdf(rows, uniforms[:, j]))
        return torch.stack(drafts, dim=1), torch.stack(q_rows, dim=1)
