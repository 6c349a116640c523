"""The draft chain: a draft model's catch-up window, then L drafts drawn one after another, in one call.

Why: a draft-then-verify round drafts L tokens autoregressively. Run as L step calls, each
costs a graph launch, a host read of its draw and the host work around it; for the small
draft models speculative decoding wants, that overhead is most of the draft's time (demo
draft on the CPU: ~120 us per call for a one-layer model). This module runs the L steps
inside one graph (specrt.export exports it as `draft_chain`; the PyTorch backend runs the very
same module), so a round costs two model calls, draft and target, whatever L.

What it computes is exactly what the L step calls compute (runtime.methods.speculative's loop):

    step 0:  the catch-up window (ids, positions, mask over [cache | window]), as the step graph;
             draft 1 is drawn from the row of each image's last real window slot (`last`)
    step j:  draft j is fed at position positions[last] + j, seeing what that slot saw plus the
             drafts fed before it; draft j + 1 is drawn from its row

with the sampling head (runtime/head.py) at every row and uniforms[i, j] for image i's draft
j + 1. Outputs: present_kv of the window and of drafts 1..L − 1 (the last draft is never fed:
the target scores it), probs [I, L, V] (the rows each draft was drawn from) and draws [I, L].
Host-side restrictions (greedy, top-k, top-p: sampling.restrict) cannot act between the
steps, so callers use it only where the head's softmax is the distribution (needs_restriction
false). Every model with the step entry point (LlamaGen's GPT, unified.UnifiedLM) runs here;
HeadChain runs an EAGLE head (export/eagle), whose step also takes the feature before each
token: the same loop, each draft fed with the head's own feature of the slot before it.
This module needs torch; the runtime imports it only from the PyTorch backend.
"""
from __future__ import annotations

import torch
from torch import nn

from specrt.runtime.head import SamplingHead


class KVSegments:
    """A cache in segments along the sequence axis (each [L, 2, B, Hkv, C_s, D]), read per layer as a
    model reads its past_kv (`past_kv[i, 0]`: layer i's keys), giving a tuple of the segments' that
    the models' attention joins with the window's own rows in one concatenation
    (export.llamagen_gpt.attend): the cache and the rows drafted so far are never copied together first."""

    def __init__(self, *parts: torch.Tensor):
        self.parts = parts

    def __getitem__(self, index) -> tuple[torch.Tensor, ...]:
        return tuple(part[index] for part in self.parts)


class DraftChain(nn.Module):
    """(ids, positions [B, W], mask [B, W, C + W], past_kv [.., B, .., C, D], last [I], mix [I, B],
    uniforms [I, L]) -> (present_kv [.., B, .., W + L − 1, D], probs [I, L, V], draws [I, L] int32)."""

    def __init__(self, model: nn.Module, steps: int):
        super().__init__()
        if steps < 1:
            raise ValueError(f"a draft chain draws at least one token, got {steps} steps")
        self.model, self.steps, self.head = model, steps, SamplingHead()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
                past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor, uniforms: torch.Tensor):
        return self._draw(input_ids, None, positions, attention_mask, past_kv, last, mix, uniforms)

    def _step(self, ids: torch.Tensor, fed: torch.Tensor | None, positions: torch.Tensor, mask: torch.Tensor,
              past_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """One model step: (logits, what each slot hands the token after it, present). An
        independent draft hands nothing on: a token is all it is fed."""
        logits, _, present = self.model.step(ids, positions, mask, past_kv)
        return logits, None, present

    def _draw(self, input_ids: torch.Tensor, fed: torch.Tensor | None, positions: torch.Tensor,
              attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor,
              uniforms: torch.Tensor):
        """The window, then the drafts one after another (the formulas of the module docstring),
        each draft fed with what the slot before it hands on (`_step`)."""
        batch = input_ids.shape[0]
        pairs = batch // mix.shape[0]  # model rows per image: 2 under CFG (row i + images is its twin)
        logits, out, local = self._step(input_ids.long(), fed, positions.long(), attention_mask, past_kv)
        rows = torch.arange(batch, device=input_ids.device)
        slot = last.long().repeat(pairs)
        seen = attention_mask[rows, slot]                    # [B, C + W]: what the last real slot saw
        position = positions.long()[rows, slot][:, None]     # [B, 1]
        fed = None if out is None else out[rows, slot][:, None]  # what the last real slot hands draft 1
        probs, draws = self.head(logits[rows, slot][:, None], mix, uniforms[:, :1])
        all_probs, all_draws = [probs], [draws]
        for j in range(1, self.steps):
            ids = draws.long().repeat(pairs, 1)              # [B, 1]: each image's draft, its CFG twin alike
            mask = torch.cat([seen, torch.ones(batch, j, dtype=seen.dtype, device=seen.device)], dim=1)[:, None]
            logits, fed, present = self._step(ids, fed, position + j, mask, KVSegments(past_kv, local))
            local = torch.cat([local, present], dim=4)
            probs, draws = self.head(logits, mix, uniforms[:, j:j + 1])
            all_probs.append(probs)
            all_draws.append(draws)
        return local, torch.cat(all_probs, dim=1), torch.cat(all_draws, dim=1)


class HeadChain(DraftChain):
    """An EAGLE head's chain (runtime/eagle.py): the step inputs take `hidden` [B, W, H] after the
    ids, the feature before each window token; each draft is then fed with the head's own output
    feature of the slot before it (draft 1: of each image's `last` slot; draft j + 1: of draft j),
    EAGLE's recursion, as the step-by-step drafter feeds `features_out`. Outputs as DraftChain's."""

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor,
                uniforms: torch.Tensor):
        return self._draw(input_ids, hidden, positions, attention_mask, past_kv, last, mix, uniforms)

    def _step(self, ids: torch.Tensor, fed: torch.Tensor | None, positions: torch.Tensor, mask: torch.Tensor,
              past_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        return self.model.step(ids, fed, positions, mask, past_kv)  # (logits, features g, present)
