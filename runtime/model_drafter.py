"""An independent draft model behind the Drafter protocol (runtime.drafter): a ModelRunner of its own
whose KV cache follows each image's committed sequence, drafting chains, and trees level by level
or in one call of its runner (runtime/tree_call.py).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.counter_random import DRAFT
from specrt.runtime.decoding import Decoding
from specrt.runtime.drafter import Drafter
from specrt.runtime.runner import ModelRunner
from specrt.runtime.tree import TokenTree, level_window
from specrt.runtime.tree_call import grown_trees, root_only_trees, tree_from_draws
from specrt.runtime.verification.siblings import SAMPLED, TOP
from specrt.runtime.window import Window, chains


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
            out = ctx.run(self.runner, chains(feeds), ctx.uniforms(step, DRAFT))  # draft step + 1 at index n + step
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

    def _catch_up(self, ctx: Decoding, feeds: list[Optional[list[int]]],
                  below: Sequence[int]) -> list[Optional[list[int]]]:
        """Where feeds[p] and the below[p] tree rows run after it would overflow the window, run
        and commit the tokens before its root first (a pass of their own, its draws unread); the
        feeds left for the tree pass."""
        long = [f is not None and len(f) > 1 and len(f) + b > self.runner.max_window for f, b in zip(feeds, below)]
        if not any(long):
            return feeds
        catch = [f[:-1] if too else None for f, too in zip(feeds, long)]
        windows = [Window.chain(c) if c is not None else None for c in catch]
        ctx.run(self.runner, windows, ctx.unused(self.runner, windows))
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
        out = ctx.run(self.runner, windows, ctx.unused(self.runner, windows))  # the host draws the children
        if any(f is not None and len(f) > 1 for f in feeds):  # the tokens before the roots (none after an adopt)
            self.runner.commit([range(len(f) - 1) if f is not None else None for f in feeds])
        for p, tree in enumerate(trees):
            if tree is not None:
                self.cached[p] = self.tokens[p][:-1]
                # the asked nodes' rows [n, V] in one gather (one read back from a device)
                rows[p] = np.asarray(out.tree_rows()[p, np.array([slots[p][n] for n in nodes[p]], dtype=np.int64)])
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

    def draft_tree(self, ctx: Decoding, layout: Any, max_depths: Sequence[int]) -> list[Optional[TokenTree]]:
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

    def _one_call_windows(self, ctx: Decoding, max_depths: Sequence[int], fed: int,
                          drawn: str) -> tuple[list[Optional[TokenTree]], Optional[list[Optional[list[int]]]]]:
        """For a tree in one call: the root-only trees of images with no drafts left (the rest
        None, for the call to fill) and each drafting image's window after catching up as the
        level path's first pass does (`fed` rows follow it); None for the windows: no call."""
        trees = root_only_trees([tokens[-1] for tokens in self.tokens], max_depths, drawn)
        if not any(depth > 0 for depth in max_depths):
            return trees, None
        feeds = self._unfed([self.tokens[p] if depth > 0 else None for p, depth in enumerate(max_depths)])
        return trees, self._catch_up(ctx, feeds, [fed] * len(feeds))

    def grow_tree(self, ctx: Decoding, layout: Any, max_depths: Sequence[int],
                  total_tokens: int) -> list[Optional[TokenTree]]:
        """Each image's dynamic tree (runtime/tree_call.py GrowthLayout) below its pending token in
        one call of the runner's grow_tree: the tree runtime.tree.DynamicGrowth would grow in
        min(depth, max_depths[p]) passes (< 0: no tree, 0: the root alone, no call for it). Catches
        up as the level path's first pass does; stages the root and the frontier nodes its passes
        would have run."""
        runner = self.runner
        trees, feeds = self._one_call_windows(ctx, max_depths, layout.fed, TOP)
        if feeds is None:
            return trees
        out = runner.grow_tree(chains(feeds), layout)
        width = max(len(f) for f in feeds if f is not None)
        if any(f is not None and len(f) > 1 for f in feeds):  # the tokens before the roots
            runner.commit([range(len(f) - 1) if f is not None else None for f in feeds])
        stage: list[Optional[list[int]]] = []
        for p, grown in enumerate(grown_trees(layout, out, feeds, max_depths, total_tokens)):
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
        out = ctx.run(self.runner, windows, ctx.unused(self.runner, windows))  # the host draws the children
        self.runner.stage([range(len(new)) if new is not None else None for new in runs])
        block = out.tree_rows()
        for p, new in enumerate(runs):
            if new is None:
                continue
            if new == nodes[p]:  # the rows asked for are the window's: one copy (one read back from a device)
                rows[p] = np.array(block[p, :len(new)])
            else:  # [n, V] in one gather
                slot = {n: w for w, n in enumerate(new)}
                rows[p] = np.asarray(block[p, np.array([slot[n] for n in nodes[p]], dtype=np.int64)])
            staged = self._staged[p]
            staged.update(zip(new, range(len(staged), len(staged) + len(new))))


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
