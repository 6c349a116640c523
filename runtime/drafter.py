"""The drafting interface the draft-then-verify loops call (the Drafter protocol), whatever the draft.

A round of draft-then-verify for a batch of images, as runtime.methods.tree_loop runs it (lists
are indexed by batch position; None marks an image with nothing to do this round):

    drafter.start(ctx, conditions, firsts, target_prefill)          # once per batch
    while some image is not complete:
        trees = grow_trees(ctx, drafter, ...)                        # drafter.expand per depth
                                                                     # (or drafter.propose_chain(ctx, lengths))
        scored = ctx.run(target, [tree.window() ...])                # one target pass, tree masks
        outcomes = verify_trees(...)  # each image's walk, reads batched # runtime.verification.trees
        target.commit([outcome.path ...])
        drafter.rollback(committed lengths)                          # drop what was drafted this round
        drafter.extend(ctx, [outcome.accepted + [outcome.next_token] ...], Verified(scored, paths))
        drafter.retain(kept positions) when finished images leave the batch

Every call runs the whole batch through the draft at once (ragged windows), and each image keeps
its own state and committed sequence and draws counter uniforms of its own coordinates (a chain's
draft j with the round's DRAFT uniform at index n + j: runtime.decoding): an image's tokens are
the same alone or in any batch. The loop calls ctx.start_round before the drafter's calls of a round.

The committed sequence is the image tokens decided so far; its last one is *pending*: sampled,
but not yet run through the target (its KV and hidden row come with the next verification pass,
where it is the root of the tree, window slot 0). `Verified` hands the drafter the target's own
step output for the committed paths, so a drafter fed by the target's hidden states (an EAGLE
head: fc(cat(embedding of token t+1, target hidden at t))) can read the rows of exactly the
tokens that were committed (window slots `path`: the old pending token, then the accepted drafts);
an independent draft model ignores it. `start` gets the target's prefill output for the same reason
(its row is the hidden state that image token 0 is paired with).

Within one round the loop grows one tree per image and calls `expand` only for nodes whose
ancestors are the root or were expanded earlier in that round, so a drafter may keep per-node
state for the round (its staged KV rows; an EAGLE head's own predicted features of the nodes,
which feed their children); `rollback` ends the round.

The drafters: an independent model (runtime.model_drafter) and an EAGLE head (runtime.eagle);
runtime.drafting picks one for a generate call.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from specrt.runtime.conditions import Conditions
from specrt.runtime.decoding import Decoding
from specrt.runtime.runner import StepOutput
from specrt.runtime.tree import TokenTree


@dataclass
class Verified:
    """The target's verification pass as the drafter sees it: its step output (rows [I, W, ...] by
    window slot; its hidden rows where the backend returns them) and, per image, the window slots
    of the committed path in order (slot 0, the old pending token, first; then each accepted draft)."""

    output: StepOutput
    slots: list[Optional[list[int]]]  # per image (None: the image had no pass)


class Drafter(ABC):
    """What a draft-then-verify loop asks of a draft, whatever kind it is (an independent model, an
    EAGLE head), for a batch of images at once. Rows are draft distributions over the vocabulary
    after the sampling restriction (CFG, temperature, top-k, top-p as for the target; Decoding.run
    applies them), indexable like numpy."""

    @abstractmethod
    def start(self, ctx: Decoding, conditions: Conditions, firsts: Sequence[int], target: StepOutput) -> None:
        """Begin the batch: reset, prefill on `conditions`; firsts[p] is image p's token 0 (pending),
        drawn from the target's prefill output `target`."""

    @abstractmethod
    def extend(self, ctx: Decoding, tokens: Sequence[Optional[Sequence[int]]], verified: Verified) -> None:
        """Each image's committed sequence grew by tokens[p] (the accepted drafts, then the new
        pending token; None: unchanged); `verified` is the pass that decided them."""

    @abstractmethod
    def rollback(self, lengths: Sequence[Optional[int]]) -> None:
        """Forget everything after image p's first lengths[p] committed tokens (this round's
        drafts): cheap, and the next call drafts after the committed sequences again."""

    @abstractmethod
    def retain(self, positions: Sequence[int]) -> None:
        """Keep only these batch positions' state, in order (finished images left the batch;
        Decoding.retain has already shrunk the runners)."""

    @abstractmethod
    def propose_chain(self, ctx: Decoding, lengths: Sequence[int]) -> tuple[list[list[int]], list[list[Any]]]:
        """lengths[p] drafts after image p's committed sequence, drawn one after another from the
        draft's rows, all images in one pass per draft position; (tokens, the row each was drawn from:
        per image a list of rows, or one [L, V] host block)."""

    @abstractmethod
    def expand(self, ctx: Decoding, trees: Sequence[Optional[TokenTree]],
               nodes: Sequence[Sequence[int]]) -> list[list[Any]]:
        """The draft's row after each of nodes[p] of trees[p] (node 0 = the pending token; each node
        sees its ancestors, a tree mask), one draft pass for every image; commits nothing of the trees."""

    # A whole tree in one draft call (runtime/tree_call.py), where the draft's runner can and
    # `fused` (the method's fused_drafting) allows: the tree loop then calls draft_tree (a static
    # shape's TreeLayout) or grow_tree (a dynamic tree's GrowthLayout) once a round instead of
    # `expand` once a depth, for the same trees. A chain likewise (propose_chain, one call).
    fused = True

    def can_draft_tree(self, layout: Any) -> bool:
        return False

    def can_grow_tree(self, layout: Any) -> bool:
        return False

    def draft_tree(self, ctx: Decoding, layout: Any, max_depths: Sequence[int]) -> list[Optional[TokenTree]]:
        """Each image's static tree below its pending token (max_depths[p]: the drafts it has left;
        < 0: no tree, 0: the root alone), as `expand` level by level would draft it."""
        raise NotImplementedError(f"{type(self).__name__} drafts no trees in one call")

    def grow_tree(self, ctx: Decoding, layout: Any, max_depths: Sequence[int],
                  total_tokens: int) -> list[Optional[TokenTree]]:
        """Each image's dynamic tree below its pending token, as runtime.tree.DynamicGrowth grows it."""
        raise NotImplementedError(f"{type(self).__name__} grows no trees in one call")
