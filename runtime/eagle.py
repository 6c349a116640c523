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

from typing import Sequence

import numpy as np

from typing import TYPE_CHECKING

from specrt.runtime.conditions import Conditions
from specrt.runtime.drafting import Drafter, Verified
from specrt.runtime.runner import ModelRunner, StepOutput
from specrt.runtime.window import Window

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
        if getattr(self, "_features_in", np.zeros(0)).size != size:
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

    def step_pairs(self, window: Window, features: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        """Run the pairs (features [B, W, H], window's tokens) at the next positions."""
        size = len(window)
        view = self._features_in[: self.batch * size * self.dim].reshape(self.batch, size, self.dim)
        view[...] = features
        self._pending = view
        return self.step(window, uniforms)

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        mask[:, :, : self.spec.cond_len] = False  # no pairs at the condition positions
        batch, size = ids.shape
        self.features_out = self._features_out_flat[: batch * size * self.dim].reshape(batch, size, self.dim)
        return self._head_step(ids, self._pending, positions, mask, uniforms)

    def _head_step(self, ids: np.ndarray, features: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                   uniforms: np.ndarray) -> StepOutput:
        raise NotImplementedError


class EagleDrafter(Drafter):
    """runtime.drafting's Drafter over an EAGLE head (chains and trees).

    Queued pairs are stable pairs not yet in the head's cache, the pending token's pair last.
    propose_chain: catch up on the queue (committed for good), then draft from the head's own
      features; those rows are temporary.
    expand: the queue before the pending token is committed; the pending pair is the tree's root
      slot, and each node below it is the pair (its parent's feature g, its token): every pass
      re-feeds the nodes' closure (nothing of the tree is committed), and the features g of the
      nodes expanded so far this round feed their children.
    rollback: drop this round's rows (truncate to the stable length) and node features;
    extend: queue (the target's feature of each verified path slot, the token after it).
    The target runner must keep its hidden rows (`keep_hidden`).
    """

    def __init__(self, head: HeadRunner, target: ModelRunner):
        self.head, self.target = head, target
        self._tokens: list[int] = []
        self._features: list[np.ndarray] = []  # [B, H] per queued pair
        self._stable = 0
        self._node_features: dict[int, np.ndarray] = {}  # tree node -> the head's g after it, this round

    def start(self, ctx, condition: Conditions, first: int, target: StepOutput) -> None:
        self.head.begin()
        self._stable = self.head.length
        self._tokens, self._features = [int(first)], [self.target.hidden_rows([0])[:, 0].copy()]
        self._node_features = {}

    def extend(self, ctx, tokens: Sequence[int], verified: Verified) -> None:
        features = self.target.hidden_rows(verified.slots)  # f of the old pending token, then each accepted draft
        self._tokens += [int(t) for t in tokens]
        self._features += [features[:, i].copy() for i in range(len(tokens))]

    def rollback(self, length: int) -> None:
        self.head.truncate(self._stable)
        self._node_features = {}

    def _catch_up(self, ctx, keep_pending: bool) -> None:
        """Commit the queued stable pairs (all, or all but the pending one) in one pass."""
        count = len(self._tokens) - (1 if keep_pending else 0)
        if count > 0:
            ctx.run_pairs(self.head, Window.chain(self._tokens[:count]), np.stack(self._features[:count], axis=1))
            self.head.commit(range(count))
            del self._tokens[:count], self._features[:count]
        self._stable = self.head.length

    def propose_chain(self, ctx, length: int) -> tuple[list[int], list]:
        head = self.head
        drafts: list[int] = []
        rows: list = []
        if length == 0:
            return drafts, rows
        out = ctx.run_pairs(head, Window.chain(self._tokens), np.stack(self._features, axis=1))
        head.commit(range(len(self._tokens)))  # stable: the target's own features
        self._stable = head.length
        self._tokens, self._features = [], []
        while True:
            drafts.append(int(out.draws[0, -1]))
            rows.append(out.probs[0, -1].copy())  # the head reuses this buffer two steps on (a device row stays there)
            if len(drafts) == length:
                return drafts, rows
            feature = head.features_out[:, -1:].copy()  # the head's own g stands in for the target's f
            out = ctx.run_pairs(head, Window.chain([drafts[-1]]), feature)
            head.commit([0])

    def expand(self, ctx, tree: "TokenTree", nodes: Sequence[int]) -> list:
        self._catch_up(ctx, keep_pending=True)
        below = [n for n in tree.closure(nodes) if n]  # the nodes the window needs, root excluded
        slot = {0: 0, **{n: 1 + i for i, n in enumerate(below)}}
        window = Window.tree([self._tokens[0], *(tree.tokens[n] for n in below)],
                             [-1, *(slot[tree.parents[n]] for n in below)])
        features = np.stack([self._features[0], *(self._node_features[tree.parents[n]][:, 0] for n in below)], axis=1)
        out = ctx.run_pairs(self.head, window, features)
        for n in (0, *below):
            self._node_features[n] = self.head.features_out[:, slot[n]:slot[n] + 1].copy()
        return [np.array(out.probs[0, slot[n]]) for n in nodes]
