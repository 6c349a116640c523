"""Windows of tokens fed to a step graph: their positions and attention masks (docs/contracts.md).

A window is a forest-free tree: slot 0 hangs off the committed cache, every later slot has a
parent slot earlier in the window. A chain (AR, SD, SJD) is the tree whose parent of slot w is
w − 1; SJD-PAC's proactive drafts are real trees. A slot at depth d sits at sequence position
`length + d` (length = committed KV rows), and sees the cache [0, length) plus itself and its
ancestors, which is the causal mask for a chain and the tree mask for a tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class Window:
    """Token ids of the window slots and each slot's parent slot (−1 for slot 0)."""

    ids: np.ndarray      # int64 [W]
    parents: np.ndarray  # int64 [W]
    is_chain: bool = False  # parents[w] == w − 1: depths and mask have closed forms (the hot path)

    @classmethod
    def chain(cls, ids: Sequence[int]) -> "Window":
        ids = np.asarray(ids, dtype=np.int64)
        return cls(ids, np.arange(len(ids), dtype=np.int64) - 1, is_chain=True)

    @classmethod
    def tree(cls, ids: Sequence[int], parents: Sequence[int]) -> "Window":
        parents = np.asarray(parents, dtype=np.int64)
        later = parents[1:]
        if len(parents) and (parents[0] != -1 or np.any(later < 0) or np.any(later >= np.arange(1, len(parents)))):
            raise ValueError("tree windows need parents[0] == -1 and 0 <= parents[w] < w")
        is_chain = bool(np.array_equal(parents, np.arange(len(parents)) - 1))
        return cls(np.asarray(ids, dtype=np.int64), parents, is_chain=is_chain)

    def __len__(self) -> int:
        return len(self.ids)

    def depths(self) -> np.ndarray:
        if self.is_chain:
            return np.arange(len(self), dtype=np.int64)
        depth = np.zeros(len(self), dtype=np.int64)
        for w in range(1, len(self)):
            depth[w] = depth[self.parents[w]] + 1
        return depth

    def ancestry(self) -> np.ndarray:
        """bool [W, W]: row w true at w and at every ancestor of w (the in-window attention mask)."""
        if self.is_chain:
            return np.tri(len(self), dtype=bool)
        seen = np.eye(len(self), dtype=bool)
        for w in range(1, len(self)):
            seen[w] |= seen[self.parents[w]]
        return seen

    def path_to(self, slot: int) -> list[int]:
        """Slots from slot 0 down to `slot` (the KV rows to commit when `slot` is the last accepted)."""
        path = [slot]
        while self.parents[path[-1]] >= 0:
            path.append(int(self.parents[path[-1]]))
        return path[::-1]


def fill_step_inputs(window: Window, length: int, capacity: int, ids: np.ndarray, positions: np.ndarray,
                     mask: np.ndarray) -> None:
    """Write one window's inputs, identical in every batch row, into caller-owned buffers.

    ids, positions: [B, W]; mask: bool [B, W, capacity + W] (cache columns, then window slots).
    """
    size = len(window)
    ids[:] = window.ids[None, :]
    positions[:] = (length + window.depths())[None, :]
    mask[:] = False
    mask[:, :, :length] = True
    mask[:, :, capacity:capacity + size] = window.ancestry()[None]
