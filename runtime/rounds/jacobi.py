"""The Jacobi round: SJD, its drafts coupled or not (without proactive drafting's trees).

Its state beyond RoundState: the window of L drafted tokens after the pending one and the rows they
were drawn from (the proposal q), in fixed buffers. One round: the target scores [pending, window]
in one pass; the window is verified as a drafted chain with SD's rule, or GSD's grouped test
(verify_chain_block); the next window comes from this pass's own rows along the accepted prefix —
new slot m sits at old
slot k = τ + 1 + m, whose row (row k predicts it) gives a fresh draw (SJD, coupling independent),
re-tests the old draft there (coupling maximal, SJD-PAC's adaptive continuation: kept, or drawn
from the residual) or gives its Gumbel-max draw with the token index's fixed noise (coupling
gumbel; runtime.verification.coupling); slots past the last row start from uniform random tokens
with a uniform q (under gumbel coupling the uniform row's Gumbel-max draw) — under a unified
model's image grammar, a slot the grammar forces starts at its forced token and a sampled one at
a random code (FreshDrafts).
runtime/methods/jacobi.py is the host loop this reproduces in distribution.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from specrt.runtime.conditions import Conditions
from specrt.runtime.counter_random import image_key
from specrt.runtime.grammar import ImageGrammar
from specrt.runtime.methods.jacobi import fresh_proposal
from specrt.runtime.rounds.chains import start_state
from specrt.runtime.rounds.state import DRAFT, FRESH, NEXT, RESAMPLE, RETEST, TEST, RoundState
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.chains import verify_chain_block
from specrt.runtime.verification.coupling import gumbel_drafts, position_noise
from specrt.runtime.verification.positions import retest_block
from specrt.runtime.verification.rules import VANILLA, AcceptanceRule


class JacobiRound:
    """One Jacobi iteration over a window of `width` drafts; `coupling` (COUPLINGS) ties them to the last; `grammar`:
    a unified model's image grammar, which the fresh slots follow (the target's rows carry it already);
    `rule` tests the window's drafts (SD's; GSD's grouped test)."""

    def __init__(self, target: Any, width: int, vocab: int, coupling: str = "independent",
                 grammar: Optional[ImageGrammar] = None, rule: AcceptanceRule = VANILLA):
        self.target, self.width, self.vocab, self.coupling, self.rule = target, width, vocab, coupling, rule
        self.fresh = FreshDrafts(target, vocab, grammar, gumbel=coupling == "gumbel")
        self.window = width + 1
        self.passes = {"target": 1, "draft": 0}

    def start(self, rows: Conditions, seeds: Sequence[int], total: int) -> RoundState:
        state = start_state(self, rows, seeds, total)
        self.rule.prepare(state.length)  # its tables on the device before a round is traced
        if getattr(self, "drafts", None) is None:  # a later call: the captured round reads these buffers
            images, device = state.length.shape[0], state.length.device
            self.drafts = torch.empty((images, self.width), dtype=torch.int64, device=device)
            self.proposal = torch.empty((images, self.width, self.vocab), dtype=self.target.row_dtype, device=device)
        self._first_window(state, slice(None))
        return state

    def refill(self, state: RoundState, images: list[int], rows: Conditions) -> None:
        """The admitted images' first windows (rounds/chains.py admit_images)."""
        self._first_window(state, images)

    def _first_window(self, state: RoundState, images: Any) -> None:
        """Fresh drafts and their q for `images` (a slice, or a list of images) at the start, in place."""
        # round 0's own fresh slots lie past index L + 1, so these indices' FRESH uniforms are not reused
        index = state.length[:, None] + torch.arange(self.width, device=state.length.device)
        self.drafts[images] = self.fresh.tokens(state, index)[images]
        self.proposal[images] = self.fresh.rows(index)[images]

    def __call__(self, state: RoundState) -> None:
        n, width = state.length, self.width
        steps = torch.arange(width, device=n.device)
        index = (n - 1)[:, None] + torch.arange(width + 1, device=n.device)
        p_rows = self.target.window(torch.cat([state.pending()[:, None], self.drafts], dim=1), index)
        limits = (state.total - n - 1).clamp(min=0, max=width)
        accepted, next_token = verify_chain_block(p_rows, self.proposal, self.drafts, limits,
                                                  state.uniforms(n[:, None] + steps, TEST), state.uniforms(n, NEXT),
                                                  self.rule)
        drafts, proposal = self._next_window(state, p_rows, n, accepted, steps)
        state.commit(accepted, self.drafts, next_token)
        self.drafts.copy_(drafts)
        self.proposal.copy_(proposal)

    def _next_window(self, state: RoundState, p_rows: Any, n: Any, accepted: Any, steps: Any) -> tuple[Any, Any]:
        """The next round's drafts [I, L] and proposal [I, L, V] (see the module docstring)."""
        width = self.width
        image = torch.arange(n.shape[0], device=n.device)[:, None]
        old_slot = accepted[:, None] + 1 + steps  # [I, L]: the old slot each new slot sits at
        stale = None
        if self.coupling == "maximal":
            old = old_slot.clamp(max=width - 1)
            stale = self.drafts[image, old], self.proposal[image, old], old_slot < width
        return next_drafts(state, p_rows, old_slot.clamp(max=width), old_slot <= width, n[:, None] + old_slot,
                           stale, self.fresh)


class FreshDrafts:
    """SJD's draft for a window slot no row predicts yet, on the device: a random token and the q it
    was drawn from — uniform over the vocabulary, or under an image grammar (the host loop's
    JacobiDecoding._random_level and fresh_proposal) the forced token as a point mass where the
    grammar forces one and a code drawn uniformly from the codes alone elsewhere.

    Why a table: a round knows a slot only by its token index (the stream position, derived on the
    device from the state's lengths) and may not ask the host what the grammar says there, so the
    grammar's forced tokens (ImageGrammar.forced) are one device tensor indexed by stream position,
    made once with the round. Indices past the stream (slots no image ever commits) read its last
    entry, −1: sampled.

    `gumbel` (coupling gumbel): every draft a Gumbel-max draw, these as well as those from rows
    (next_drafts), with each token index's noise over every vocabulary entry."""

    def __init__(self, target: Any, vocab: int, grammar: Optional[ImageGrammar] = None, gumbel: bool = False):
        device = target.device
        self.vocab = vocab
        self.noise_tokens = torch.arange(vocab, device=device) if gumbel else None  # the ids a noise covers
        self.support = vocab if grammar is None else grammar.image_vocab
        self.row = torch.from_numpy(fresh_proposal(vocab, grammar)).to(device, target.row_dtype)  # [V]
        self.columns = torch.arange(vocab, device=device)
        self.forced = None if grammar is None else torch.from_numpy(np.append(grammar.forced(), -1)).to(device)

    def forced_at(self, index: Any) -> Any:
        """The token the grammar forces at token indices index [...] (−1: sampled), int64 [...]."""
        return self.forced[index.clamp(min=0, max=self.forced.shape[0] - 1)]

    def tokens(self, state: RoundState, index: Any) -> Any:
        """Fresh drafts for token indices index [I, K], drawn with each index's FRESH uniform (or the
        Gumbel-max draws of their rows)."""
        if self.noise_tokens is not None:
            return self.gumbel(state, self.rows(index), index)
        drawn = (state.uniforms(index, FRESH) * self.support).to(torch.int64).clamp(max=self.support - 1)
        if self.forced is None:
            return drawn
        forced = self.forced_at(index)
        return torch.where(forced >= 0, forced, drawn)

    def gumbel(self, state: RoundState, rows: Any, index: Any) -> Any:
        """The Gumbel-max draws [I, K] of rows [I, K, V] at token indices index [I, K], with each index's
        noise (the same in every round: runtime.verification.coupling)."""
        key = image_key(state.seed_low, state.seed_high)[:, None, None]
        return gumbel_drafts(rows, position_noise(key, index, self.noise_tokens))

    def rows(self, index: Any) -> Any:
        """The q [I, K, V] the fresh drafts at token indices index [I, K] were drawn from."""
        rows = self.row.expand(*index.shape, self.vocab)
        if self.forced is None:
            return rows
        forced = self.forced_at(index)[..., None]
        return torch.where(forced >= 0, (self.columns == forced).to(self.row.dtype), rows)


def next_drafts(state: RoundState, p_rows: Any, row_slots: Any, has_row: Any, index: Any, stale: Any,
                fresh: FreshDrafts) -> tuple[Any, Any]:
    """A Jacobi window's next drafts [I, L] and the rows they come from [I, L, V]: slot j, the token at
    index [I, L], is drawn from this pass's row at window slot row_slots[:, j] where has_row (SJD's
    fresh draft), or, with `stale` (adaptive continuation: the old drafts there, their rows and
    where there was one), the old draft re-tested against that row (retest_block); past the last
    row a fresh draft (`fresh`: a random token, or the grammar's forced one) with its q. Under gumbel
    coupling (`fresh`.noise_tokens) every slot's draft is the Gumbel-max draw of its row instead."""
    image = torch.arange(index.shape[0], device=index.device)[:, None]
    rows = p_rows[image, row_slots]
    proposal = torch.where(has_row[:, :, None], rows, fresh.rows(index).to(rows.dtype))
    if fresh.noise_tokens is not None:
        return fresh.gumbel(state, proposal, index), proposal
    drafts = inverse_cdf(rows, state.uniforms(index, DRAFT))
    if stale is not None:
        old_tokens, old_rows, had_draft = stale
        flat = (-1, rows.shape[-1])
        retested = retest_block(rows.reshape(flat), old_rows.reshape(flat), old_tokens.reshape(-1),
                                state.uniforms(index, RETEST).reshape(-1),
                                state.uniforms(index, RESAMPLE).reshape(-1)).reshape(drafts.shape)
        drafts = torch.where(had_draft, retested, drafts)
    return torch.where(has_row, drafts, fresh.tokens(state, index)), proposal
