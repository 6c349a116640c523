"""The drafting interface the tree loop (and any chain loop) calls, and the independent draft behind it.

A round of draft-then-verify, as runtime.methods.tree_loop runs it:

    drafter.start(ctx, condition, first, target_prefill)      # once per image
    while the image is not complete:
        tree = grow a TokenTree with drafter.expand(...)       # or drafter.propose_chain(ctx, L)
        scored = ctx.run(target, tree.window())                # one target pass, tree mask
        outcome = verify_tree(...)                             # runtime.verification
        target.commit(outcome.path)
        drafter.rollback(committed)                            # drop everything drafted this round
        drafter.extend(ctx, outcome.accepted + [outcome.next_token], Verified(scored, outcome.path))

The committed sequence is the image tokens decided so far; its last one is *pending*: sampled,
but not yet run through the target (its KV and hidden row come with the next verification pass,
where it is the root of the tree, window slot 0). `Verified` hands the drafter the target's own
step output for the committed path, so a drafter fed by the target's hidden states (an EAGLE
head: fc(cat(embedding of token t+1, target hidden at t))) can read the rows of exactly the
tokens that were committed (window slots `path`: the old pending token, then the accepted drafts);
an independent draft model ignores it. `start` gets the target's prefill output for the same reason
(its row is the hidden state that image token 0 is paired with).

Within one round the loop grows a single tree and calls `expand` only for nodes whose ancestors
are the root or were expanded earlier in that round, so a drafter may keep per-node state for the
round (an EAGLE head: its own predicted features of the nodes, which feed their children);
`rollback` ends the round.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.runner import ModelRunner, StepOutput
from specrt.runtime.window import Window

if TYPE_CHECKING:  # pragma: no cover
    from specrt.runtime.methods.base import Decoding
    from specrt.runtime.tree import TokenTree


@dataclass
class Verified:
    """The target's verification pass as the drafter sees it: its step output (rows [I, W, ...] by
    window slot; its hidden rows where the backend returns them) and the window slots of the
    committed path in order (slot 0, the old pending token, first; then each accepted draft)."""

    output: StepOutput
    slots: list[int]


class Drafter(ABC):
    """What a draft-then-verify loop asks of a draft, whatever kind it is (an independent model, an
    EAGLE head). Rows are draft distributions over the vocabulary after the sampling restriction
    (CFG, temperature, top-k, top-p as for the target; Decoding.run applies them), on the host."""

    @abstractmethod
    def start(self, ctx: "Decoding", condition: Conditions, first: int, target: StepOutput) -> None:
        """Begin an image: reset, prefill on `condition`; `first` is image token 0 (pending), drawn from
        the target's prefill output `target`."""

    @abstractmethod
    def extend(self, ctx: "Decoding", tokens: Sequence[int], verified: Verified) -> None:
        """The committed sequence grew by `tokens` (the accepted drafts, then the new pending token);
        `verified` is the pass that decided them."""

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Forget everything after the first `length` committed image tokens (this round's drafts):
        cheap, and the next call drafts after the committed sequence again."""

    @abstractmethod
    def propose_chain(self, ctx: "Decoding", length: int) -> tuple[list[int], list[Any]]:
        """`length` drafts after the committed sequence, drawn one after another from the draft's rows;
        (tokens, the row each was drawn from)."""

    @abstractmethod
    def expand(self, ctx: "Decoding", tree: "TokenTree", nodes: Sequence[int]) -> list[Any]:
        """The draft's row after each of `nodes` of `tree` (node 0 = the pending token; each node sees
        its ancestors, a tree attention mask), one draft pass for all of them; commits nothing
        of the tree."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


class ModelDrafter(Drafter):
    """An independent draft model (a ModelRunner of its own, sharing the tokenizer).

    Its KV cache holds a prefix of the sequence it last ran (`cached`, image tokens); before each
    pass it keeps the longest part of that prefix still committed (free: runner.truncate) and
    feeds the rest, so accepted chain drafts are never recomputed and rejected ones cost nothing.

    Trees: on a runner that stages rows (ModelRunner.stage), every node is run once. The round's
    first pass catches up and runs the root; each later pass feeds only the nodes not yet run,
    under a mask that shows them their staged ancestors (Window.level); after verification the
    accepted path's staged rows become committed rows (ModelRunner.adopt), so the next round
    feeds only the new pending token. Other runners re-feed the tree's closure each pass.
    """

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.tokens: list[int] = []   # the committed sequence, pending token last
        self.cached: list[int] = []   # image tokens whose KV rows the runner holds, in order
        self._staged: dict[int, int] = {}  # tree node -> its staged row, this round

    def start(self, ctx, condition, first, target):
        self.runner.truncate(0)
        ctx.prefill(self.runner, condition)
        self.tokens, self.cached, self._staged = [int(first)], [], {}

    def extend(self, ctx, tokens, verified):
        if self._staged:  # keep the accepted path's rows: the root, then each accepted node that was run
            path = []
            for node in verified.slots:
                if node not in self._staged:
                    break
                path.append(node)
            self.runner.adopt([self._staged[node] for node in path])
            self.cached = self.tokens + [int(t) for t in tokens[:len(path) - 1]]
            self._staged = {}
        self.tokens += [int(t) for t in tokens]

    def rollback(self, length):
        del self.tokens[length:]

    def _unfed(self, sequence: Sequence[int]) -> list[int]:
        """Cut the cache back to the longest prefix of sequence[:-1] it holds; the tokens to feed
        after it (at least the last one)."""
        keep = common_prefix(self.cached, sequence[:-1])
        self.runner.truncate(self.runner.spec.cond_len + keep)
        self._staged = {}
        del self.cached[keep:]
        return list(sequence[keep:])

    def propose_chain(self, ctx, length):
        drafts: list[int] = []
        rows: list[Any] = []
        for _ in range(length):
            sequence = self.tokens + drafts
            feed = self._unfed(sequence)
            out = ctx.run(self.runner, Window.chain(feed))
            self.runner.commit(range(len(feed)))
            self.cached = list(sequence)
            drafts.append(int(out.draws[0, -1]))
            rows.append(out.probs[0, -1].copy())  # the runner reuses this buffer two steps on (a device row stays there)
        return drafts, rows

    def expand(self, ctx, tree, nodes):
        if self.runner.stages_trees and 0 in self._staged:
            return self._expand_level(ctx, tree, nodes)
        out, slot, below = self._run_closure(ctx, tree, nodes)
        if self.runner.stages_trees:  # the round's first pass: the root (and its closure) stays staged
            self.runner.stage([slot[n] for n in (0, *below)])
            self._staged = {n: i for i, n in enumerate((0, *below))}
        return [np.array(out.probs[0, slot[n]]) for n in nodes]

    def _run_closure(self, ctx, tree, nodes) -> tuple[StepOutput, dict[int, int], list[int]]:
        """Catch up on the committed tokens, then run the root and the closure of `nodes` below it
        under the tree mask; only the tokens before the root are committed.
        (output, window slot of each node run, the nodes run below the root)."""
        feed = self._unfed(self.tokens)  # ends with the pending token, the tree's root
        below = [n for n in tree.closure(nodes) if n]  # the tree's nodes the window needs, root excluded
        if len(feed) + len(below) > self.runner.max_window and len(feed) > 1:
            ctx.run(self.runner, Window.chain(feed[:-1]))  # catch up first, so the tree fits the window
            self.runner.commit(range(len(feed) - 1))
            self.cached, feed = self.tokens[:-1], feed[-1:]
        root = len(feed) - 1
        slot = {0: root, **{n: root + 1 + i for i, n in enumerate(below)}}
        parents = [*range(-1, root), *(slot[tree.parents[n]] for n in below)]
        out = ctx.run(self.runner, Window.tree([*feed, *(tree.tokens[n] for n in below)], parents))
        self.runner.commit(range(root))  # the committed tokens before the root
        self.cached = self.tokens[:-1]
        return out, slot, below

    def _expand_level(self, ctx, tree, nodes):
        """A later pass of the round: only the nodes not yet run, each seeing its staged ancestors."""
        new = [n for n in tree.closure(nodes) if n not in self._staged]
        if any(n not in new for n in nodes):
            raise ValueError("expand: a node asked for was run in an earlier pass of this round")
        slot = {n: w for w, n in enumerate(new)}
        staged = np.zeros((len(new), len(self._staged)), dtype=bool)
        for w, n in enumerate(new):
            ancestor = tree.parents[n]
            while ancestor >= 0:
                if ancestor in self._staged:
                    staged[w, self._staged[ancestor]] = True
                ancestor = tree.parents[ancestor]
        window = Window.level([tree.tokens[n] for n in new], [slot.get(tree.parents[n], -1) for n in new],
                              [tree.depths[n] for n in new], staged)
        out = ctx.run(self.runner, window)
        self.runner.stage(range(len(new)))
        self._staged.update({n: len(self._staged) + w for w, n in enumerate(new)})
        return [np.array(out.probs[0, slot[n]]) for n in nodes]


def make_drafter(ctx: "Decoding") -> Drafter:
    """The drafter over this call's draft: an EAGLE head (runtime.eagle.EagleDrafter, fed the
    target's hidden rows) or an independent model (ModelDrafter)."""
    from specrt.runtime.eagle import EagleDrafter, HeadRunner  # eagle builds on this module

    if isinstance(ctx.draft, HeadRunner):
        return EagleDrafter(ctx.draft, ctx.target)
    return ModelDrafter(ctx.draft)
