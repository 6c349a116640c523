"""The drafting interface the draft-then-verify loops call, and the independent draft behind it.

A round of draft-then-verify for a batch of images, as runtime.methods.tree_loop runs it (lists
are indexed by batch position; None marks an image with nothing to do this round):

    drafter.start(ctx, conditions, firsts, target_prefill)          # once per batch
    while some image is not complete:
        trees = grow_trees(ctx, drafter, ...)                        # drafter.expand per depth
                                                                     # (or drafter.propose_chain(ctx, lengths))
        scored = ctx.run(target, [tree.window() ...])                # one target pass, tree masks
        outcomes = verify_trees(...)  # each image's walk, reads batched # runtime.verification
        target.commit([outcome.path ...])
        drafter.rollback(committed lengths)                          # drop what was drafted this round
        drafter.extend(ctx, [outcome.accepted + [outcome.next_token] ...], Verified(scored, paths))
        drafter.retain(kept positions) when finished images leave the batch

Every call runs the whole batch through the draft at once (ragged windows), and each image keeps
its own state, random stream and committed sequence: an image's tokens are the same alone or in
any batch.

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
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.runner import ModelRunner, StepOutput
from specrt.runtime.tree import TokenTree, level_window
from specrt.runtime.tree_call import grown_tree, tree_from_draws
from specrt.runtime.verification.siblings import SAMPLED, TOP
from specrt.runtime.window import Window, chains

if TYPE_CHECKING:  # pragma: no cover
    from specrt.runtime.methods.base import Decoding


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
    def start(self, ctx: "Decoding", conditions: Conditions, firsts: Sequence[int], target: StepOutput) -> None:
        """Begin the batch: reset, prefill on `conditions`; firsts[p] is image p's token 0 (pending),
        drawn from the target's prefill output `target`."""

    @abstractmethod
    def extend(self, ctx: "Decoding", tokens: Sequence[Optional[Sequence[int]]], verified: Verified) -> None:
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
    def propose_chain(self, ctx: "Decoding", lengths: Sequence[int]) -> tuple[list[list[int]], list[list[Any]]]:
        """lengths[p] drafts after image p's committed sequence, drawn one after another from the
        draft's rows, all images in one pass per draft position; (tokens, the row each was drawn from:
        per image a list of rows, or one [L, V] host block)."""

    # per image, the draft head's own draw from each row the last `expand` returned (None: not
    # kept): drawn with a stream uniform in the same pass, it is a free first child of its node
    expanded_draws: Optional[list[Optional[list[int]]]] = None

    @abstractmethod
    def expand(self, ctx: "Decoding", trees: Sequence[Optional["TokenTree"]],
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

    def draft_tree(self, ctx: "Decoding", layout: Any, max_depths: Sequence[int]) -> list[Optional["TokenTree"]]:
        """Each image's static tree below its pending token (max_depths[p]: the drafts it has left;
        < 0: no tree, 0: the root alone), as `expand` level by level would draft it."""
        raise NotImplementedError(f"{type(self).__name__} drafts no trees in one call")

    def grow_tree(self, ctx: "Decoding", layout: Any, max_depths: Sequence[int],
                  total_tokens: int) -> list[Optional["TokenTree"]]:
        """Each image's dynamic tree below its pending token, as runtime.tree.DynamicGrowth grows it."""
        raise NotImplementedError(f"{type(self).__name__} grows no trees in one call")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    if len(a) <= len(b) and a == b[:len(a)]:  # the usual case, a cache that is a prefix: compared in C
        return len(a)
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


class ModelDrafter(Drafter):
    """An independent draft model (a ModelRunner of its own, sharing the tokenizer).

    Its KV cache holds, per image, a prefix of the sequence it last ran (`cached`, image tokens);
    before each pass it keeps the longest part of that prefix still committed (free:
    runner.truncate) and feeds the rest, so accepted chain drafts are never recomputed and
    rejected ones cost nothing.

    Trees: on a runner that stages rows (ModelRunner.stage), every node is run once. The round's
    first pass catches up and runs the roots; each later pass feeds only the nodes not yet run,
    under a mask that shows them their staged ancestors (Window.level); after verification the
    accepted path's staged rows become committed rows (ModelRunner.adopt), so the next round
    feeds only the new pending token. Other runners re-feed each tree's closure every pass.
    """

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.tokens: list[list[int]] = []   # per image: the committed sequence, pending token last
        self.cached: list[list[int]] = []   # per image: image tokens whose KV rows the runner holds
        self._staged: list[dict[int, int]] = []   # per image: tree node -> its staged row, this round
        self._trees: list[Any] = []               # per image: the tree those nodes belong to

    def start(self, ctx, conditions, firsts, target):
        self.runner.truncate(0)
        ctx.prefill(self.runner, conditions)
        count = len(firsts)
        self.tokens, self.cached = [[int(f)] for f in firsts], [[] for _ in range(count)]
        self._staged, self._trees = [{} for _ in range(count)], [None] * count

    def retain(self, positions):
        for name in ("tokens", "cached", "_staged", "_trees"):
            setattr(self, name, [getattr(self, name)[p] for p in positions])

    def extend(self, ctx, tokens, verified):
        adopt: list[list[int]] = [[] for _ in self.tokens]
        for p, new in enumerate(tokens):
            if new is None:
                continue
            if self._staged[p]:  # keep the accepted path's rows: the root, then each accepted node run
                path = _staged_path(self._trees[p], self._staged[p], new[:-1])
                adopt[p] = [self._staged[p][node] for node in path]
                self.cached[p] = self.tokens[p] + [int(t) for t in new[:len(path) - 1]]
            self.tokens[p] += [int(t) for t in new]
        if any(self._staged):
            self.runner.adopt(adopt)
            self._staged = [{} for _ in self.tokens]

    def rollback(self, lengths):
        for tokens, length in zip(self.tokens, lengths):
            if length is not None:
                del tokens[length:]

    def _unfed(self, sequences: Sequence[Optional[Sequence[int]]]) -> list[Optional[list[int]]]:
        """Cut each image's cache back to the longest prefix of sequences[p][:-1] it holds (None:
        keep it); the tokens to feed after it (at least the last one). Staged rows are dropped."""
        keeps = [common_prefix(cached, sequence[:-1]) if sequence is not None else len(cached)
                 for cached, sequence in zip(self.cached, sequences)]
        cond_len = self.runner.spec.cond_len
        self.runner.truncate([cond_len + keep for keep in keeps])  # a list: one image's takes the int path
        self._staged = [{} for _ in self.tokens]
        feeds: list[Optional[list[int]]] = []
        for cached, sequence, keep in zip(self.cached, sequences, keeps):
            del cached[keep:]
            feeds.append(list(sequence[keep:]) if sequence is not None else None)
        return feeds

    def propose_chain(self, ctx, lengths):
        drafts: list[list[int]] = [[] for _ in lengths]
        rows: list[list[Any]] = [[] for _ in lengths]
        for step in range(max(lengths, default=0)):
            sequences = [self.tokens[p] + drafts[p] if step < length else None for p, length in enumerate(lengths)]
            feeds = self._unfed(sequences)
            out = ctx.run(self.runner, chains(feeds))
            self.runner.commit([range(len(f)) if f is not None else None for f in feeds])
            for p, feed in enumerate(feeds):
                if feed is not None:
                    self.cached[p] = list(sequences[p])
                    drafts[p].append(int(out.draws[p, len(feed) - 1]))
                    rows[p].append(out.probs[p, len(feed) - 1].copy())  # the buffer is reused two steps on
        return drafts, rows

    def expand(self, ctx, trees, nodes):
        self.runner.rows_to_host = True  # every asked row is read on the host (the tree's draws)
        try:
            return self._expand(ctx, trees, nodes)
        finally:
            self.runner.rows_to_host = False

    def _expand(self, ctx, trees, nodes):
        rows: list[list[Any]] = [[] for _ in trees]
        self.expanded_draws = [None for _ in trees]
        staging = self.runner.stages_trees
        later = [tree is not None and staging and 0 in self._staged[p] for p, tree in enumerate(trees)]
        first = [tree is not None and not late for tree, late in zip(trees, later)]
        if any(first) and any(later):  # a first pass truncates, which would drop the others' staged nodes
            raise ValueError("expand: every image of a pass must be at the same phase of its round")
        if any(first):
            self._run_closures(ctx, [t if f else None for t, f in zip(trees, first)], nodes, rows)
        if any(later):
            self._run_level(ctx, [t if late else None for t, late in zip(trees, later)], nodes, rows)
        return rows

    def _catch_up(self, ctx: "Decoding", feeds: list[Optional[list[int]]],
                  below: Sequence[int]) -> list[Optional[list[int]]]:
        """Where feeds[p] and the below[p] tree rows run after it would overflow the window, run
        and commit the tokens before its root first (a pass of their own, drawing the uniforms
        the one window would); the feeds left for the tree pass."""
        long = [f is not None and len(f) > 1 and len(f) + b > self.runner.max_window for f, b in zip(feeds, below)]
        if not any(long):
            return feeds
        catch = [f[:-1] if too else None for f, too in zip(feeds, long)]
        ctx.run(self.runner, [Window.chain(c) if c is not None else None for c in catch])
        self.runner.commit([range(len(c)) if c is not None else None for c in catch])
        return [f[-1:] if too else f for f, too in zip(feeds, long)]

    def _run_closures(self, ctx, trees, nodes, rows) -> None:
        """Catch up on the committed tokens, then run each root and the closure of its nodes below
        it under the tree mask; only the tokens before the roots are committed (the round's first
        pass; on a staging runner the roots, and what ran below them, stay staged)."""
        feeds = self._unfed([self.tokens[p] if tree is not None else None for p, tree in enumerate(trees)])
        below = [[n for n in tree.closure(nodes[p]) if n] if tree is not None else [] for p, tree in enumerate(trees)]
        feeds = self._catch_up(ctx, feeds, [len(b) for b in below])
        windows, slots = [], []
        for p, tree in enumerate(trees):
            if tree is None:
                windows.append(None)
                slots.append({})
                continue
            root = len(feeds[p]) - 1
            slot = {0: root, **{n: root + 1 + i for i, n in enumerate(below[p])}}
            parents = [*range(-1, root), *(slot[tree.parents[n]] for n in below[p])]
            windows.append(Window.tree([*feeds[p], *(tree.tokens[n] for n in below[p])], parents))
            slots.append(slot)
        out = ctx.run(self.runner, windows)
        if any(f is not None and len(f) > 1 for f in feeds):  # the tokens before the roots (none after an adopt)
            self.runner.commit([range(len(f) - 1) if f is not None else None for f in feeds])
        for p, tree in enumerate(trees):
            if tree is not None:
                self.cached[p] = self.tokens[p][:-1]
                # the asked nodes' rows [n, V] in one gather (one read back from a device)
                rows[p] = np.asarray(out.tree_rows()[p, np.array([slots[p][n] for n in nodes[p]], dtype=np.int64)])
                self.expanded_draws[p] = [int(out.draws[p, slots[p][n]]) for n in nodes[p]]
        if self.runner.stages_trees:
            self.runner.stage([[slots[p][n] for n in (0, *below[p])] if tree is not None else None
                               for p, tree in enumerate(trees)])
            for p, tree in enumerate(trees):
                if tree is not None:
                    self._staged[p] = {n: i for i, n in enumerate((0, *below[p]))}
                    self._trees[p] = tree

    def can_draft_tree(self, layout: Any) -> bool:
        return self.fused and self.runner.can_draft_tree(layout)

    def can_grow_tree(self, layout: Any) -> bool:
        return self.fused and self.runner.can_grow_tree(layout)

    def draft_tree(self, ctx: "Decoding", layout: Any, max_depths: Sequence[int]) -> list[Optional["TokenTree"]]:
        """Each image's static tree (runtime/tree_call.py) below its pending token in one call of
        the runner's draft_tree (max_depths[p]: the drafts image p has left; < 0: no tree, 0: the
        root alone, no call for it). Catches up as the level path's first pass does; stages the
        root and the kept fed nodes, so `extend` adopts the accepted path's rows as after it."""
        runner = self.runner
        trees, feeds = self._one_call_windows(ctx, max_depths, len(layout.fed), SAMPLED)
        if feeds is None:
            return trees
        runner.rows_to_host = True  # every row is read on the host (the trees' q)
        try:
            out = ctx.run_tree(runner, chains(feeds), layout, [max(d, 0) for d in max_depths])
            draws, block = out.draws.tolist(), out.probs
            width = max(len(f) for f in feeds if f is not None)
            if any(f is not None and len(f) > 1 for f in feeds):  # the tokens before the roots
                runner.commit([range(len(f) - 1) if f is not None else None for f in feeds])
            stage: list[Optional[list[int]]] = []
            for p, feed in enumerate(feeds):
                if feed is None:
                    stage.append(None)
                    continue
                tree, kept = tree_from_draws(layout, self.tokens[p][-1], draws[p], np.array(block[p]), max_depths[p])
                trees[p], self._trees[p] = tree, tree
                self.cached[p] = self.tokens[p][:-1]
                self._staged[p] = {0: 0, **{node: i for i, (node, _) in enumerate(kept, 1)}}
                stage.append([len(feed) - 1, *(width + k for _, k in kept)])
            runner.stage(stage)
        finally:
            runner.rows_to_host = False
        return trees

    def _one_call_windows(self, ctx: "Decoding", max_depths: Sequence[int], fed: int,
                          drawn: str) -> tuple[list[Optional["TokenTree"]], Optional[list[Optional[list[int]]]]]:
        """For a tree in one call: the root-only trees of images with no drafts left (the rest
        None, for the call to fill) and each drafting image's window after catching up as the
        level path's first pass does (`fed` rows follow it); None for the windows: no call."""
        trees = root_only_trees([tokens[-1] for tokens in self.tokens], max_depths, drawn)
        if not any(depth > 0 for depth in max_depths):
            return trees, None
        feeds = self._unfed([self.tokens[p] if depth > 0 else None for p, depth in enumerate(max_depths)])
        return trees, self._catch_up(ctx, feeds, [fed] * len(feeds))

    def grow_tree(self, ctx: "Decoding", layout: Any, max_depths: Sequence[int],
                  total_tokens: int) -> list[Optional["TokenTree"]]:
        """Each image's dynamic tree (runtime/tree_call.py GrowthLayout) below its pending token in
        one call of the runner's grow_tree: the tree runtime.tree.DynamicGrowth would grow in
        min(depth, max_depths[p]) passes (< 0: no tree, 0: the root alone, no call for it). Catches
        up as the level path's first pass does; stages the root and the frontier nodes its passes
        would have run, and advances each image's stream past the uniforms those passes draw."""
        runner = self.runner
        trees, feeds = self._one_call_windows(ctx, max_depths, layout.fed, TOP)
        if feeds is None:
            return trees
        out = runner.grow_tree(chains(feeds), layout)
        width = max(len(f) for f in feeds if f is not None)
        if any(f is not None and len(f) > 1 for f in feeds):  # the tokens before the roots
            runner.commit([range(len(f) - 1) if f is not None else None for f in feeds])
        stage: list[Optional[list[int]]] = []
        for p, grown in enumerate(grown_trees(ctx, layout, out, feeds, max_depths, total_tokens)):
            if grown is None:
                stage.append(None)
                continue
            trees[p], self._trees[p], fed = grown
            self.cached[p] = self.tokens[p][:-1]
            self._staged[p] = {node: node for node in range(len(fed) + 1)}  # expanded node n: staged row n
            stage.append([len(feeds[p]) - 1, *(width + f for f in fed)])
        runner.stage(stage)
        return trees

    def _run_level(self, ctx, trees, nodes, rows) -> None:
        """A later pass of the round: each image's nodes not yet run, each seeing its staged ancestors."""
        windows, runs = [], []
        for p, tree in enumerate(trees):
            if tree is None:
                windows.append(None)
                runs.append(None)
                continue
            staged_at, asked = self._staged[p], nodes[p]
            if any(n in staged_at for n in asked):
                raise ValueError("expand: a node asked for was run in an earlier pass of this round")
            parents = tree.parents
            new = sorted(set(asked)) if all(parents[n] in staged_at for n in asked) else \
                [n for n in tree.closure(asked) if n not in staged_at]  # (the usual level: every parent ran)
            windows.append(level_window(tree, new, staged_at))
            runs.append(new)
        out = ctx.run(self.runner, windows)
        self.runner.stage([range(len(new)) if new is not None else None for new in runs])
        block = out.tree_rows()
        for p, new in enumerate(runs):
            if new is None:
                continue
            if new == nodes[p]:  # the rows asked for are the window's: one copy (one read back from a device)
                rows[p] = np.array(block[p, :len(new)])
                self.expanded_draws[p] = out.draws[p, :len(new)].tolist()
            else:  # [n, V] in one gather
                slot = {n: w for w, n in enumerate(new)}
                rows[p] = np.asarray(block[p, np.array([slot[n] for n in nodes[p]], dtype=np.int64)])
                self.expanded_draws[p] = [int(out.draws[p, slot[n]]) for n in nodes[p]]
            staged = self._staged[p]
            staged.update(zip(new, range(len(staged), len(staged) + len(new))))


def root_only_trees(roots: Sequence[int], max_depths: Sequence[int], drawn: str) -> list[Optional["TokenTree"]]:
    """A one-call tree round's trees before the call: the root alone for an image with no drafts
    left (max_depths[p] == 0), None for the rest (no tree, < 0, or the call's to fill)."""
    return [TokenTree(root, drawn) if depth == 0 else None for root, depth in zip(roots, max_depths)]


def grown_trees(ctx: "Decoding", layout: Any, out: Any, windows: Sequence[Optional[Sequence[int]]],
                max_depths: Sequence[int], total_tokens: int) -> list[Optional[tuple["TokenTree", "TokenTree", list[int]]]]:
    """runtime.tree_call.grown_tree for each image of a grow_tree call (`out`: its GrownTrees;
    windows[p]: image p's window tokens, its root last; None: no tree), each image's stream
    advanced past the uniforms the level path's passes would have drawn: its window's, then
    one per frontier node run (what they draw is unused: the tree is the rows' top-k)."""
    grown: list[Optional[tuple["TokenTree", "TokenTree", list[int]]]] = []
    for p, window in enumerate(windows):
        if window is None:
            grown.append(None)
            continue
        tree, expanded, fed = grown_tree(layout, window[-1], out.tokens[p], out.scores[p], out.fronts[p],
                                         min(layout.depth, max_depths[p]), total_tokens)
        ctx.rngs[p].random(len(window) + len(fed))
        grown.append((tree, expanded, fed))
    return grown


def finish_round(ctx: "Decoding", drafter: Drafter, tokens: list[list[int]], images: Sequence[int], scored: StepOutput,
                 paths: Sequence[Optional[list[int]]], new: Sequence[Optional[list[int]]]) -> None:
    """After a round's verification: commit each image's accepted path in the target, hand the
    round to the drafter (rollback, then extend with what was decided) and append the new tokens
    (accepted drafts + the next token) to each image's sequence; None: the image had no round."""
    ctx.target.commit(list(paths))
    drafter.rollback([len(tokens[i]) if n is not None else None for i, n in zip(images, new)])
    drafter.extend(ctx, list(new), Verified(scored, list(paths)))
    for i, n in zip(images, new):
        if n is not None:
            tokens[i] += n
            ctx.stats.record_round(len(n))


def _staged_path(tree: Any, staged: dict[int, int], accepted: Sequence[int]) -> list[int]:
    """The root, then the nodes of `tree` holding the accepted tokens in order, as far as they were
    run (staged). Followed by token, not by node id: the tree verified may be a re-indexed copy of
    the one drafted (a dynamic tree keeps the best of its grown nodes)."""
    node, path = 0, [0]
    for token in accepted:
        node = next((c for c in tree.children[node] if tree.tokens[c] == int(token)), -1)
        if node < 0 or node not in staged:
            break
        path.append(node)
    return path


def make_drafter(ctx: "Decoding", fused: bool = True) -> Drafter:
    """The drafter over this call's draft: an EAGLE head (runtime.eagle.EagleDrafter, fed the
    target's hidden rows) or an independent model (ModelDrafter); `fused`: whether it may draft
    a round in one call (Drafter.fused)."""
    from specrt.runtime.eagle import EagleDrafter, HeadRunner  # eagle builds on this module

    drafter = EagleDrafter(ctx.draft, ctx.target) if isinstance(ctx.draft, HeadRunner) else ModelDrafter(ctx.draft)
    drafter.fused = fused
    return drafter
