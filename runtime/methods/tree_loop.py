"""Tree drafting for the draft-then-verify methods (sd, cool-sd, lantern with tree=static|dynamic).

One round: the drafter grows a TokenTree below the pending token (runtime.tree: a static shape,
children drawn without replacement; or EAGLE-2's dynamic tree, top-k children kept by cumulative
draft probability); the target scores every node in one pass with the tree mask; verify_trees
walks each image's with the method's acceptance rule (recursive rejection over siblings; the
batch's reads of device rows gathered across images), and the accepted
path's KV rows are committed. The images of a batch go through every round together (ragged
windows), each drawing counter uniforms of its own coordinates (runtime.decoding: a node's draw
and test keyed by its token index and shape node, as the device round keys them), so an image's
tokens do not depend on its batch-mates.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.counter_random import NEXT, TEST
from specrt.runtime.decoding import Decoding
from specrt.runtime.drafter import Drafter
from specrt.runtime.drafting import finish_round, make_drafter
from specrt.runtime.methods.base import Batched
from specrt.runtime.sampling import needs_restriction
from specrt.runtime.tree import DynamicGrowth, StaticGrowth, StaticShape, TokenTree, static_shape
from specrt.runtime.tree_call import GrowthLayout, TreeLayout
from specrt.runtime.verification.rules import AcceptanceRule
from specrt.runtime.verification.trees import TreeOutcome, verify_trees


class TreeMethod(Protocol):
    """What the tree loop reads of a draft-then-verify method (runtime.methods.speculative's
    DraftThenVerify: its tree parameters and its acceptance rule); a protocol, so the loop the
    method calls does not import the method."""

    tree: str
    static_tree: str
    total_tokens: int
    depth: int
    tree_top_k: int
    fused_drafting: bool

    def rule(self, ctx: Decoding) -> AcceptanceRule: ...


TreeObserver = Callable[[Sequence[Optional[TokenTree]], Sequence[Optional[TreeOutcome]]], None]
_observers: list[TreeObserver] = []


@contextmanager
def observing_trees(observer: TreeObserver) -> Iterator[None]:
    """Call observer(trees, outcomes) after each round verified while the block runs (per batch
    position; None: no tree): `specrt plan-tree` counts which sibling rank was accepted through
    the public Pipeline. Outside such a block a round pays one check of an empty list."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def generate_trees(method: TreeMethod, ctx: Decoding, conditions: Conditions) -> np.ndarray:
    """Tokens [N, grid²] of a batch of images, drafted as trees and verified with method.rule(ctx):
    every round grows all unfinished images' trees together (grow_trees: one draft pass per depth)
    and scores them in one target pass; each image verifies with its own counter uniforms."""
    target, rule, total = ctx.target, method.rule(ctx), ctx.num_image_tokens
    target.truncate(0)
    first = ctx.prefill(target, conditions)
    tokens = [[int(t)] for t in first.draws[:, 0]]
    drafter = make_drafter(ctx, method.fused_drafting)
    drafter.start(ctx, conditions, [t[0] for t in tokens], first)
    ctx.stats.record_round(1, len(tokens))
    shape = static_shape(method.static_tree) if method.tree == "static" else None
    layout = one_call_layout(ctx, drafter, shape)
    growth = one_call_growth(ctx, drafter, method) if method.tree == "dynamic" else None
    shape_layout = TreeLayout(shape) if shape is not None else None
    greedy = ctx.sampling.temperature == 0.0
    batch = Batched(len(tokens))
    while batch.drop(ctx, [len(t) == total for t in tokens], drafter):
        images = list(batch.images)
        left = [total - len(tokens[i]) - 1 for i in images]  # drafts that still fit in the image (−1: finished)
        ctx.start_round([len(tokens[i]) if max_depth >= 0 else None for i, max_depth in zip(images, left)])
        if layout is not None or growth is not None:  # every depth of every image's tree in one draft call
            trees = drafter.draft_tree(ctx, layout, left) if layout is not None else \
                drafter.grow_tree(ctx, growth, left, method.total_tokens)
            _verify_and_finish(ctx, drafter, rule, tokens, images, trees)
            continue
        growths: list[Optional[Any]] = []
        node_uniforms = ctx.tree_uniforms(shape_layout) if shape_layout is not None and not greedy else None
        for p, (i, max_depth) in enumerate(zip(images, left)):
            if max_depth < 0:
                growths.append(None)
            elif shape is not None:
                growths.append(StaticGrowth(tokens[i][-1], shape, max_depth, greedy,
                                            node_uniforms[p].tolist() if node_uniforms is not None else None))
            else:
                growths.append(DynamicGrowth(tokens[i][-1], method.depth, method.tree_top_k, method.total_tokens,
                                             max_depth))
        _verify_and_finish(ctx, drafter, rule, tokens, images, grow_trees(ctx, drafter, growths))
    return np.asarray(tokens, dtype=np.int64)


def one_call_layout(ctx: Decoding, drafter: Drafter, shape: Optional[StaticShape]) -> Optional[TreeLayout]:
    """The layout of `shape` where the draft drafts it in one call (runtime/tree_call.py: a draft
    whose runner can, an independent model's or an EAGLE head's, and sampling the head's softmax,
    which no host restriction reshapes between levels); None: grow the trees one pass per depth."""
    if shape is None or needs_restriction(ctx.sampling):
        return None
    layout = TreeLayout(shape)
    return layout if drafter.can_draft_tree(layout) else None


def one_call_growth(ctx: Decoding, drafter: Drafter, method: TreeMethod) -> Optional[GrowthLayout]:
    """The dynamic tree's layout where the draft grows it in one call (runtime/tree_call.py), on
    the same terms as a static tree's (one_call_layout); None: one pass per depth."""
    if needs_restriction(ctx.sampling):
        return None
    growth = GrowthLayout(method.depth, method.tree_top_k)
    return growth if drafter.can_grow_tree(growth) else None


def grow_trees(ctx: Decoding, drafter: Drafter, growths: Sequence[Optional[Any]]) -> list[Optional[TokenTree]]:
    """Grow one tree per image of the batch (StaticGrowth or DynamicGrowth; None: no tree), every
    image's next depth in one draft pass; the growths draw children on the host (StaticGrowth: each
    node with its own counter uniform) or take the rows' top-k."""
    while True:
        asks = [g.pending() if g is not None else [] for g in growths]
        if not any(asks):
            return [g.result() if g is not None else None for g in growths]
        rows = drafter.expand(ctx, [g.tree if ask else None for g, ask in zip(growths, asks)], asks)
        for growth, ask, image_rows in zip(growths, asks, rows):
            if ask:
                growth.receive(image_rows)


def _verify_and_finish(ctx: Decoding, drafter: Drafter, rule: AcceptanceRule, tokens: list[list[int]],
                       images: list[int], trees: Sequence[Optional[TokenTree]]) -> None:
    """Score the round's trees in one target pass (every node's draw with the round's NEXT uniform: a
    leaf's is its bonus token), verify each image's with its own counter uniforms (node n tested with
    the round's TEST uniform of its part at its token index, tree_coins), and commit what was
    accepted (finish_round)."""
    next_uniforms = ctx.uniforms(0, NEXT)
    scored = ctx.run(ctx.target, [tree.window() if tree is not None else None for tree in trees], next_uniforms)
    with ctx.stats.timing("verification"):
        outcomes = verify_trees(scored.probs, trees, rule, tree_coins(ctx, trees), next_uniforms, scored.draws)
    for observe in _observers:
        observe(trees, outcomes)
    finish_round(ctx, drafter, tokens, images, scored,
                 [outcome.path if outcome is not None else None for outcome in outcomes],
                 [outcome.accepted + [outcome.next_token] if outcome is not None else None for outcome in outcomes])


def tree_coins(ctx: Decoding, trees: Sequence[Optional[TokenTree]]) -> list[Optional[np.ndarray]]:
    """Per image, the test uniform of each node of its tree (None: no tree): the round's TEST uniform
    at the node's token index (n − 1 + depth) with the node's part (TokenTree.parts), in one call."""
    width = max((len(tree) for tree in trees if tree is not None), default=0)
    if not width:
        return [None] * len(trees)
    offsets = np.zeros((len(trees), width), dtype=np.int64)
    parts = np.zeros((len(trees), width), dtype=np.int64)
    for p, tree in enumerate(trees):
        if tree is not None:
            offsets[p, :len(tree)] = tree.depths
            parts[p, :len(tree)] = tree.parts if tree.parts is not None else range(len(tree))
    coins = ctx.uniforms(offsets - 1, TEST, parts)
    return [row if tree is not None else None for row, tree in zip(coins, trees)]
