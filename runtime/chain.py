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

import itertools

import numpy as np
import torch
from torch import nn

from specrt.runtime.head import SamplingHead
from specrt.runtime.window import Window


class KVSegments:
    """A cache in segments along the sequence axis (each [L, 2, B, Hkv, C_s, D]), read per layer as a
    model reads its past_kv (`past_kv[i, 0]`: layer i's keys), giving a tuple of the segments' that
    the models' attention joins with the window's own rows in one concatenation
    (models.llamagen_gpt.attend): the cache and the rows drafted so far are never copied together first."""

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

    def _window(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, positions: torch.Tensor,
                attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor):
        """The catch-up window, and its `last` slot per image (the root of what is drafted below
        it): (the window's present rows, the slot's logits [B, 1, V], what it hands on [B, 1, H]
        or None, what it saw [B, C + W], its position [B, 1]); model row i + images is row i's CFG twin."""
        batch = input_ids.shape[0]
        logits, out, local = self._step(input_ids.long(), hidden, positions.long(), attention_mask, past_kv)
        rows = torch.arange(batch, device=input_ids.device)
        slot = last.long().repeat(batch // mix.shape[0])
        return (local, logits[rows, slot][:, None], None if out is None else out[rows, slot][:, None],
                attention_mask[rows, slot], positions.long()[rows, slot][:, None])

    def _draw(self, input_ids: torch.Tensor, fed: torch.Tensor | None, positions: torch.Tensor,
              attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor,
              uniforms: torch.Tensor):
        """The window, then the drafts one after another (the formulas of the module docstring),
        each draft fed with what the slot before it hands on (`_step`)."""
        batch = input_ids.shape[0]
        pairs = batch // mix.shape[0]  # model rows per image: 2 under CFG
        local, logits, fed, seen, position = self._window(input_ids, fed, positions, attention_mask, past_kv, last, mix)
        probs, draws = self.head(logits, mix, uniforms[:, :1])
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


class HeadSteps:
    """An EAGLE head's model step for the drafting modules: the step inputs take `hidden` [B, W, H]
    after the ids, the feature before each window token, and the head hands on its own output
    feature g of each slot, which feeds the token after it (EAGLE's recursion, as the
    step-by-step drafter feeds `features_out`)."""

    def _step(self, ids: torch.Tensor, fed: torch.Tensor | None, positions: torch.Tensor, mask: torch.Tensor,
              past_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        return self.model.step(ids, fed, positions, mask, past_kv)  # (logits, features g, present)


class HeadChain(HeadSteps, DraftChain):
    """An EAGLE head's chain (runtime/eagle.py): each draft is fed with the head's own output
    feature of the slot before it (draft 1: of each image's `last` slot; draft j + 1: of draft j).
    Inputs as DraftChain's with `hidden` after the ids; outputs as DraftChain's."""

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor,
                uniforms: torch.Tensor):
        return self._draw(input_ids, hidden, positions, attention_mask, past_kv, last, mix, uniforms)


class DraftTree(DraftChain):
    """A static tree's drafts in one call (runtime/tree_call.py: the host's side and the layout):
    the catch-up window as DraftChain's, the root's children drawn from the row of each image's
    `last` slot, then each level of fed nodes run at once, a node at depth d fed at
    positions[last] + d and seeing what the root saw, its fed ancestors and itself.

    A node's first child is the head's draw from its row (with its uniform, as every step
    draws); child k > 1 is drawn without replacement: the row with children 1..k − 1 zeroed,
    its inverse CDF at u·(mass left) (runtime.verification.siblings.draws_without_replacement's formula,
    in float32 here). Which children a row had the mass for is the host's to check (it has the
    rows: runtime.tree_call.tree_from_draws), which keeps that bookkeeping out of the graph.

    (ids, positions, mask, past_kv, last, mix, uniforms [I, nodes − 1]) -> (present_kv [.., W + fed, ..],
    probs [I, inner, V], draws [I, nodes − 1] int32), in the layout's orders."""

    def __init__(self, model: nn.Module, layout):
        super().__init__(model, 1)
        self.layout = layout
        # the layout's index lists as buffers, made once (a CUDA graph's capture cannot copy them
        # from the host); node n's token is column where[n][1] of the tokens drawn at level where[n][0]
        self.levels = [[0], *layout.levels]
        self.ranks = [max(len(layout.children[n]) for n in level) for level in self.levels]
        where: dict[int, tuple[int, int]] = {}
        for depth, level in enumerate(self.levels):
            for i, node in enumerate(level):
                for rank, child in enumerate(layout.children[node]):
                    where[child] = (depth, i * self.ranks[depth] + rank)
        fed: list[int] = []
        ancestry = Window.tree(range(layout.nodes), layout.parents).ancestry()  # [n, m]: m is n or above it
        for depth, level in enumerate(self.levels):
            if depth:  # a level's nodes were drawn at the level before: their columns there
                fed += level
                self._constant(f"at{depth}", [where[n][1] for n in level])
                self._constant(f"ancestry{depth}", ancestry[np.ix_(level, fed)].tolist())
            self._constant(f"firsts{depth}", [layout.children[n][0] - 1 for n in level])
            for rank in range(1, self.ranks[depth]):  # a node with fewer children repeats its last (ignored)
                self._constant(f"kids{depth}_{rank}",
                               [layout.children[n][min(rank, len(layout.children[n]) - 1)] - 1 for n in level])
            if depth:  # each node's parent among the level before's nodes (its feature feeds the node)
                self._constant(f"up{depth}", [self.levels[depth - 1].index(layout.parents[n]) for n in level])
        offsets = list(itertools.accumulate((len(level) * r for level, r in zip(self.levels, self.ranks)), initial=0))
        self._constant("drafted", [offsets[where[n][0]] + where[n][1] for n in range(1, layout.nodes)])

    def _constant(self, name: str, values: list) -> None:
        self.register_buffer(name, torch.tensor(values, dtype=torch.bool if isinstance(values[0], list) else torch.long),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
                past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor, uniforms: torch.Tensor):
        return self._tree(input_ids, None, positions, attention_mask, past_kv, last, mix, uniforms)

    def _tree(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, positions: torch.Tensor,
              attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor,
              uniforms: torch.Tensor):
        """The levels (the class docstring), each node fed with what its parent hands on (`_step`)."""
        batch = input_ids.shape[0]
        pairs = batch // mix.shape[0]
        local, level_logits, level_out, seen, position = self._window(input_ids, hidden, positions, attention_mask,
                                                                      past_kv, last, mix)
        vocab = torch.arange(level_logits.shape[-1], device=input_ids.device, dtype=torch.float32)
        all_probs, all_tokens = [], []
        for depth, level in enumerate(self.levels):
            if depth:  # run this level's nodes after the window and the levels before
                ids = all_tokens[depth - 1].index_select(1, getattr(self, f"at{depth}"))
                ancestry = getattr(self, f"ancestry{depth}").to(seen.dtype)
                mask = torch.cat([seen[:, None].expand(-1, len(level), -1), ancestry.expand(batch, -1, -1)], dim=2)
                fed = None if level_out is None else level_out.index_select(1, getattr(self, f"up{depth}"))
                level_logits, level_out, present = self._step(ids.long().repeat(pairs, 1), fed,
                                                              (position + depth).expand(-1, len(level)), mask,
                                                              KVSegments(past_kv, local))
                local = torch.cat([local, present], dim=4)
            # every node's children, rank after rank ([I, nodes, rank]): rank 0 is the head's draw,
            # rank k a draw without ranks 0..k − 1
            probs, draws = self.head(level_logits, mix, uniforms.index_select(1, getattr(self, f"firsts{depth}")))
            all_probs.append(probs)
            picks, kept = [draws.float()], probs
            for rank in range(1, self.ranks[depth]):
                kept = torch.where(picks[-1][..., None] == vocab, 0.0, kept)  # without ranks 0..rank − 1
                picks.append(_inverse_cdf(kept, uniforms.index_select(1, getattr(self, f"kids{depth}_{rank}"))))
            all_tokens.append(torch.stack(picks, dim=2).reshape(probs.shape[0], -1))
        tokens = torch.cat(all_tokens, dim=1).index_select(1, self.drafted)
        return local, torch.cat(all_probs, dim=1), tokens.to(torch.int32)


class DraftGrowth(DraftChain):
    """A dynamic tree (EAGLE-2's growth, runtime.tree.DynamicGrowth) grown in one call
    (runtime/tree_call.py GrowthLayout: the host's side). The catch-up window as DraftChain's;
    then `depth` passes, each ranking its frontier's rows as the level path's passes do:

        pass 1:   the root's row (each image's `last` slot): its top_k tokens are the candidates,
                  scored by log mass
        pass d:   the top_k candidates of pass d − 1 by score are the frontier (ties: the
                  lower index, `_top`, as the host's stable sort; any order would be exact:
                  the tree is verified as point masses), fed at positions[last] + d − 1 under
                  the root's `seen` row and their fed ancestors; each frontier row's top_k
                  tokens are pass d's candidates, scored by their parent's score + log mass

    Scores are float64 sums of logs of the float32 rows, as the host's growth counts them, so the
    frontiers are the ones it would choose. Candidates a row had no mass for score −inf (ranked
    last; the host drops them); nothing is sampled, so the graph takes no uniforms. Which
    candidates make the tree (the total_tokens best) is the host's, from the scores.

    (ids, positions, mask, past_kv, last, mix) -> (present_kv [.., W + (depth − 1)·top_k, ..],
    tokens [I, C] int32, scores [I, C] float64, fronts [I, (depth − 1)·top_k] int64), C = top_k +
    (depth − 1)·top_k²: pass after pass, a pass's candidates frontier node-major, best first; fronts:
    each fed node's index among its pass's candidates, fed node f at present slot W + f."""

    def __init__(self, model: nn.Module, depth: int, top_k: int):
        super().__init__(model, 1)
        self.depth, self.top_k = depth, top_k
        self.register_buffer("own", torch.eye(top_k, dtype=torch.bool), persistent=False)  # a fed node sees itself

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
                past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor):
        return self._grow(input_ids, None, positions, attention_mask, past_kv, last, mix)

    def _grow(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, positions: torch.Tensor,
              attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor):
        """The passes (the class docstring), each frontier node fed with what its parent hands on (`_step`)."""
        batch, images, k = input_ids.shape[0], mix.shape[0], self.top_k
        pairs = batch // images
        local, level_logits, level_out, seen, position = self._window(input_ids, hidden, positions, attention_mask,
                                                                      past_kv, last, mix)
        scores = torch.zeros(images, 1, 1, dtype=torch.float64, device=input_ids.device)  # the root's
        own = self.own.to(seen.dtype)[None].expand(images, -1, -1)
        all_tokens, all_scores, fronts, ancestry = [], [], [], None
        for depth in range(1, self.depth + 1):
            masses, tokens = _top(self.head.distribution(level_logits, mix), k)  # [I, F, k]
            scores = (scores + torch.log(masses.double())).reshape(images, -1)
            tokens = tokens.reshape(images, -1)
            all_tokens.append(tokens)
            all_scores.append(scores)
            if depth == self.depth:
                break
            scores, front = _top(scores, k)                  # the frontier, best first
            fronts.append(front)
            scores = scores[..., None]
            parents = torch.div(front, k, rounding_mode="floor")  # each one's parent, in the last frontier
            ancestry = own if ancestry is None else torch.cat(
                [ancestry.gather(1, parents[..., None].expand(-1, -1, ancestry.shape[2])), own], dim=2)
            mask = torch.cat([seen[:, None].expand(-1, k, -1), ancestry.repeat(pairs, 1, 1)], dim=2)
            fed = None if level_out is None else \
                level_out.gather(1, parents.repeat(pairs, 1)[..., None].expand(-1, -1, level_out.shape[2]))
            level_logits, level_out, present = self._step(tokens.gather(1, front).repeat(pairs, 1), fed,
                                                          (position + depth).expand(-1, k), mask,
                                                          KVSegments(past_kv, local))
            local = torch.cat([local, present], dim=4)
        front = torch.cat(fronts, dim=1) if fronts else torch.zeros(images, 0, dtype=torch.long, device=seen.device)
        return local, torch.cat(all_tokens, dim=1).to(torch.int32), torch.cat(all_scores, dim=1), front


class HeadTree(HeadSteps, DraftTree):
    """An EAGLE head's static tree in one call: DraftTree's levels with `hidden` after the ids,
    each node fed with its parent's output feature (the root's: of each image's `last` slot),
    as EagleDrafter feeds its nodes level by level. Outputs as DraftTree's."""

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor,
                uniforms: torch.Tensor):
        return self._tree(input_ids, hidden, positions, attention_mask, past_kv, last, mix, uniforms)


class HeadGrowth(HeadSteps, DraftGrowth):
    """An EAGLE head's dynamic tree in one call: DraftGrowth's passes with `hidden` after the ids,
    each frontier node fed with its parent's output feature. Outputs as DraftGrowth's."""

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attention_mask: torch.Tensor, past_kv: torch.Tensor, last: torch.Tensor, mix: torch.Tensor):
        return self._grow(input_ids, hidden, positions, attention_mask, past_kv, last, mix)


def _top(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest along the last axis, best first, ties to the lower index: ONNX TopK's rule,
    which the exported graph follows, and the host's stable sort's. torch.topk promises no order
    among ties, so the module run eagerly (PyTorch backend, export --verify's reference) sorts
    stably instead: both give the same candidates, rows without mass (all ties at 0) included."""
    if torch.onnx.is_in_onnx_export():
        return torch.topk(values, k, dim=-1)
    ranked, order = torch.sort(values, dim=-1, descending=True, stable=True)
    return ranked[..., :k], order[..., :k]


def _inverse_cdf(rows: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row [I, n, V] (unnormalised: a row without its earlier draws), its inverse CDF at
    uniforms [I, n] times its mass: tokens [I, n] as float32 (a count, as the head counts, so
    TensorRT needs no integer reduction)."""
    cdf = torch.cumsum(rows, dim=-1)
    below = (cdf <= (uniforms.float() * cdf[..., -1])[..., None]).float().sum(dim=-1)
    return torch.clamp(below, max=float(rows.shape[-1] - 1))

