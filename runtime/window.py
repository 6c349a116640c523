"""Windows of tokens fed to a step graph: their positions and attention masks (docs/contracts.md).

A window is a forest-free tree: slot 0 hangs off the committed cache, every later slot has a
parent slot earlier in the window. A chain (AR, SD, SJD) is the tree whose parent of slot w is
w − 1; SJD-PAC's proactive drafts are real trees. A slot at depth d sits at sequence position
`length + d` (length = committed KV rows), and sees the cache [0, length) plus itself and its
ancestors, which is the causal mask for a chain and the tree mask for a tree.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence, Union

import numpy as np


class Window:
    """Token ids of the window slots and each slot's parent slot (−1 for slot 0).

    A chain (parents[w] == w − 1) has closed forms for depths, mask and paths; they are cached
    per size, because a decode loop builds one window per model call and small numpy calls
    cost more than the arithmetic they do at these sizes. Trees' and levels' depths and masks
    are cached per shape the same way (a static tree repeats its shapes every round).
    """

    __slots__ = ("ids", "_parents", "is_chain", "_depths", "staged", "_seen")

    def __init__(self, ids: np.ndarray, parents: np.ndarray | None = None):
        self.ids = ids              # int64 [W]
        self._parents = parents     # int64 [W]; None for a chain
        self.is_chain = parents is None
        self._depths: np.ndarray | None = None  # a level's own depths (Window.level)
        self.staged: np.ndarray | None = None   # bool [W, S]: which staged cache rows each slot sees
        self._seen: np.ndarray | None = None    # a tree's ancestry, made once (_tree_parts)

    @classmethod
    def level(cls, ids: Sequence[int], parents: Sequence[int], depths: Sequence[int],
              seen: Sequence[Sequence[int]], staged: int) -> "Window":
        """New nodes of a tree whose earlier nodes are staged in the cache (ModelRunner.stage):
        slot w sits at depth depths[w] below the committed length, sees its in-window parent
        chain (parents[w] < w, or −1 where its parent is staged) and the staged rows seen[w] (its
        staged ancestors) of the `staged` rows held. Each tree node is run once, level by level;
        a static tree's levels repeat round after round, so their masks are made once per shape."""
        layout = _level_layout(tuple(parents), tuple(depths), tuple(map(tuple, seen)), staged)
        window = cls(np.asarray(ids, dtype=np.int64), layout[0])
        window.is_chain = False
        window._depths, window.staged, window._seen = layout[1:]
        return window

    @classmethod
    def chain(cls, ids: Sequence[int]) -> "Window":
        return cls(np.asarray(ids, dtype=np.int64))

    @classmethod
    def tree(cls, ids: Sequence[int], parents: Sequence[int]) -> "Window":
        layout = _tree_layout(tuple(parents.tolist() if isinstance(parents, np.ndarray) else parents))
        window = cls(np.asarray(ids, dtype=np.int64), layout[0])
        window.is_chain = layout[0] is None
        window._depths, window._seen = layout[1:]
        return window

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def parents(self) -> np.ndarray:
        return _chain_parts(len(self))[0] if self._parents is None else self._parents

    def depths(self) -> np.ndarray:
        if self._depths is not None:
            return self._depths
        if self.is_chain:
            return _chain_parts(len(self))[1]
        self._tree_parts()
        return self._depths

    def ancestry(self) -> np.ndarray:
        """bool [W, W]: row w true at w and at every ancestor of w in the window (the in-window
        attention mask)."""
        if self.is_chain:
            return _chain_parts(len(self))[2]
        self._tree_parts()
        return self._seen

    def _tree_parts(self) -> None:
        """Ancestry and depths of a window made with parents but not through tree() or level()."""
        if self._seen is None:
            self._seen, depths = _ancestry(self._parents.tolist())
            if self._depths is None:  # in-window ancestors (a level window's depths are given)
                self._depths = depths

    def path_to(self, slot: int) -> list[int]:
        """Slots from slot 0 down to `slot` (the KV rows to commit when `slot` is the last accepted)."""
        if self.is_chain:
            return list(range(slot + 1))
        path = [slot]
        while self._parents[path[-1]] >= 0:
            path.append(int(self._parents[path[-1]]))
        return path[::-1]


@functools.lru_cache(maxsize=None)
def _chain_parts(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parents, depths, ancestry) of a chain of `size` slots, made once per size (read-only)."""
    depths = np.arange(size, dtype=np.int64)
    parts = (depths - 1, depths, np.tri(size, dtype=bool))
    for array in parts:
        array.setflags(write=False)
    return parts


def _ancestry(parents: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(ancestry bool [W, W], in-window depths) of a window's parents in one pass: each slot's
    ancestors as the bits of a Python int (its parent's | itself), unpacked once into the bool
    matrix. A per-slot numpy row OR cost ~50 us per 64-node window, once per SJD-PAC step."""
    masks: list[int] = []
    for w, parent in enumerate(parents):
        masks.append((masks[parent] if parent >= 0 else 0) | (1 << w))
    size = len(masks)
    width = (size + 7) // 8
    packed = np.frombuffer(b"".join(m.to_bytes(width, "little") for m in masks), dtype=np.uint8)
    seen = np.unpackbits(packed.reshape(size, width), axis=1, count=size, bitorder="little").astype(bool)
    return seen, np.fromiter((m.bit_count() - 1 for m in masks), dtype=np.int64, count=size)


def _frozen(*arrays: Optional[np.ndarray]) -> tuple[Optional[np.ndarray], ...]:
    """The arrays, read-only: cached layouts are shared by every window of their shape."""
    for array in arrays:
        if array is not None:
            array.setflags(write=False)
    return arrays


@functools.lru_cache(maxsize=1024)
def _tree_layout(parents: tuple[int, ...]) -> tuple[Optional[np.ndarray], Optional[np.ndarray], Optional[np.ndarray]]:
    """(parents, depths, ancestry) of a tree window, checked; (None, None, None) for a chain. Made
    once per shape (read-only): a static tree verifies the same shape every round, and SJD-PAC's
    windows repeat too."""
    if parents and (parents[0] != -1 or any(not 0 <= p < w for w, p in enumerate(parents) if w)):
        raise ValueError("tree windows need parents[0] == -1 and 0 <= parents[w] < w")
    if all(p == w - 1 for w, p in enumerate(parents)):
        return None, None, None
    array = np.array(parents, dtype=np.int64)
    seen, depths = _ancestry(parents)
    return _frozen(array, depths, seen)


@functools.lru_cache(maxsize=1024)
def _level_layout(parents: tuple[int, ...], depths: tuple[int, ...], seen: tuple[tuple[int, ...], ...],
                  staged: int) -> tuple[np.ndarray, ...]:
    """(parents, depths, staged rows seen [W, staged], ancestry) of a level window (Window.level),
    checked; made once per shape (read-only)."""
    if any(p >= w for w, p in enumerate(parents)):
        raise ValueError("level windows need parents[w] < w (or −1: staged)")
    size = len(parents)
    visible = np.zeros(size * staged, dtype=bool)
    visible[[w * staged + row for w, rows in enumerate(seen) for row in rows]] = True
    # a level whose parents all ran before (the usual one) sees only itself inside the window
    ancestry = _identity(size) if all(p < 0 for p in parents) else _ancestry(parents)[0]
    return _frozen(np.array(parents, dtype=np.int64), np.array(depths, dtype=np.int64),
                   visible.reshape(size, staged), ancestry)


def chains(feeds: Sequence[Optional[Sequence[int]]]) -> "Windows":
    """Each image's chain of tokens (None: no window) in the cheapest form runner.step takes: an
    int array [images, W] when every image feeds W tokens (no Window objects, no padding: most
    steps of a batch, every step at batch 1), else one Window per image."""
    first = feeds[0] if len(feeds) else None
    if first is not None and all(f is not None and len(f) == len(first) for f in feeds):
        return np.array(feeds, dtype=np.int64).reshape(len(feeds), len(first))
    return [Window.chain(f) if f is not None else None for f in feeds]


@functools.lru_cache(maxsize=None)
def _identity(size: int) -> np.ndarray:
    return _frozen(np.eye(size, dtype=bool))[0]


@functools.lru_cache(maxsize=8)
def _columns(capacity: int) -> np.ndarray:
    columns = np.arange(capacity)
    columns.setflags(write=False)
    return columns


Windows = Union[Window, np.ndarray, Sequence[Optional[Window]]]


def lone_window(windows: Windows) -> Optional[Window]:
    """The window of a one-image list of windows when it has slots (a batch-1 tree level), else
    None: the step's size is then that window's, with no per-image sizes to reduce."""
    if isinstance(windows, (Window, np.ndarray)) or len(windows) != 1:
        return None
    window = windows[0]
    return window if window is not None and len(window) else None


def fill_step_inputs(windows: Windows, lengths: int | Sequence[int] | np.ndarray,
                     capacity: int, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray,
                     caption_mask: np.ndarray | None = None) -> None:
    """Write one step's inputs into caller-owned buffers: image i's window after its `lengths[i]`
    committed rows, in batch row i and its CFG twins (rows i + images·k).

    ids, positions: [B, W]; mask: bool [B, W, capacity + W] (cache columns, then window slots);
    caption_mask: bool [B, cond_len] (t2i), the padded caption columns each row never sees.
    `windows` is one Window for every image, an int array [images, W] (image i's chain of W
    tokens: AR and lockstep drafting, with no Window objects to build), or one Window per image;
    a window shorter than W (or None) is padded: a pad slot has id 0, sits at the image's next
    position and sees the cache and itself only, so every row of the step is a well-defined
    token nobody reads.
    """
    batch, size = ids.shape
    if isinstance(windows, Window):
        windows = [windows]
    images = len(windows)
    pairs = batch // images
    if not (isinstance(lengths, np.ndarray) and lengths.shape == (images,)):  # a runner's own: as it is
        lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), (images,))
    by_pair = (pairs, images)  # batch row k·images + i is image i's CFG twin k
    if images == 1:  # the committed rows, then the rest: two fills
        mask[:, :, :int(lengths[0])] = True
        mask[:, :, int(lengths[0]):capacity] = False
    else:
        np.less(_columns(capacity), lengths[:, None, None], out=mask[:, :, :capacity].reshape(*by_pair, size, capacity))
    if caption_mask is not None:
        mask[:, :, :caption_mask.shape[1]] &= caption_mask[:, None, :]
    block = mask[:, :, capacity:capacity + size]
    if isinstance(windows, np.ndarray):  # chains of the full width, one per image
        if images == 1:  # every row is the image or its twin: plain broadcasts
            ids[:] = windows
            np.add(_chain_parts(size)[1], int(lengths[0]), out=positions)
        else:
            ids.reshape(*by_pair, size)[:] = windows
            np.add(lengths[:, None], _chain_parts(size)[1], out=positions.reshape(*by_pair, size))
        block[:] = _chain_parts(size)[2]
        return
    first = windows[0]
    if first is not None and len(first) == size and (images == 1 or first.staged is None and all(
            w is first or (w is not None and w.is_chain and first.is_chain and len(w) == size) for w in windows)):
        # every image runs a window of this shape (most speculative steps, any window of one image): no padding
        if images == 1:  # every row is the image or its twin: plain broadcasts
            ids[:] = first.ids
            np.add(first.depths(), int(lengths[0]), out=positions)
        else:
            ids.reshape(*by_pair, size)[:] = first.ids if all(w is first for w in windows) else \
                np.stack([w.ids for w in windows])
            np.add(lengths[:, None], first.depths(), out=positions.reshape(*by_pair, size))
        block[:] = first.ancestry()
        if first.staged is not None:  # one image: the staged rows after its committed ones (ModelRunner.stage)
            start = int(lengths[0])
            mask[:, :, start:start + first.staged.shape[1]] = first.staged
        return
    ids[:] = 0
    positions.reshape(*by_pair, size)[:] = lengths[:, None]
    block[:] = _identity(size)  # pad slots see themselves
    for i, window in enumerate(windows):
        if window is None or not len(window):
            continue
        n, rows = len(window), slice(i, batch, images)
        ids[rows, :n] = window.ids
        positions[rows, :n] = lengths[i] + window.depths()
        block[rows, :n, :n] = window.ancestry()
        if window.staged is not None:  # the staged rows after the committed ones (ModelRunner.stage)
            start = int(lengths[i])
            mask[rows, :n, start:start + window.staged.shape[1]] = window.staged
