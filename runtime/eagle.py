"""EAGLE draft heads at run time: the head's runner contract and the chain drafter over it.

An EAGLE head drafts from the target's features: the pair (f, x) at x's sequence position,
f being the target's final-norm hidden state that predicted x (docs/contracts.md, "EAGLE
heads"). So the head has no prefill of its own, and its KV rows mirror the target's
positions: row p holds the pair whose token sits at sequence position p; rows below
cond_len are never written and every step hides them. Pairs whose feature came from the
target are *stable* and stay in the head's cache; pairs of drafted tokens carry the head's
own features (EAGLE's recursion) and are rolled back after each verification, when the
target's real features for the accepted tokens replace them.

HeadRunner is the backend-independent part of a head's runner (onnxruntime and PyTorch
subclass it with their backend); EagleDrafter is the runtime.drafter.Drafter the drafted
methods call, for chains and trees. A chain round is one head call where the runner draws
chains (runtime/chain.py HeadChain: a bundle's `draft_chain` graph, or the PyTorch module),
else one call per draft; the same drafts either way.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.counter_random import DRAFT
from specrt.runtime.drafter import Drafter, Verified
from specrt.runtime.runner import GrownTrees, ModelRunner, StepOutput, window_sizes
from specrt.runtime.sampling import needs_restriction
from specrt.runtime.tree import TokenTree, level_window
from specrt.runtime.tree_call import grown_trees, root_only_trees, tree_from_draws
from specrt.runtime.verification.siblings import SAMPLED, TOP
from specrt.runtime.window import Window, Windows

EAGLE_KIND = "eagle"  # manifest models.draft.kind


class HeadRunner(ModelRunner):
    """A ModelRunner whose steps also take the feature before each token, and give the head's own.

    Backends implement `_head_step(ids, features, positions, mask, uniforms)`, which runs the
    graph, keeps the present rows, writes the head's features into `self.features_out`
    ([B, W, H] host view) and returns the sampling head's output.
    """

    dim: int = 0
    chain_steps: int = 0  # drafts per call of a chain graph (onnxruntime: the graph's static count); 0: any or none

    def _unallocated(self) -> None:
        super()._unallocated()
        self._features_in = self._features_out_flat = np.zeros(0, dtype=np.float32)

    def allocate(self, mix: np.ndarray, capacity: int | None = None) -> None:
        super().allocate(mix, capacity)
        size = self.batch * self.max_window * self.dim
        # grown only, never swapped for a smaller one: a backend binds views of these buffers once
        # per window size (onnxruntime's IOBinding), and a batch that shrank by retain keeps them
        if self._features_in.size < size:
            self._features_in = np.zeros(size, dtype=np.float32)
            self._features_out_flat = np.zeros(size, dtype=np.float32)
        self.features_out = self._features_out_flat[:0]
        self._pending: np.ndarray | None = None

    def begin(self) -> None:
        """An empty head for new images: the condition rows exist only in the target."""
        self.truncate(0)
        self.lengths[:] = self.spec.cond_len

    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        raise AssertionError("an EAGLE head has no prefill: begin() and step_pairs() instead")

    def step_pairs(self, windows: Windows, features: Sequence[Optional[np.ndarray]], uniforms: np.ndarray) -> StepOutput:
        """Run each image's pairs (features[p] [pairs, W_p, H] for image p's window tokens) after its
        committed rows; images without a window (None) run pad slots."""
        self._pending = self._pair_features(windows, features)
        return self.step(windows, uniforms)

    def chain_pairs(self, windows: Windows, features: Sequence[Optional[np.ndarray]], steps: int,
                    uniforms: np.ndarray) -> StepOutput:
        """`chain` over each image's pairs (features as step_pairs'): the window, then `steps`
        drafts in one call, each fed with the head's own feature of the slot before it, as
        EagleDrafter feeds `features_out` step by step (runtime/chain.py HeadChain). The
        bookkeeping is ModelRunner.chain's (inputs, `last`, counters); features_out is not
        written. Only where can_chain(steps)."""
        self._pending = self._pair_features(windows, features)
        return self.chain(windows, steps, uniforms)

    def chain_steps_for(self, longest: int) -> int:
        """Drafts per chain call for a round whose longest chain is `longest`: `longest` where the
        runner chains any count (PyTorch), else its graph's count where that is more (the extra
        drafts are computed and ignored); 0: no chain call fits."""
        for steps in (longest, self.chain_steps):
            if steps >= longest and self.can_chain(steps):
                return steps
        return 0

    def _pair_features(self, windows: Windows, features: Sequence[Optional[np.ndarray]]) -> np.ndarray:
        """The `hidden` input [B, W, H] of a call on these windows: image p's features in its rows
        (it and its CFG twins), zeros in pad slots; a view of the buffer the backends bind."""
        first = features[0] if self.images == 1 and len(features) == 1 else None
        if first is not None and len(first) == self.batch and first.shape[1]:
            # one image (batch 1) whose features fill the window: no pad slots to zero
            size = first.shape[1]
            view = self._features_in[: self.batch * size * self.dim].reshape(self.batch, size, self.dim)
            view[...] = first
            return view
        sizes = window_sizes(windows, self.images)
        size, images = max(int(sizes.max()), 1), self.images
        view = self._features_in[: self.batch * size * self.dim].reshape(self.batch, size, self.dim)
        view[...] = 0.0
        for p, feature in enumerate(features):
            if feature is not None and sizes[p]:
                view[p::images, : sizes[p]] = feature
        return view

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        mask[:, :, : self.spec.cond_len] = False  # no pairs at the condition positions
        batch, size = ids.shape
        self.features_out = self._features_out_flat[: batch * size * self.dim].reshape(batch, size, self.dim)
        return self._head_step(ids, self._pending, positions, mask, uniforms)

    def _chain(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
               uniforms: np.ndarray) -> StepOutput:
        mask[:, :, : self.spec.cond_len] = False  # as _step: the drafts see what the last slot saw
        return self._head_chain(ids, self._pending, positions, mask, last, uniforms)

    def tree_pairs(self, windows: Windows, features: Sequence[Optional[np.ndarray]], layout: Any,
                   uniforms: np.ndarray) -> StepOutput:
        """`draft_tree` over each image's pairs (features as step_pairs'): the window, then the
        static tree `layout`, each node fed with its parent's head feature (runtime/chain.py
        HeadTree). Only where can_draft_tree(layout)."""
        self._pending = self._pair_features(windows, features)
        return self.draft_tree(windows, layout, uniforms)

    def grow_pairs(self, windows: Windows, features: Sequence[Optional[np.ndarray]], layout: Any) -> GrownTrees:
        """`grow_tree` over each image's pairs (runtime/chain.py HeadGrowth). Only where can_grow_tree(layout)."""
        self._pending = self._pair_features(windows, features)
        return self.grow_tree(windows, layout)

    def _draft_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray, layout: Any,
                    uniforms: np.ndarray) -> StepOutput:
        mask[:, :, : self.spec.cond_len] = False  # as _step
        return self._head_tree(ids, self._pending, positions, mask, last, layout, uniforms)

    def _grow_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
                   layout: Any) -> GrownTrees:
        mask[:, :, : self.spec.cond_len] = False  # as _step
        return self._head_grow(ids, self._pending, positions, mask, last, layout)

    def _head_step(self, ids: np.ndarray, features: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                   uniforms: np.ndarray) -> StepOutput:
        raise NotImplementedError

    def _head_tree(self, ids: np.ndarray, features: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                   last: np.ndarray, layout: Any, uniforms: np.ndarray) -> StepOutput:
        """ModelRunner._draft_tree with the features before the window tokens (HeadTree's inputs)."""
        raise NotImplementedError(f"{type(self).__name__} drafts no trees in one call")

    def _head_grow(self, ids: np.ndarray, features: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                   last: np.ndarray, layout: Any) -> GrownTrees:
        """ModelRunner._grow_tree with the features before the window tokens (HeadGrowth's inputs)."""
        raise NotImplementedError(f"{type(self).__name__} grows no trees in one call")

    def _head_chain(self, ids: np.ndarray, features: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                    last: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        """ModelRunner._chain with the features before the window tokens (HeadChain's inputs);
        backends whose can_chain is true implement it."""
        raise NotImplementedError(f"{type(self).__name__} runs no head chains")


def _pairs_block(features: Sequence[np.ndarray]) -> np.ndarray:
    """n pairs' features [pairs, H] as one block [pairs, n, H] (a view of one C-level copy: np.stack
    along axis 1 reshapes every item in Python first, a round's largest host cost after the rows)."""
    return np.array(features).swapaxes(0, 1)


class EagleDrafter(Drafter):
    """runtime.drafter's Drafter over an EAGLE head (chains and trees), for a batch of images.

    Per image, queued pairs are stable pairs not yet in the head's cache, the pending token's pair last.
    propose_chain: catch up on the queues (committed for good), then draft from the head's own
      features; those rows are temporary. One head call for the round where the head chains
      (HeadRunner.chain_pairs), else one per draft; the same drafts, uniforms and rows either way.
    expand: the queues before the pending tokens are committed; each pending pair is its tree's
      root, and each node below it is the pair (its parent's feature g, its token). Every node is
      run once: the round's nodes stay as staged rows of the head (ModelRunner.stage), and each
      pass feeds only the new nodes under a mask over their staged ancestors (Window.level); the
      features g of the nodes run so far this round feed their children.
    rollback: drop this round's rows (truncate to the stable lengths, staged rows included) and
      node features; extend: queue (the target's feature of each verified path slot, the token after it).
    The target runner must keep its hidden rows (`keep_hidden`).
    """

    def __init__(self, head: HeadRunner, target: ModelRunner):
        self.head, self.target = head, target
        self._tokens: list[list[int]] = []
        self._features: list[list[np.ndarray]] = []  # per image: [pairs, H] per queued pair
        self._stable = np.zeros(0, dtype=np.int64)
        self._node_features: list[dict[int, np.ndarray]] = []  # per image: node -> the head's g after it [pairs, H]
        self._staged: list[dict[int, int]] = []  # per image: node -> its staged row, this round

    def _image_rows(self, block: np.ndarray, p: int) -> np.ndarray:
        """Image p's model rows (it and its CFG twins) of a [B, ...] block."""
        return block[p::self.head.images]

    def start(self, ctx, conditions: Conditions, firsts: Sequence[int], target: StepOutput) -> None:
        self.head.begin()
        self._stable = self.head.lengths.copy()
        hidden = self.target.hidden_rows([0])  # [B, 1, H]
        self._tokens = [[int(first)] for first in firsts]
        self._features = [[self._image_rows(hidden, p)[:, 0].copy()] for p in range(len(firsts))]
        self._node_features = [{} for _ in firsts]
        self._staged = [{} for _ in firsts]

    def retain(self, positions: Sequence[int]) -> None:
        for name in ("_tokens", "_features", "_node_features", "_staged"):
            setattr(self, name, [getattr(self, name)[p] for p in positions])
        self._stable = self._stable[list(positions)]

    def extend(self, ctx, tokens: Sequence[Optional[Sequence[int]]], verified: Verified) -> None:
        for p, new in enumerate(tokens):
            if new is None:
                continue
            # f of the old pending token, then of each accepted draft
            features = self._image_rows(self.target.hidden_rows(verified.slots[p]), p)
            self._tokens[p] += [int(t) for t in new]
            self._features[p] += [features[:, i] for i in range(len(new))]  # views: hidden_rows gives a fresh array

    def rollback(self, lengths: Sequence[Optional[int]]) -> None:
        self.head.truncate(self._stable)
        self._node_features = [{} for _ in self._tokens]
        self._staged = [{} for _ in self._tokens]

    def _queued(self, counts: Sequence[int]) -> tuple[list[Optional[Window]], list[Optional[np.ndarray]]]:
        """The windows and features of the first counts[p] queued pairs of each image."""
        windows = [Window.chain(self._tokens[p][:n]) if n > 0 else None for p, n in enumerate(counts)]
        features = [_pairs_block(self._features[p][:n]) if n > 0 else None for p, n in enumerate(counts)]
        return windows, features

    def _dequeue(self, counts: Sequence[int]) -> None:
        for p, n in enumerate(counts):
            del self._tokens[p][:n], self._features[p][:n]

    def _run_queues(self, ctx, counts: Sequence[int], uniforms: Optional[np.ndarray] = None) -> StepOutput:
        """Run and commit the first counts[p] queued pairs of each image (stable from now on), drawing
        with `uniforms` [I] (None: draws nobody reads)."""
        windows, features = self._queued(counts)
        out = ctx.run_pairs(self.head, windows, features,
                            ctx.unused(self.head, windows) if uniforms is None else uniforms)
        self.head.commit([range(n) if n > 0 else None for n in counts])
        self._dequeue(counts)
        self._stable = self.head.lengths.copy()
        return out

    def propose_chain(self, ctx, lengths: Sequence[int]) -> tuple[list[list[int]], list[list[Any]]]:
        drafts: list[list[int]] = [[] for _ in lengths]
        rows: list[list[Any]] = [[] for _ in lengths]
        counts = [len(self._tokens[p]) if length > 0 else 0 for p, length in enumerate(lengths)]
        if not any(counts):
            return drafts, rows
        steps = self._chain_steps(ctx, counts, lengths)
        if steps:
            return self._propose_in_one_call(ctx, counts, lengths, steps)
        out, sizes = self._run_queues(ctx, counts, ctx.uniforms(0, DRAFT)), counts  # draft 1 at index n
        while True:
            for p, size in enumerate(sizes):
                if size:
                    drafts[p].append(int(out.draws[p, size - 1]))
                    rows[p].append(out.probs[p, size - 1].copy())  # the head reuses this buffer two steps on
            going = [bool(size) and len(drafts[p]) < lengths[p] for p, size in enumerate(sizes)]
            if not any(going):
                return drafts, rows
            # the head's own g stands in for the target's f
            features = [self._image_rows(self.head.features_out, p)[:, size - 1:size].copy() if go else None
                        for p, (size, go) in enumerate(zip(sizes, going))]
            out = ctx.run_pairs(self.head, [Window.chain([drafts[p][-1]]) if go else None
                                            for p, go in enumerate(going)], features,
                                ctx.uniforms(np.array([len(chain) for chain in drafts]), DRAFT))
            self.head.commit([[0] if go else None for go in going])
            sizes = [1 if go else 0 for go in going]

    def _chain_steps(self, ctx, counts: Sequence[int], lengths: Sequence[int]) -> int:
        """Drafts per head call when this round fits one chain call, else 0 (draft step by step):
        fused drafting, a longest chain of 2 or more (one draft is one call either way), a head that chains it
        (HeadRunner.chain_steps_for) within max_window after the longest queue, and no host
        restriction of the rows (top-k, top-p, greedy act between the steps)."""
        longest = max(lengths)
        if longest < 2 or not self.fused or needs_restriction(ctx.sampling):
            return 0
        steps = self.head.chain_steps_for(longest)
        return steps if steps and max(counts) + steps - 1 <= self.head.max_window else 0

    def _propose_in_one_call(self, ctx, counts: Sequence[int], lengths: Sequence[int],
                             steps: int) -> tuple[list[list[int]], list[list[Any]]]:
        """propose_chain as one chain call of `steps` drafts. The uniforms come from ctx.run_chain_pairs,
        draft j's the one the step-by-step loop draws it with; the queues are committed for good and the drafts fed (each image's first
        lengths[p] − 1: runner.commit_chain) as this round's rows, which
        rollback drops: the state the loop leaves. The rows are views of the head's output,
        valid until its second next call (the loop copies them: its next steps reuse the buffer);
        on the host each image's are one [L, V] block."""
        windows, features = self._queued(counts)
        out = ctx.run_chain_pairs(self.head, windows, features, lengths, steps)
        stable = self.head.lengths + np.asarray(counts, dtype=np.int64)
        self.head.commit_chain(counts, lengths)
        self._dequeue(counts)
        self._stable = stable
        drafts = [row[:k] if n > 0 else [] for row, n, k in zip(out.draws.tolist(), counts, lengths)]
        if isinstance(out.probs, np.ndarray):  # each image's rows as one block view [L, V] (rows_by_position: no copy)
            return drafts, [out.probs[p, :len(chain)] for p, chain in enumerate(drafts)]
        return drafts, [[out.probs[p, j] for j in range(len(chain))] for p, chain in enumerate(drafts)]

    def can_draft_tree(self, layout: Any) -> bool:
        return self.fused and self.head.can_draft_tree(layout)

    def can_grow_tree(self, layout: Any) -> bool:
        return self.fused and self.head.can_grow_tree(layout)

    def draft_tree(self, ctx, layout: Any, max_depths: Sequence[int]) -> list[Optional[TokenTree]]:
        """Each image's static tree in one head call (runtime/chain.py HeadTree): its queued pairs
        as the window (the pending pair, the root, last), then every level, each node fed with its
        parent's head feature, node m drawn with the uniform the level path draws it with
        (Decoding.run_tree). The queue before the pending pair is committed for good, as the
        level path's first pass commits it; the tree's rows are not kept (rollback would drop them)."""
        trees = root_only_trees([queue[-1] for queue in self._tokens], max_depths, SAMPLED)
        counts = self._tree_queues(ctx, max_depths, len(layout.fed))
        if not any(counts):
            return trees
        windows, features = self._queued(counts)
        self.head.rows_to_host = True  # every row is read on the host (the trees' q)
        try:
            out = ctx.run_tree(self.head, windows, layout, [max(d, 0) for d in max_depths], features)
        finally:
            self.head.rows_to_host = False
        self._commit_before_roots(counts)
        draws = out.draws.tolist()
        for p, count in enumerate(counts):
            if count:
                trees[p] = tree_from_draws(layout, self._tokens[p][-1], draws[p], np.array(out.probs[p]), max_depths[p])[0]
        return trees

    def grow_tree(self, ctx, layout: Any, max_depths: Sequence[int], total_tokens: int) -> list[Optional[TokenTree]]:
        """Each image's dynamic tree in one head call (runtime/chain.py HeadGrowth), the queues as
        in draft_tree (tree_call.grown_trees)."""
        trees = root_only_trees([queue[-1] for queue in self._tokens], max_depths, TOP)
        counts = self._tree_queues(ctx, max_depths, layout.fed)
        if not any(counts):
            return trees
        windows, features = self._queued(counts)
        out = self.head.grow_pairs(windows, features, layout)
        queues = [self._tokens[p][:count] if count else None for p, count in enumerate(counts)]
        self._commit_before_roots(counts)
        for p, grown in enumerate(grown_trees(layout, out, queues, max_depths, total_tokens)):
            if grown is not None:
                trees[p] = grown[0]
        return trees

    def _tree_queues(self, ctx, max_depths: Sequence[int], fed: int) -> list[int]:
        """Per image, the queued pairs a one-call tree runs as its window (0: no tree). Where they
        and the `fed` nodes would overflow the window, the pairs before the pending one are run
        and committed first (a call of their own, its draws unread)."""
        counts = [len(self._tokens[p]) if depth > 0 else 0 for p, depth in enumerate(max_depths)]
        first = [n - 1 if n > 1 and n + fed > self.head.max_window else 0 for n in counts]
        if any(first):
            self._run_queues(ctx, first)
            counts = [n - k for n, k in zip(counts, first)]
        return counts

    def _commit_before_roots(self, counts: Sequence[int]) -> None:
        """After a one-call tree: its window's pairs before each root are stable (committed for good)."""
        before = [max(n - 1, 0) for n in counts]
        if any(before):
            self.head.commit([range(n) if n else None for n in before])
            self._dequeue(before)
            self._stable = self.head.lengths.copy()

    def expand(self, ctx, trees: Sequence[Optional[TokenTree]], nodes: Sequence[Sequence[int]]) -> list[list[Any]]:
        """Each image's `nodes` (and the closure above them not yet run) under the tree mask; the
        head's rows after them. The round's first pass also runs the queued pairs before the
        pending one (the last round's accepted tokens) in the same window, ahead of the root: they
        are committed for good and the tree's nodes staged, one head call where a separate catch-up
        call would make two (as ModelDrafter's first pass). It fits the window: a first pass asks
        for the root alone, and the queue holds at most the last round's accepted drafts (no more
        than the tree's depth, which the window's max_window exceeds). On a device runner the
        rows come back with the draws in one transfer (rows_to_host): the tree's draws read them."""
        self.head.rows_to_host = True
        try:
            return self._expand(ctx, trees, nodes)
        finally:
            self.head.rows_to_host = False

    def _expand(self, ctx, trees: Sequence[Optional[TokenTree]], nodes: Sequence[Sequence[int]]) -> list[list[Any]]:
        later = [tree is not None and 0 in self._staged[p] for p, tree in enumerate(trees)]
        # the round's first pass: the queues before the pending pairs go in for good
        queued = [0] * len(trees) if any(later) else \
            [len(q) - 1 if tree is not None else 0 for q, tree in zip(self._tokens, trees)]
        windows, features, runs = [], [], []
        for p, tree in enumerate(trees):
            if tree is None:
                windows.append(None)
                features.append(None)
                runs.append([])
                continue
            run = [n for n in tree.closure(nodes[p]) if n not in self._staged[p]]
            before = queued[p]
            # node n's feature: its parent's head feature, the root's the pending pair's (queued last)
            nodes_features = [self._node_features[p][tree.parents[n]] if n else self._features[p][before] for n in run]
            if before:  # the queue as a chain, then the tree below its last pair (a first pass runs no staged rows)
                slot = {n: before + w for w, n in enumerate(run)}
                parents = [*range(-1, before - 1), *(slot[tree.parents[n]] if n else before - 1 for n in run)]
                windows.append(Window.tree([*self._tokens[p][:before], *(tree.tokens[n] for n in run)], parents))
                features.append(_pairs_block([*self._features[p][:before], *nodes_features]))
            else:
                windows.append(level_window(tree, run, self._staged[p]))  # the root is the pending pair's token
                features.append(_pairs_block(nodes_features))
            runs.append(run)
        out = ctx.run_pairs(self.head, windows, features, ctx.unused(self.head, windows))  # the host draws the children
        if any(queued):
            self.head.commit([range(n) if n else None for n in queued])
            self._dequeue(queued)
            self._stable = self.head.lengths.copy()
        self.head.stage([range(n, n + len(run)) if trees[p] is not None else None
                         for p, (n, run) in enumerate(zip(queued, runs))])
        rows: list[list[Any]] = [[] for _ in trees]
        block = out.tree_rows()
        for p, run in enumerate(runs):
            if trees[p] is None:
                continue
            mine, before = self._image_rows(self.head.features_out, p), queued[p]
            for w, n in enumerate(run):
                self._node_features[p][n] = mine[:, before + w].copy()
                self._staged[p][n] = len(self._staged[p])
            slot = {n: before + w for w, n in enumerate(run)}
            rows[p] = np.asarray(block[p, np.array([slot[n] for n in nodes[p]], dtype=np.int64)])  # [n, V], one gather (a copy)
        return rows
