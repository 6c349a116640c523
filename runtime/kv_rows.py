"""Each image's rows in a runner's KV cache: how many are committed and staged, and the copies
that commit, stage, adopt and roll them back.

Why a module of its own: a runner (runtime/runner.py ModelRunner) runs graphs on buffers it
allocated once, and it keeps track of which cache columns hold what; this is the second job.
`commit(slots)` writes the rows of each image's accepted slots at its committed length
(docs/contracts.md), so rejecting tokens costs nothing, `truncate` rolls images back, and a tree
drafter keeps its nodes as staged rows (`stage`, `adopt`). The common cases are block copies, not
gathers of single rows: a prefix 0..n − 1 of the window (AR, chains, the Jacobi spine), a tree
level's run of slots, the moves of an accepted path. Backends implement `_write_kv` (and `_move_kv`
where they stage trees) and may override `_write_runs`, `_write_block` and `_move_block` with block
copies of their own; regroup_kv and uniform_run are their helpers for the same copies.
"""
from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from typing import Any, Optional, Sequence, Union

import numpy as np

Slots = Union[Sequence[int], Sequence[Optional[Sequence[int]]]]  # the same for every image, or per image


class KVRows(ABC):
    """The committed and staged KV rows of each image of a batch, and the copies between a step's
    present rows and the cache.

    `lengths[i]`: image i's committed rows, its CFG twins alike (model batch row i + images·k);
    `staged[i]`: rows held after them. The runner (ModelRunner) sets these, `batch` and `capacity`
    when it allocates, and counts the copies' time in `cache_seconds`.
    """

    batch: int
    capacity: int
    lengths: np.ndarray
    staged: np.ndarray
    cache_seconds: float
    _zeros: np.ndarray  # [images] zeros, read-only: runs from slot 0 (commits of prefixes)

    @property
    @abstractmethod
    def images(self) -> int:
        """Images per pass (each with its CFG twins in the model batch)."""

    @abstractmethod
    def _write_kv(self, rows: np.ndarray, columns: np.ndarray, slots: np.ndarray) -> None:
        """kv[:, :, rows[n], :, columns[n]] = present[:, :, rows[n], :, slots[n]] for every n, from
        the last step's window (rows: model batch rows; equal-length int arrays)."""

    @property
    def length(self) -> int:
        """The committed length shared by every image of the batch (one image, or AR's lockstep);
        ragged batches read `lengths`."""
        if len(self.lengths) and np.any(self.lengths != self.lengths[0]):
            raise ValueError("the images of this batch have different lengths: read runner.lengths")
        return int(self.lengths[0]) if len(self.lengths) else 0

    def commit(self, slots: Slots) -> None:
        """Append the KV rows of the last window's slots (in order) at each image's committed
        length: `slots` for every image, or one entry per image (None or empty: nothing).

        The common case, every image keeping a prefix 0..n_i − 1 of its window (AR, chains, the
        Jacobi spine), is a strided block copy per image (one for the whole batch when every
        image keeps the same count at the same length), not a gather of single rows."""
        start = time.perf_counter()
        if (prefixes := self._prefix_counts(slots)) is not None:  # a range 0..n − 1 included: every image, one prefix
            if len(prefixes) == 1:  # one image (batch 1): one block, its count as a Python int
                if prefixes[0]:
                    self._write_block(int(self.lengths[0]), 0, prefixes[0])
                    self.lengths[0] += prefixes[0]
            elif any(prefixes):
                counts = np.array(prefixes, dtype=np.int64)
                self._write_runs(self.lengths, self._zeros[: self.images], counts)
                self.lengths += counts
        else:
            per_image = self._per_image(slots)
            self._write_slots(per_image, self.lengths)
            if len(per_image) == 1:  # one image: its count as an int (a list would become an array first)
                self.lengths[0] += len(per_image[0])
            else:
                self.lengths += [len(s) for s in per_image]
        self.cache_seconds += time.perf_counter() - start

    def commit_chain(self, sizes: Sequence[int], drafts: Sequence[int]) -> None:
        """After `chain`: commit image p's window (its first sizes[p] slots) and the first
        drafts[p] − 1 drafts it fed (their rows start after the widest window; the last draft was
        never fed); an image without a window or drafts keeps nothing."""
        width = max(sizes, default=0)
        self.commit([None if not size or count <= 0 else range(size + count - 1) if size == width else
                     [*range(size), *range(width, width + count - 1)] for size, count in zip(sizes, drafts)])

    def _prefix_counts(self, slots: Slots) -> Optional[list[int]]:
        """n_i per image when image i keeps its window's first n_i slots (in order); None otherwise."""
        if isinstance(slots, range) or not len(slots) or isinstance(slots[0], (int, np.integer)):
            count = _prefix_length(slots)
            return None if count is None else [count] * self.images
        if len(slots) != self.images:
            raise ValueError(f"{len(slots)} slot lists for a batch of {self.images} images")
        counts = [_prefix_length(image_slots) if image_slots is not None else 0 for image_slots in slots]
        return None if None in counts else counts

    def _write_runs(self, columns: np.ndarray, starts: np.ndarray, counts: np.ndarray | Sequence[int]) -> None:
        """kv[rows of image i, columns[i] + n] = present[rows of image i, starts[i] + n] for
        n < counts[i], the CFG twins alike: contiguous runs of window slots (a prefix to commit,
        a tree level to stage). Backends override it with block copies; this default goes
        through the general `_write_kv`. counts may be a list (one image's commit)."""
        image = np.repeat(np.arange(self.images), counts)
        offsets = np.concatenate([np.arange(n) for n in counts])
        self._write_kv(*self._twin_rows(image, offsets + columns[image], offsets + starts[image]))

    def _write_block(self, column: int, start: int, count: int) -> None:
        """kv[every row, column + n] = present[every row, start + n] for n < count: a run of a batch of
        one image (its CFG twins included), the commits and levels of batch 1. Backends with block
        copies override it; this default goes through `_write_runs`."""
        self._write_runs(np.array([column]), np.array([start]), [count])

    def _move_block(self, column: int, source: int, count: int) -> None:
        """kv[every row, column + n] = kv[every row, source + n] for n < count (column < source): a
        batch of one image's staged run moved down by adopt. This default goes through `_move_kv`."""
        offsets = np.arange(count)
        self._move_kv(*self._twin_rows(np.zeros(count, dtype=np.int64), column + offsets, source + offsets))

    def _write_slots(self, per_image: Sequence[Sequence[int]], base: np.ndarray) -> None:
        """The last window's slots of each image (in order) to its rows base[i], base[i] + 1, ...
        (the general case of commit and stage: any slots, a gather; indices built as lists, which
        at a tree path's few slots costs less than the numpy calls that would build them; a batch of
        one image copies each run of consecutive slots as a block)."""
        if len(per_image) == 1:
            for column, start, count in _runs(range(int(base[0]), int(base[0]) + len(per_image[0])), per_image[0]):
                self._write_block(column, start, count)
            return
        image: list[int] = []
        columns: list[int] = []
        sources: list[int] = []
        for i, (slots, column) in enumerate(zip(per_image, base.tolist())):
            image += [i] * len(slots)
            columns += range(column, column + len(slots))
            sources += slots
        if image:
            self._write_kv(*self._twin_rows(np.array(image), np.array(columns), np.array(sources, dtype=np.int64)))

    def _twin_rows(self, image: np.ndarray, columns: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, ...]:
        """(model rows, columns, sources) of per-image (column, source) pairs: image i's pairs for
        its row i and each of its CFG twins (rows i + images·k), which commit alike."""
        images, pairs = self.images, self.batch // self.images
        if pairs == 1:
            return image, columns, sources
        return (np.concatenate([image + images * k for k in range(pairs)]), np.concatenate([columns] * pairs),
                np.concatenate([sources] * pairs))

    # ---- trees held in the cache (a drafter's nodes, each run once) ------------------------------

    stages_trees = False  # the backend implements _move_kv: stage/adopt work

    def stage(self, slots: Slots) -> None:
        """Keep the last window's `slots` (for every image, or one list per image) as staged rows
        after each image's rows staged so far: not committed (lengths do not move), visible to
        later windows only where a window's `staged` mask says so (runtime.window.Window.level).
        A tree drafter keeps its nodes here, so each depth feeds only the new level (EAGLE's
        tree attention); truncate drops them, adopt commits a path of them."""
        per_image = self._per_image(slots)
        if len(per_image) == 1:  # one image (batch 1): its counts as Python ints, a level as one block
            self._stage_one(per_image[0])
            return
        sizes = [len(s) for s in per_image]
        if not any(sizes):
            return
        start = time.perf_counter()
        columns = self.lengths + self.staged
        if max(column + size for column, size in zip(columns.tolist(), sizes)) > self.capacity:
            raise ValueError(f"staging {sizes} rows overflows capacity {self.capacity}")
        counts = np.array(sizes, dtype=np.int64)
        if all(_consecutive(s) for s in per_image):
            # each image stages a run of consecutive slots (a level, a root and its closure): block copies
            self._write_runs(columns, np.array([s[0] if len(s) else 0 for s in per_image], dtype=np.int64), counts)
        else:
            self._write_slots([[int(x) for x in s] for s in per_image], columns)
        self.staged += counts
        self.cache_seconds += time.perf_counter() - start

    def _stage_one(self, slots: Sequence[int]) -> None:
        """stage for a batch of one image: a tree level's run of slots is one block copy."""
        size = len(slots)
        if not size:
            return
        start = time.perf_counter()
        column = int(self.lengths[0]) + int(self.staged[0])
        if column + size > self.capacity:
            raise ValueError(f"staging {[size]} rows overflows capacity {self.capacity}")
        if _consecutive(slots):
            self._write_block(column, int(slots[0]), size)
        else:
            self._write_slots([[int(x) for x in slots]], np.array([column]))
        self.staged[0] += size
        self.cache_seconds += time.perf_counter() - start

    def adopt(self, staged_rows: Slots) -> None:
        """Commit these staged rows (indices in staging order, increasing: an accepted tree path;
        for every image, or one list per image) after each image's committed length, and drop
        the rest of the staged rows."""
        per_image = [[int(s) for s in order] for order in self._per_image(staged_rows)]
        for order, staged in zip(per_image, self.staged.tolist()):
            if order and (any(b <= a for a, b in zip(order, order[1:])) or order[0] < 0 or order[-1] >= staged):
                raise ValueError(f"staged rows {order} are not increasing indices below {staged}")
        start = time.perf_counter()
        if len(per_image) == 1:  # one image (batch 1): its moved rows as block moves, its count as an int
            length, order = int(self.lengths[0]), per_image[0]
            moved = [n for n, row in enumerate(order) if row != n]  # rows already in place stay
            for column, source, count in _runs([length + n for n in moved], [length + order[n] for n in moved]):
                self._move_block(column, source, count)
            self.lengths[0] += len(order)
            self.staged[0] = 0
            self.cache_seconds += time.perf_counter() - start
            return
        image: list[int] = []
        columns: list[int] = []
        sources: list[int] = []
        for i, (order, length) in enumerate(zip(per_image, self.lengths.tolist())):
            for n, row in enumerate(order):
                if row != n:  # rows already in place stay (the root, often its first child)
                    image.append(i)
                    columns.append(length + n)
                    sources.append(length + row)
        if image:
            self._move_kv(*self._twin_rows(np.array(image), np.array(columns), np.array(sources)))
        self.lengths += [len(order) for order in per_image]
        self.staged[:] = 0
        self.cache_seconds += time.perf_counter() - start

    def _move_kv(self, rows: np.ndarray, columns: np.ndarray, sources: np.ndarray) -> None:
        """kv[:, :, rows[n], :, columns[n]] = kv[:, :, rows[n], :, sources[n]] (columns[n] < sources[n])."""
        raise NotImplementedError(f"{type(self).__name__} keeps no staged rows")

    def _per_image(self, slots: Slots) -> list[Sequence[int]]:
        slots = list(slots)
        if not slots or isinstance(slots[0], (int, np.integer)):
            return [slots] * self.images
        if len(slots) != self.images:
            raise ValueError(f"{len(slots)} slot lists for a batch of {self.images} images")
        return [s if s is not None else () for s in slots]

    def truncate(self, lengths: int | Sequence[int] | np.ndarray) -> None:
        """Roll back to `lengths` committed rows (one for every image, or one per image): free,
        the stale rows are masked out and overwritten."""
        if len(self.lengths) == 1 and not isinstance(lengths, np.ndarray):  # one image: its two counts as ints
            length = lengths if isinstance(lengths, (int, np.integer)) else lengths[0]
            self.lengths[0] = min(int(self.lengths[0]), int(length))
            self.staged[0] = 0
            return
        np.minimum(self.lengths, np.asarray(lengths, dtype=np.int64), out=self.lengths)
        self.staged[:] = 0

    def columns_in_use(self) -> int:
        """KV columns any image reads before writing: the longest committed + staged rows."""
        return int((self.lengths + self.staged).max(initial=0))


def regroup_kv(flat: Any, old: Any, rows: Any, used: int) -> Any:
    """The new batch's KV view [L, 2, len(rows), Hkv, C, D] at the front of the flat buffer `flat`
    that `old` views, with new[:, :, j] = old[:, :, rows[j]] over the first `used` columns (numpy
    arrays or torch tensors alike): the rows a shrinking batch keeps moved down in place, or a
    growing batch's rows moved up (a row may appear twice: a new image's placeholder).

    Why block by block: gathering every kept row first and copying it back moves the buffer's data
    twice (3 ms a runner on the demo CPU at batch 8, each time an image finished). When the batch
    shrinks, the new (layer, key|value) block b ends at or below the old block b's end, so gathering
    each block (a copy) before writing it, in ascending order, never overwrites a row still to be
    read; when it grows, the new block b starts at or above the old one's start, so descending order
    does the same. The data moves once, a block at a time, and only the columns in use (the rest
    are never read before they are written)."""
    shape = (*old.shape[:2], len(rows), *old.shape[3:])
    new = flat[: math.prod(shape)].reshape(shape)  # a view of the same memory
    blocks = [(layer, part) for layer in range(old.shape[0]) for part in range(old.shape[1])]
    for layer, part in reversed(blocks) if len(rows) > old.shape[2] else blocks:
        new[layer, part, :, :, :used] = old[layer, part, rows, :, :used]
    return new


def uniform_run(columns: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> Optional[tuple[int, int, int]]:
    """(column, start, count) when every image copies the same run to the same column: one block copy."""
    if len(counts) == 1 or (len(counts) and (counts == counts[0]).all() and (columns == columns[0]).all()
                            and (starts == starts[0]).all()):
        return int(columns[0]), int(starts[0]), int(counts[0])
    return None


def _runs(targets: Sequence[int], sources: Sequence[int]) -> list[tuple[int, int, int]]:
    """(target, source, count) of each maximal run where targets and sources both go up by one."""
    runs: list[tuple[int, int, int]] = []
    for target, source in zip(targets, sources):
        if runs and runs[-1][0] + runs[-1][2] == target and runs[-1][1] + runs[-1][2] == source:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((int(target), int(source), 1))
    return runs


def _consecutive(slots: Sequence[int]) -> bool:
    """slots is k, k + 1, ..., k + n − 1 (or empty)."""
    if isinstance(slots, range):
        return slots.step == 1 or len(slots) < 2
    return all(b == a + 1 for a, b in zip(slots, slots[1:]))


def _prefix_length(slots: Sequence[int]) -> Optional[int]:
    """len(slots) if slots is 0, 1, ..., n − 1, else None."""
    if isinstance(slots, range):
        return len(slots) if not len(slots) or (slots.start == 0 and slots.step == 1) else None
    count = len(slots)
    return count if all(int(s) == n for n, s in enumerate(slots)) else None
