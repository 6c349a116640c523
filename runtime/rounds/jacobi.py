"""The Jacobi round: SJD, and SJD-PAC's adaptive continuation (without proactive drafting's trees).

Its state beyond RoundState: the window of L drafted tokens after the pending one and the rows they
were drawn from (the proposal q), in fixed buffers. One round: the target scores [pending, window]
in one pass; the window is verified as a drafted chain with SD's rule (verify_chain_block); the
next window comes from this pass's own rows along the accepted prefix — new slot m sits at old
slot k = τ + 1 + m, whose row (row k predicts it) gives a fresh draw (SJD) or re-tests the old
draft there (adaptive continuation: kept, or drawn from the residual); slots past the last row
start from uniform random tokens with a uniform q. runtime/methods/jacobi.py is the host loop this
reproduces in distribution.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from specrt.runtime.conditions import Conditions
from specrt.runtime.rounds.chains import start_state
from specrt.runtime.rounds.state import DRAFT, FRESH, NEXT, RESAMPLE, RETEST, TEST, RoundState
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification import VANILLA, retest_block, verify_chain_block


class JacobiRound:
    """One Jacobi iteration over a window of `width` drafts; `adaptive` re-tests stale drafts."""

    def __init__(self, target: Any, width: int, vocab: int, adaptive: bool = False):
        self.target, self.width, self.vocab, self.adaptive = target, width, vocab, adaptive
        self.window = width + 1
        self.passes = {"target": 1, "draft": 0}

    def start(self, rows: Conditions, seeds: Sequence[int], total: int) -> RoundState:
        state = start_state(self, rows, seeds, total)
        steps = torch.arange(self.width, device=state.length.device)
        # round 0's own fresh slots lie past index L + 1, so these indices' FRESH uniforms are not reused
        drafts = self._random(state, state.length[:, None] + steps)
        if getattr(self, "drafts", None) is None:
            self.drafts = drafts
            self.proposal = torch.empty((drafts.shape[0], self.width, self.vocab), dtype=self.target.row_dtype,
                                        device=drafts.device)
        else:  # a later call: the captured round reads these buffers
            self.drafts.copy_(drafts)
        self.proposal.fill_(1.0 / self.vocab)
        return state

    def _random(self, state: RoundState, index: Any) -> Any:
        """Uniform random tokens for token indices index [I, K]."""
        return (state.uniforms(index, FRESH) * self.vocab).to(torch.int64).clamp(max=self.vocab - 1)

    def __call__(self, state: RoundState) -> None:
        n, width = state.length, self.width
        steps = torch.arange(width, device=n.device)
        index = (n - 1)[:, None] + torch.arange(width + 1, device=n.device)
        p_rows = self.target.window(torch.cat([state.pending()[:, None], self.drafts], dim=1), index)
        limits = (state.total - n - 1).clamp(min=0, max=width)
        accepted, next_token = verify_chain_block(p_rows, self.proposal, self.drafts, limits,
                                                  state.uniforms(n[:, None] + steps, TEST), state.uniforms(n, NEXT),
                                                  VANILLA)
        drafts, proposal = self._next_window(state, p_rows, n, accepted, steps)
        state.commit(accepted, self.drafts, next_token)
        self.drafts.copy_(drafts)
        self.proposal.copy_(proposal)

    def _next_window(self, state: RoundState, p_rows: Any, n: Any, accepted: Any, steps: Any) -> tuple[Any, Any]:
        """The next round's drafts [I, L] and proposal [I, L, V] (see the module docstring)."""
        width, images = self.width, n.shape[0]
        old_slot = accepted[:, None] + 1 + steps  # [I, L]: the old slot each new slot sits at
        token_index = n[:, None] + old_slot
        has_row = old_slot <= width
        row_slot = old_slot.clamp(max=width)
        image = torch.arange(images, device=n.device)[:, None]
        rows = p_rows[image, row_slot]  # [I, L, V]
        drafts = inverse_cdf(rows, state.uniforms(token_index, DRAFT))
        if self.adaptive:
            had_draft = old_slot < width
            old = old_slot.clamp(max=width - 1)
            flat = (-1, rows.shape[-1])
            retested = retest_block(rows.reshape(flat), self.proposal[image, old].reshape(flat),
                                    self.drafts[image, old].reshape(-1),
                                    state.uniforms(token_index, RETEST).reshape(-1),
                                    state.uniforms(token_index, RESAMPLE).reshape(-1)).reshape(images, width)
            drafts = torch.where(had_draft, retested, drafts)
        fresh = self._random(state, token_index)
        uniform = torch.full_like(rows, 1.0 / self.vocab)
        return torch.where(has_row, drafts, fresh), torch.where(has_row[:, :, None], rows, uniform)
