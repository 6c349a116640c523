"""What a drafted round drafts with: an independent draft model or an EAGLE head, behind one seam.

Why a seam: the chain, static-tree and dynamic-tree rounds (chains.py, trees.py, dynamic.py) draw,
verify and commit the same way whatever proposes; only how the draft catches up, runs its next
pass and keeps its cache differ. A round calls its draft as:

    draft.start(rows)                                    # once a call, after the target's prefill
    draft.start(rows, images)                            # in flight: the admitted images, after their prefill
    rows = draft.catch_up(state)                         # the row after the pending token [I, V]
    rows = draft.extend(token, index)                    # a chain: the next draft's row [I, V]
    rows = draft.expand(ids, depths, ancestry, start, slots, parents)   # a tree level's rows
    draft.verified(n, path, slots)                       # after the walk, before the state commits
    rows = draft.tree_rows(rows)                         # what a tree ranks a pass's children by

Greedy decoding: a restricted row is one-hot, so a tree drawn from it would give every node one
child. The host loop's trees then take a node's children as the top-k of the head's softmax before
the argmax (runtime/tree.py StaticGrowth, StepOutput.ranking), so `draft_of` builds the draft's
model unrestricted and the seam restricts what it hands back (the numbers the model would have
given: what a chain draws from) and keeps the softmax of its last pass for `tree_rows`.

An independent model (ModelDraft) keeps every pass's keys/values: its catch-up feeds the two
tokens it may lack, and a tree's accepted nodes are copied down to their tokens' columns. An EAGLE
head (HeadDraft) drafts from the target's features (EAGLE's pair (f_{p−1}, x_p) at sequence
position p); what it drafted was fed its own features, so nothing of it is kept: the next round's
catch-up runs the committed pairs again with the target's features, which `verified` keeps from
the target's pass along the accepted path — as the host loop's EagleDrafter rolls back and
re-feeds. That catch-up has a fixed width (the deepest path + 1, `reach`): slots past an image's
committed pairs are fed what lies beyond its length and written to columns that its drafts and
later catch-ups overwrite before anything reads them.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Sequence

import torch

from specrt.runtime.rounds.state import RoundState
from specrt.runtime.sampling import SamplingParams, restrict


class Restricted:
    """What both drafts share: the rows they hand back restricted as the user's sampling asks, and
    under greedy decoding the softmax before the argmax kept for a tree (module docstring)."""

    def __init__(self, sampling: SamplingParams):
        self.sampling = sampling
        self.greedy = sampling.temperature == 0.0
        self.ranking: Any = None  # greedy: the last pass's rows before the argmax

    def tree_rows(self, rows: Any) -> Any:
        """The rows a tree grows its children from: the softmax of the pass that gave `rows` under
        greedy decoding (its top-k, as the host's StepOutput.tree_rows), else `rows` themselves."""
        return self.ranking if self.greedy else rows

    def _restricted(self, rows: Any) -> Any:
        """A pass's rows as the round draws from them: greedy's argmax of the unrestricted model's
        rows (which `ranking` keeps); any other sampling restricts in the model already."""
        if not self.greedy:
            return rows
        self.ranking = rows
        return restrict(rows, self.sampling)


class ModelDraft(Restricted):
    """An independent draft model (runtime/backends/device_model.py DeviceModel) behind the seam."""

    def __init__(self, model: Any, sampling: SamplingParams):
        super().__init__(sampling)
        self.model = model

    def start(self, rows: Any, images: Optional[Sequence[int]] = None) -> None:
        self.model.prefill(rows, images)

    def catch_up(self, state: RoundState) -> Any:
        """The draft over (token n − 2, pending) — after a round that accepted every draft its last
        draft was never fed to it; image token 0 pending is fed twice, at the same column — and the
        row that follows the pending token [I, V]: what the first draft is drawn from."""
        n = state.length
        index = torch.stack([(n - 2).clamp(min=0), n - 1], dim=1)
        return self._restricted(self.model.window(state.tokens.gather(1, index), index)[:, 1])

    def extend(self, token: Any, index: Any) -> Any:
        """The draft token [I] at token index [I] through the model: the next row [I, V]."""
        return self._restricted(self.model.window(token[:, None], index[:, None])[:, 0])

    def expand(self, ids: Any, depths: Any, ancestry: Any, start: Any, slots: Any, parents: Any) -> Any:
        """A tree level through the model (DeviceModel.tree_window; `parents` is the head's business)."""
        return self._restricted(self.model.tree_window(ids, depths, ancestry, start, slots=slots))

    def verified(self, n: Any, path: Optional[Any] = None, slots: Optional[Any] = None) -> None:
        """A tree's accepted nodes (their scratch slots [I, D]) copied to the token columns from n."""
        if slots is not None:
            self.model.commit_path(slots, n)


class HeadDraft(Restricted):
    """An EAGLE head (runtime/backends/device_head.py DeviceHead) behind the seam, fed by `target`.

    Between rounds it keeps, per model row, the target's features along the last accepted path
    (`features` [rows, reach, H]: slot j the one before committed token previous + j) and each
    image's length at that round's start (`previous` [I]). Within a round, the head's own feature
    of the last chain draft (`_last`) and of every tree node by scratch slot (`_nodes`, the root's
    at slot 0, where no drafted node is written) feed the next pass."""

    def __init__(self, head: Any, target: Any, reach: int, sampling: SamplingParams):
        super().__init__(sampling)
        self.head, self.target, self.reach = head, target, reach
        rows, dim = head.row_image.shape[0], target.gpt.config.dim
        self.features = torch.zeros((rows, reach, dim), dtype=target.dtype, device=target.device)
        self.previous = torch.zeros(head.images, dtype=torch.int64, device=target.device)
        self._last: Any = None
        self._nodes: Any = None

    def start(self, rows: Any, images: Optional[Sequence[int]] = None) -> None:
        """The first pair: the target's prefill feature (it predicted image token 0) before token 0
        (`images`: only those admitted images', after their prefill)."""
        model_rows, chosen = ((slice(None), slice(None)) if images is None
                              else (self.head.image_rows(images), list(images)))
        self.features[model_rows] = 0
        self.features[model_rows, 0] = self.target.hidden[:, 0]
        self.previous[chosen] = 0

    def catch_up(self, state: RoundState) -> Any:
        """The last round's committed pairs (reach slots from token index `previous`) through the
        head, and the row after the pending pair [I, V]."""
        steps = torch.arange(self.reach, device=self.previous.device)
        index = (self.previous[:, None] + steps).clamp(max=state.tokens.shape[1] - 1)
        rows = self.head.pairs(state.tokens.gather(1, index), index, self.features)
        pending = (state.length - 1 - self.previous).clamp(min=0, max=self.reach - 1)  # finished images: padding
        image = torch.arange(pending.shape[0], device=pending.device)
        self._last = self._by_row(self.head.hidden, pending[:, None])  # [rows, 1, H]
        self._nodes = torch.zeros((self.features.shape[0], self.head.width - self.head.scratch, self.features.shape[2]),
                                  dtype=self._last.dtype, device=self._last.device)
        self._nodes[:, 0] = self._last[:, 0]
        return self._restricted(rows[image, pending])

    def extend(self, token: Any, index: Any) -> Any:
        """The pair (the head's feature of the last draft, token [I]) at token index [I]: the next row."""
        rows = self.head.pairs(token[:, None], index[:, None], self._last)[:, 0]
        self._last = self.head.hidden
        return self._restricted(rows)

    def expand(self, ids: Any, depths: Any, ancestry: Any, start: Any, slots: Any, parents: Any) -> Any:
        """A tree level: each node ids [I, M] paired with its parent's head feature (parents: their
        scratch slots, [M] or [I, M]; the root's 0); the nodes' own features kept at their slots [M]."""
        images = ids.shape[0]
        rows = self.head.tree_pairs(ids, depths, ancestry, start,
                                    self._by_row(self._nodes, parents.expand(images, -1)), slots)
        self._nodes[:, slots] = self.head.hidden.to(self._nodes.dtype)
        return self._restricted(rows)

    def verified(self, n: Any, path: Optional[Any] = None, slots: Optional[Any] = None) -> None:
        """Keep the target's features along the accepted path (its window slots [I, D + 1]; a chain's
        window in order when None) for the next catch-up, and the round's start n [I]."""
        hidden = self.target.hidden
        kept = hidden[:, : self.reach] if path is None else self._by_row(hidden, path[:, : self.reach])
        self.features.copy_(kept)
        self.previous.copy_(n)

    def _by_row(self, values: Any, slots: Any) -> Any:
        """values [rows, S, H] at each image's slots [I, K], for every row of the image: [rows, K, H]."""
        rows_slots = slots[self.head.row_image]
        return values.gather(1, rows_slots[:, :, None].expand(-1, -1, values.shape[2]))


def draft_of(runner: Any, target: Any, mix: Any, sampling: SamplingParams, window: int, reach: int) -> Any:
    """The seam over a draft runner for a round whose draft writes `window` scratch columns and
    commits at most `reach` tokens a round: a HeadDraft over an EAGLE head's runner (fed by the
    target's DeviceModel `target`), else a ModelDraft. Under greedy decoding the model is built
    unrestricted and the seam takes the argmax (module docstring): at temperature 0 the head's mix
    is temperature 1's (runtime.sampling.guidance_mix), so its rows are the softmax the host ranks."""
    from specrt.runtime.backends.device_head import device_head_of
    from specrt.runtime.backends.device_model import device_model_of
    from specrt.runtime.eagle import HeadRunner

    unrestricted = replace(sampling, temperature=1.0, top_k=0, top_p=1.0) if sampling.temperature == 0.0 else sampling
    if isinstance(runner, HeadRunner):
        return HeadDraft(device_head_of(runner, mix, unrestricted, max(window, reach)), target, reach, sampling)
    return ModelDraft(device_model_of(runner, mix, unrestricted, window), sampling)
