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
subclass it with their backend); EagleDrafter is the runtime.drafting.Drafter the drafted
methods call, for chains and trees.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from typing import TYPE_CHECKING

from specrt.runtime.conditions import Conditions
from specrt.runtime.drafting import Drafter, Verified
from specrt.runtime.runner import ModelRunner, StepOutput, window_sizes
from specrt.runtime.tree import level_window
from specrt.runtime.window import Window, Windows

if TYPE_CHECKING:  # pragma: no cover
    from specrt.runtime.tree import TokenTree

EAGLE_KIND = "eagle"  # manifest models.draft.kind


class HeadRunner(ModelRunner):
    """A ModelRunner whose steps also take the feature before each token, and give the head's own.

    Backends implement `_head_step(ids, features, positions, mask, uniforms)`, which runs the
    graph, keeps the present rows, writes the head's features into `self.features_out`
    ([B, W, H] host view) and returns the sampling head's output.
    """

    dim: int = 0

    def allocate(self, mix: np.ndarray, capacity: int | None = None) -> None:
        super().allocate(mix, capacity)
        size = self.batch * self.max_window * self.dim
        # grown only, never swapped for a smaller one: a backend binds views of these buffers once
        # per window size (onnxruntime's IOBinding), and a batch that shrank by retain keeps them
        if getattr(self, "_features_in", np.zeros(0)).size < size:
            self._features_in = np.zeros(size, dtype=np.float32)
            self._features_out_flat = np.zeros(size, dtype=np.float32)
        self.features_out = self._features_out_flat[:0]
        self._pending: np.ndarray | None = None

    def can_chain(self, steps: int) -> bool:
        return False  # each draft pairs with a feature the head predicts: runtime.eagle drafts step by step

    def begin(self) -> None:
        """An empty head for new images: the condition rows exist only in the target."""
        self.truncate(0)
        self.lengths[:] = self.spec.cond_len

    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        raise AssertionError("an EAGLE head has no prefill: begin() and step_pairs() instead")

    def step_pairs(self, windows: Windows, features: Sequence[Optional[np.ndarray]], uniforms: np.ndarray) -> StepOutput:
        """Run each image's pairs (features[p] [pairs, W_p, H] for image p's window tokens) after its
        committed rows; images without a window (None) run pad slots."""
        sizes = window_sizes(windows, self.images)
        size, images = max(int(sizes.max()), 1), self.images
        view = self._features_in[: self.batch * size * self.dim].reshape(self.batch, size, self.dim)
        view[...] = 0.0
        for p, feature in enumerate(features):
            if feature is not None and sizes[p]:
                view[p::images, : sizes[p]] = feature
        self._pending = view
        return self.step(windows, uniforms)

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        mask[:, :, : self.spec.cond_len] = False  # no pairs at the condition positions
        batch, size = ids.shape
        self.features_out = self._features_out_flat[: batch * size * self.dim].reshape(batch, size, self.dim)
        return self._head_step(ids, self._pending, positions, mask, uniforms)

    def _head_step(self, ids: np.ndarray, features: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                   uniforms: np.ndarray) -> StepOutput:
        raise NotImplementedError


class EagleDrafter(Drafter):
    """runtime.drafting's Drafter over an EAGLE head (chains and trees), for a batch of images.

    Per image, queued pairs are stable pairs not yet in the head's cache, the pending token's pair last.
    propose_chain: catch up on the queues (committed for good), then draft from the head's own
      features; those rows are temporary.
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
            self._features[p] += [features[:, i].copy() for i in range(len(new))]

    def rollback(self, lengths: Sequence[Optional[int]]) -> None:
        self.head.truncate(self._stable)
        self._node_features = [{} for _ in self._tokens]
        self._staged = [{} for _ in self._tokens]

    def _run_queues(self, ctx, counts: Sequence[int]) -> StepOutput:
        """Run and commit the first counts[p] queued pairs of each image (stable from now on)."""
        windows = [Window.chain(self._tokens[p][:n]) if n > 0 else None for p, n in enumerate(counts)]
        features = [np.stack(self._features[p][:n], axis=1) if n > 0 else None for p, n in enumerate(counts)]
        out = ctx.run_pairs(self.head, windows, features)
        self.head.commit([range(n) if n > 0 else None for n in counts])
        for p, n in enumerate(counts):
            del self._tokens[p][:n], self._features[p][:n]
        self._stable = self.head.lengths.copy()
        return out

    def propose_chain(self, ctx, lengths: Sequence[int]) -> tuple[list[list[int]], list[list[Any]]]:
        drafts: list[list[int]] = [[] for _ in lengths]
        rows: list[list[Any]] = [[] for _ in lengths]
        counts = [len(self._tokens[p]) if length > 0 else 0 for p, length in enumerate(lengths)]
        if not any(counts):
            return drafts, rows
        out, sizes = self._run_queues(ctx, counts), counts
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
                                            for p, go in enumerate(going)], features)
            self.head.commit([[0] if go else None for go in going])
            sizes = [1 if go else 0 for go in going]

    def expand(self, ctx, trees: Sequence[Optional["TokenTree"]], nodes: Sequence[Sequence[int]]) -> list[list[Any]]:
        later = [tree is not None and 0 in self._staged[p] for p, tree in enumerate(trees)]
        if not any(later):  # the round's first pass: the queues before the pending pairs go in for good
            self._run_queues(ctx, [len(q) - 1 if tree is not None else 0 for q, tree in zip(self._tokens, trees)])
        windows, features, runs = [], [], []
        for p, tree in enumerate(trees):
            if tree is None:
                windows.append(None)
                features.append(None)
                runs.append([])
                continue
            run = [n for n in tree.closure(nodes[p]) if n not in self._staged[p]]
            windows.append(level_window(tree, run, self._staged[p]))  # the root is the pending pair's token
            features.append(np.stack([self._node_features[p][tree.parents[n]] if n else self._features[p][0]
                                      for n in run], axis=1))
            runs.append(run)
        out = ctx.run_pairs(self.head, windows, features)
        self.head.stage([range(len(run)) if trees[p] is not None else None for p, run in enumerate(runs)])
        rows: list[list[Any]] = [[] for _ in trees]
        for p, run in enumerate(runs):
            if trees[p] is None:
                continue
            mine = self._image_rows(self.head.features_out, p)
            for w, n in enumerate(run):
                self._node_features[p][n] = mine[:, w].copy()
                self._staged[p][n] = len(self._staged[p])
            slot = {n: w for w, n in enumerate(run)}
            rows[p] = [np.array(out.tree_rows()[p, slot[n]]) for n in nodes[p]]
        return rows
