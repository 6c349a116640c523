"""The narrow backend interface: one runner per model role (target, draft) over preallocated buffers.

A runner owns its KV buffer [L, 2, B, Hkv, capacity, D] and the step inputs (ids, positions,
mask, uniforms) sized for the largest window, all allocated once per generate call. Every
image of the batch (with its CFG row) has its own committed length (`lengths`): `step` runs one
window per image (ragged: shorter windows are padded, pad slots see only the cache and
themselves and are never committed; an image without a window costs only pad slots) through
the model and its sampling head (runtime/head.py) and keeps the window's present rows, which
`commit`, `stage` and `adopt` copy into the cache (runtime/kv_rows.py, the runner's base).
`retain(images)` drops finished images from the batch, so they stop costing work. Backends
(torch, onnxruntime, TensorRT, the toy used by the tests) implement five small hooks (four here,
`_write_kv` there); everything else, including timing, lives here once.
"""
from __future__ import annotations

import time
from abc import abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.conditions import Conditions, as_conditions
from specrt.runtime.kv_rows import KVRows
from specrt.runtime.siblings import twin_runner
from specrt.runtime.window import Window, Windows, fill_step_inputs, lone_window


@dataclass(frozen=True)
class ModelSpec:
    """What the runtime needs to know about a model (manifest 'models.<role>' keys)."""

    vocab_size: int
    grid_size: int
    num_classes: int = 0       # c2i
    cond_len: int = 1
    model_type: str = "c2i"    # or "t2i", or "prompt" (token prompts: unified-vocabulary models)
    caption_dim: int = 0       # t2i
    stream_len: int = 0        # tokens decoded per image when not grid² (a grammar with row ends: runtime/grammar.py)

    @property
    def null_class(self) -> int:
        """The CFG unconditional class id (LlamaGen: the extra embedding row after the classes)."""
        return self.num_classes

    @property
    def num_image_tokens(self) -> int:
        """Tokens a method decodes per image: the grid, or a unified model's whole stream."""
        return self.stream_len or self.grid_size * self.grid_size


@contextmanager
def draws_left_on_device(runner: "ModelRunner") -> Iterator[None]:
    """Clear `runner.draws_to_host` for the block (restored after, nesting included): its steps'
    draws are not read as they come (ModelRunner.draws_to_host)."""
    before, runner.draws_to_host = runner.draws_to_host, False
    try:
        yield
    finally:
        runner.draws_to_host = before


@dataclass
class StepOutput:
    """What one prefill or step hands the host: the head's rows and one draw per row.

    probs: [images, W, V] float32, indexable like numpy (a host array, or a device-resident
      view whose rows are fetched only when read, see backends/device_outputs.DeviceRows).
    draws: int [images, W] on the host, drawn with the uniforms the step was given (a device view
      that reads itself on first use where the caller cleared the runner's `draws_to_host`).
    Valid until the runner's second next step: backends alternate two output buffers, so the
    previous step's rows (SJD's stale drafts) survive the current one.
    """

    probs: Any
    draws: np.ndarray
    # greedy decoding only: the head's softmax before the argmax (probs are then one-hot), the
    # order in which a tree drafts its top-k children (EAGLE's greedy trees)
    ranking: Any = None

    def tree_rows(self) -> Any:
        """The rows a tree drafter grows children from: `ranking` under greedy decoding, else probs."""
        return self.probs if self.ranking is None else self.ranking


@dataclass
class GrownTrees:
    """What a dynamic tree grown in one call hands the host (runtime/chain.py DraftGrowth, host
    arrays, valid until the runner's next call): per image, every candidate's token [I, C] and
    score [I, C] (float64, −inf without mass) and each fed frontier node's candidate index
    within its pass [I, fed] (runtime/tree_call.py GrowthLayout: the orders)."""

    tokens: np.ndarray
    scores: np.ndarray
    fronts: np.ndarray


class ModelRunner(KVRows):
    """Runs one model's prefill and step graphs on buffers it allocated once.

    Counters: `forwards` (graph runs), `image_forwards` (images those runs advanced), `forward_seconds` (time inside the graph calls),
    `cache_seconds` (input preparation, KV commits): the Stats time breakdown reads them.
    Device backends also count `host_numbers`, the numbers read back from the device (draws
    and the probabilities verification touches, 4 bytes each): `meters_host_reads` says a
    backend does, so a report can tell "nothing read" from "not measured".

    Model batch rows: image i is row i, and under CFG its uncond twin is row i + images.
    """

    meters_host_reads = False
    # Share of the batch that must have finished before finished images leave it (retain): 0 drops
    # them at once, moving KV rows being cheap next to a step; a runner whose shrink costs more
    # (CUDA graphs re-captured) waits for a larger share and lets finished images ride as pad rows.
    retain_share = 0.0
    keep_hidden = False  # set (before allocate) when an EAGLE head drafts from this model's features
    # set by a tree drafter around its passes: it reads every row it asked for on the host, so a
    # device backend hands the rows back with the draws in one transfer (host rows: no effect)
    rows_to_host = False
    # cleared around a step whose draws are redrawn after a restriction (top-k, top-p, greedy:
    # decoding.Decoding._restricted) and never read, so a device backend may leave them where
    # they are (a view that reads itself to the host on first use: backends/device_outputs.DeviceDraws)
    draws_to_host = True
    # a runner the device round (runtime/rounds) can take the model of: the PyTorch backend's
    device_rounds = False
    on_accelerator = False  # its model runs on a GPU (the device round is then the default loop)

    # the runner can make a `sibling`: a backend whose buffers live where a shallow copy cannot tell
    # (TensorRT's execution contexts bind device memory) says False
    siblings = True

    def __init__(self, spec: ModelSpec, max_window: int):
        self.spec = spec
        self.max_window = max_window
        self._unallocated()

    def _unallocated(self) -> None:
        """The state a runner has before its first allocate: no buffers, counters at 0. Backends
        add the buffers and caches of their own (calling this), so a sibling starts from it."""
        self.batch = 0
        self.batch_room = 0  # model batch rows the buffers were allocated for (retain and grow stay within)
        self._allocated: tuple[int, int, int] = (0, 0, 0)  # (images, batch, capacity) the buffers were made for
        self.capacity = 0
        self.lengths = np.zeros(0, dtype=np.int64)  # committed KV rows of each image in the batch
        self.staged = np.zeros(0, dtype=np.int64)   # rows held after them: a drafted tree's nodes (stage)
        self.forwards = 0
        self.image_forwards = 0  # images run, summed over graph runs (an empty window runs none)
        self.forward_seconds = 0.0
        self.cache_seconds = 0.0
        self.host_numbers = 0
        self.host_syncs = 0  # transfers that wait for the device: reads back, index copies to it
        self._ids = self._positions = self._mask = self._uniforms = np.zeros(0)
        self.mix = np.zeros((0, 0), dtype=np.float32)
        self._caption_mask: np.ndarray | None = None  # t2i: bool [B, cond_len] of the last prefill
        self._views: dict[int, tuple[np.ndarray, ...]] = {}  # window size -> step input views (_step_views)
        self._last = np.zeros(0, dtype=np.int32)
        self._zeros = np.zeros(0, dtype=np.int64)

    def sibling(self) -> "ModelRunner":
        """A runner over the same model — its sessions, graphs and weights shared, not copied — with
        buffers, caches and counters of its own, made at its first allocate.

        Why: an in-flight scheduler decodes several groups' batches in turn (runtime/scheduling),
        each keeping its images' KV rows between its rounds, on one copy of the weights. The two
        runners must not run at the same time from two threads (the scheduler's one worker runs
        them in turn)."""
        if not self.siblings:
            raise SpecrtError(f"{type(self).__name__} cannot share its model with a second set of buffers")
        return twin_runner(self)

    # ---- hooks a backend implements -----------------------------------------------------
    # (and the KV copies' own, `_write_kv` and `_move_kv`: runtime/kv_rows.py)

    @abstractmethod
    def _allocate_kv(self, batch: int, capacity: int) -> None:
        """Allocate the KV buffer (and any output buffers) for this batch and capacity."""

    @abstractmethod
    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        """Run the condition tokens of `rows` (feeds() by graph input name), write their KV rows
        at [0, cond_len); the head's output [I,1,V]."""

    @abstractmethod
    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        """Run a window (inputs [B,W], [B,W], [B,W,capacity+W], uniforms [I,W]) and the head with
        `self.mix`; keep the present rows; return the head's output [I,W,V]."""

    @abstractmethod
    def _retain(self, rows: np.ndarray) -> None:
        """Keep the KV rows of model batch rows `rows` (in order) as rows 0..len(rows) − 1, the
        new batch (self.batch is still the old one; self.mix, lengths and staged are already the
        new batch's). Columns at or past an image's lengths + staged hold nothing that is read
        before it is written, so a backend may leave them behind. The new batch may be larger
        (`grow`: a row may then appear twice), never beyond `batch_room` rows."""

    def _chain(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
               uniforms: np.ndarray) -> StepOutput:
        """A draft chain (runtime/chain.py) of uniforms.shape[1] drafts after the window (inputs as
        _step's, last [I] int32: each image's last real slot); keep the present rows of the window
        and of the drafts fed (slots W, W + 1, ...); the head's output [I, steps, V]. Backends that
        can (can_chain) implement it."""
        raise NotImplementedError(f"{type(self).__name__} runs no draft chains")

    def can_chain(self, steps: int) -> bool:
        """True when `chain` can draw `steps` drafts in one call on this runner."""
        return False

    def _hidden_rows(self, slots: Sequence[int]) -> np.ndarray:
        """float32 [B, n, H]: the final-norm hidden states of the last prefill/step's `slots`."""
        raise SpecrtError(f"{type(self).__name__} keeps no hidden states: an EAGLE draft needs a target "
                          "exported with them (drop --no-hidden)")

    @property
    @abstractmethod
    def kv_buffer(self) -> object:
        """The KV buffer object (tests check it is the same object for a whole generate call)."""

    # ---- the interface the decoding methods use ----------------------------------------------

    def default_capacity(self) -> int:
        return self.spec.cond_len + self.spec.num_image_tokens + self.max_window

    @property
    def images(self) -> int:
        """Images per pass: the head's output rows (the batch is [cond; uncond] under CFG)."""
        return self.mix.shape[0]

    def allocate(self, mix: np.ndarray, capacity: int | None = None) -> None:
        """Allocate the KV buffer and step inputs for a generate call; lengths back to 0.

        mix [images, batch] is the sampling head's guidance matrix (sampling.guidance_mix);
        its shape sets the model batch.
        """
        mix = np.ascontiguousarray(mix, dtype=np.float32)
        images, batch = mix.shape
        capacity = capacity or self.default_capacity()
        shape = (images, batch, capacity)
        if shape != self._allocated:
            self.batch, self.capacity, self.mix = batch, capacity, mix
            self._ids = self._host_buffer(batch * self.max_window, np.int32)
            self._positions = self._host_buffer(batch * self.max_window, np.int32)
            self._mask = self._host_buffer(batch * self.max_window * (capacity + self.max_window), np.bool_)
            self._uniforms = self._host_buffer(images * self.max_window, np.float32)
            self._last = self._host_buffer(images, np.int32)  # a draft chain's last window slot per image
            self._allocate_kv(batch, capacity)
            self._allocated, self.batch_room = shape, batch
            self._views = {}
        elif batch != self.batch:
            # these buffers, regrouped since (retain, grow): viewed whole again, nothing moved (no row is
            # in use), where allocating them afresh cost an in-flight batch's opening ~10 ms on the demo
            self.lengths = self.staged = np.zeros(self.images, dtype=np.int64)
            self.mix = mix
            self._retain(np.zeros(batch, dtype=np.int64))
            self.batch, self._views = batch, {}
        else:
            self.mix[...] = mix  # same shape: the backends' bound mix buffer takes the new values
        self.lengths = np.zeros(images, dtype=np.int64)
        self.staged = np.zeros(images, dtype=np.int64)
        self._caption_mask = None  # a prefill (or an admit) sets it for the rows it conditions
        self._zeros = np.zeros(images, dtype=np.int64)  # runs from slot 0 (commits of prefixes)
        self._zeros.setflags(write=False)

    def _host_buffer(self, count: int, dtype: Any) -> np.ndarray:
        """A zeroed flat host buffer for step inputs; a backend that copies them to a device may
        give page-locked memory, which its copies need to be asynchronous."""
        return np.zeros(count, dtype=dtype)

    def _uniform_view(self, uniforms: np.ndarray, size: int) -> np.ndarray:
        view = self._uniforms[: self.images * size].reshape(self.images, size)
        view[...] = uniforms
        return view

    def prefill(self, rows: Conditions | np.ndarray, uniforms: np.ndarray) -> StepOutput:
        """Condition tokens (Conditions, or class ids) -> the head's output for image token 0 [I,1,V]; their KV rows are
        committed, and a t2i caption mask hides padded caption rows from every later step."""
        rows = as_conditions(rows)
        if len(rows) != self.batch:
            raise ValueError(f"prefill expects {self.batch} condition rows, got {len(rows)}")
        if rows.kind != self.spec.model_type:
            want = {"c2i": "class ids", "t2i": "caption embeddings", "prompt": "token prompts"}[self.spec.model_type]
            raise SpecrtError(f"this is a {self.spec.model_type} model: it is conditioned on {want}")
        self._caption_mask = rows.caption_mask
        start = time.perf_counter()
        out = self._prefill(rows, self._uniform_view(uniforms, 1))
        self.forward_seconds += time.perf_counter() - start
        self.forwards += 1
        self.image_forwards += self.images
        self.lengths[:] = self.spec.cond_len
        return out

    def admit(self, positions: Sequence[int], rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        """Start images `positions` of the allocated batch over as new images (in-flight batching,
        runtime/scheduling): one prefill of their condition rows alone — [cond; uncond] under CFG, each
        block in `positions` order, as condition_rows makes them — their KV rows written at
        [0, cond_len) of their model rows, their committed lengths cond_len. One call for the images
        a scheduler admits together, not one each. Every other image's rows, lengths and staged rows
        stay as they are, so images decoding beside them are not disturbed. The head's output for
        each one's image token 0 [k, 1, V], drawn with uniforms [k, 1]. Only where `admits` (a
        backend with _prefill_rows)."""
        rows = as_conditions(rows)
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        pairs = self.batch // max(self.images, 1)
        if not positions.size or len(set(positions.tolist())) != positions.size:
            raise ValueError(f"admit takes distinct batch positions, got {positions.tolist()}")
        if positions.min() < 0 or positions.max() >= self.images:
            raise ValueError(f"batch positions {positions.tolist()} reach outside a batch of {self.images} images")
        if len(rows) != pairs * positions.size:
            raise ValueError(f"admit expects {pairs * positions.size} condition rows ({pairs} an image), "
                             f"got {len(rows)}")
        if rows.kind != self.spec.model_type:
            raise SpecrtError(f"this is a {self.spec.model_type} model: its conditions are not {rows.kind}")
        model_rows = (positions[None, :] + self.images * np.arange(pairs)[:, None]).reshape(-1)
        mix = np.ascontiguousarray(self.mix[np.ix_(positions, model_rows)])
        start = time.perf_counter()
        out = self._prefill_rows(model_rows, rows, mix,
                                 np.asarray(uniforms, dtype=np.float32).reshape(positions.size, 1))
        self.forward_seconds += time.perf_counter() - start
        self.forwards += 1
        self.image_forwards += int(positions.size)
        self.lengths[positions] = self.spec.cond_len
        self.staged[positions] = 0
        if rows.caption_mask is not None:
            if self._caption_mask is None:
                self._caption_mask = np.ones((self.batch, self.spec.cond_len), dtype=bool)
            self._caption_mask[model_rows] = rows.caption_mask
        return out

    @property
    def admits(self) -> bool:
        """True when `admit` works on this runner (its backend prefills a subset of the batch's rows)."""
        return type(self)._prefill_rows is not ModelRunner._prefill_rows

    def _prefill_rows(self, model_rows: np.ndarray, rows: Conditions, mix: np.ndarray,
                      uniforms: np.ndarray) -> StepOutput:
        """The prefill of `rows` alone (k images' rows with their CFG twins, guidance `mix`
        [k, len(rows)]), their KV rows written at [0, cond_len) of model batch rows `model_rows`
        (row j of `rows` into model row model_rows[j]); the head's output [k, 1, V]. Backends that
        can admit images into a running batch implement it."""
        raise NotImplementedError(f"{type(self).__name__} cannot prefill one image of a running batch")

    def step(self, windows: Windows, uniforms: np.ndarray) -> StepOutput:
        """Run each image's window after its committed cache; the head's rows [I,W,V] (slot w's
        row predicts the token after it) and a draw per row with `uniforms` [I,W], W the longest
        window. Rows past an image's own window are padding: never read, never committed.

        `windows`: one Window for every image, an int array [images, W] (each image's chain of W
        tokens), or one Window per image (None: nothing to run for it).
        """
        start = time.perf_counter()
        ids, positions, mask, uniform_buffer, top = self._window_inputs(windows)
        uniform_buffer[...] = uniforms
        ready = time.perf_counter()
        out = self._step(ids, positions, mask, uniform_buffer)
        self._count_call(start, ready, top)
        return out

    def chain(self, windows: Windows, steps: int, uniforms: np.ndarray) -> StepOutput:
        """Run each image's window, then draw `steps` drafts one after another, each fed to the
        model before the next is drawn (runtime/chain.py), in one call: the head's rows [I, steps, V]
        (row j: the distribution draft j + 1 was drawn from) and the drafts [I, steps], drawn with
        `uniforms` [I, steps]. What `step` on the window followed by steps − 1 one-token steps
        would compute, for one model call. The present rows kept for `commit` are the window's
        slots 0..W − 1, then drafts 1..steps − 1 at slots W, W + 1, ... (the last draft is never fed).
        Only where `can_chain(steps)`; the head's rows must be the sampling distribution (no host
        restriction: sampling.needs_restriction)."""
        if not self.can_chain(steps):
            raise SpecrtError(f"{type(self).__name__} cannot draw a chain of {steps} drafts in one call")
        start = time.perf_counter()
        ids, positions, mask, _, top = self._window_inputs(windows, fed=steps - 1)
        last = self._last_slots(top)
        uniform_view = self._step_views(steps)[3]  # [I, steps]: the same memory as a window of `steps`
        uniform_view[...] = uniforms
        ready = time.perf_counter()
        out = self._chain(ids, positions, mask, last, uniform_view)
        self._count_call(start, ready, top, passes=steps)
        return out

    def draft_tree(self, windows: Windows, layout: Any, uniforms: np.ndarray) -> StepOutput:
        """Run each image's window, then draft the static tree `layout` (runtime/tree_call.py
        TreeLayout) below its last slot in one call (runtime/chain.py DraftTree): the rows of the
        layout's inner nodes [I, inner, V] and every node's token [I, nodes − 1] (which of them
        their row had the mass for is the caller's to check: tree_call.tree_from_draws), drawn
        with `uniforms` [I, nodes − 1]. The present rows kept for `commit` and `stage` are
        the window's slots, then the fed nodes' at slots W, W + 1, ... (W the widest window).
        Only where `can_draft_tree(layout)`; the head's rows must be the sampling distribution."""
        if not self.can_draft_tree(layout):
            raise SpecrtError(f"{type(self).__name__} cannot draft this tree in one call")
        if layout.nodes - 1 > self.max_window:
            raise SpecrtError(f"a tree of {layout.nodes - 1} drafts exceeds this model's max_window {self.max_window}")
        start = time.perf_counter()
        ids, positions, mask, _, top = self._window_inputs(windows, fed=len(layout.fed))
        uniform_view = self._step_views(layout.nodes - 1)[3]  # [I, nodes − 1]: fixed memory, as a chain's
        uniform_view[...] = uniforms
        ready = time.perf_counter()
        out = self._draft_tree(ids, positions, mask, self._last_slots(top), layout, uniform_view)
        self._count_call(start, ready, top, passes=1 + len(layout.levels))
        return out

    def grow_tree(self, windows: Windows, layout: Any) -> GrownTrees:
        """Run each image's window, then grow the dynamic tree `layout` (runtime/tree_call.py
        GrowthLayout) below its last slot in one call (runtime/chain.py DraftGrowth). The present
        rows kept for `commit` and `stage` are the window's slots, then the fed frontier nodes' at
        slots W, W + 1, ... (W the widest window). Only where `can_grow_tree(layout)`; the head's
        rows must be the sampling distribution (ranked as the level path ranks its rows)."""
        if not self.can_grow_tree(layout):
            raise SpecrtError(f"{type(self).__name__} cannot grow this dynamic tree in one call")
        start = time.perf_counter()
        ids, positions, mask, _, top = self._window_inputs(windows, fed=layout.fed)
        ready = time.perf_counter()
        out = self._grow_tree(ids, positions, mask, self._last_slots(top), layout)
        self._count_call(start, ready, top, passes=layout.depth)
        return out

    def can_grow_tree(self, layout: Any) -> bool:
        """True when `grow_tree` can grow this layout's tree in one call on this runner."""
        return False

    def _grow_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
                   layout: Any) -> GrownTrees:
        raise NotImplementedError(f"{type(self).__name__} grows no trees in one call")

    def _last_slots(self, top: int | np.ndarray) -> np.ndarray:
        """[I] int32: each image's last real window slot (0 for an image without a window)."""
        last = self._last[: self.images]
        if isinstance(top, int):  # every image's window of one width
            last[:] = max(top - 1, 0)
        else:
            np.maximum(top - 1, 0, out=last, casting="unsafe")
        return last

    def can_draft_tree(self, layout: Any) -> bool:
        """True when `draft_tree` can draft this layout's tree in one call on this runner."""
        return False

    def _draft_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray, layout: Any,
                    uniforms: np.ndarray) -> StepOutput:
        raise NotImplementedError(f"{type(self).__name__} drafts no trees in one call")

    def _window_inputs(self, windows: Windows, fed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                                       int | np.ndarray]:
        """Check each image's window (and `fed` rows after it: a chain's drafts) against max_window
        and the capacity, and write their ids, positions and mask into the step's input views;
        (ids, positions, mask, the uniforms view of the window's size, the window sizes: one int
        for chains of one width, else per image)."""
        if isinstance(windows, np.ndarray):  # chains of one width: the common step, kept cheap
            if windows.ndim != 2 or len(windows) != self.images:
                raise ValueError(f"chains of shape {windows.shape} for a batch of {self.images} images")
            size = top = windows.shape[1]
        elif self.images == 1 and (lone := lone_window(windows)) is not None:
            size = top = len(lone)  # one image's window (batch 1 trees): its size as an int
        else:
            top = window_sizes(windows, self.images)
            size = max(int(top.max()), 1)
        if size + fed > self.max_window:
            what = f"window of {size} tokens" + (f" and {fed} fed drafts" if fed else "")
            raise SpecrtError(f"{what} exceeds this model's max_window {self.max_window}")
        if len(self.lengths) == 1:  # one image: its two counts, no reductions
            highest = int(self.lengths[0]) + int(self.staged[0]) + (top if isinstance(top, int) else int(top[0])) + fed
        elif isinstance(top, int):
            highest = int(self.lengths.max()) + int(self.staged.max()) + top + fed
        else:
            highest = int((self.lengths + self.staged + top).max()) + fed
        if highest > self.capacity:
            raise ValueError(f"windows of up to {size + fed} tokens at lengths {self.lengths.tolist()} overflow "
                             f"capacity {self.capacity}")
        ids, positions, mask, uniform_buffer = self._step_views(size)
        if isinstance(windows, Window):
            windows = [windows] * self.images
        fill_step_inputs(windows, self.lengths, self.capacity, ids, positions, mask, self._caption_mask)
        return ids, positions, mask, uniform_buffer, top

    def _count_call(self, start: float, ready: float, sizes: int | np.ndarray, passes: int = 1) -> None:
        """One model call's counters: input time (cache), graph time, the call, and the model
        passes of the images that had a window (sizes as _window_inputs gives them)."""
        self.cache_seconds += ready - start
        self.forward_seconds += time.perf_counter() - ready
        self.forwards += 1
        self.image_forwards += passes * (self.images if isinstance(sizes, int) else int(np.count_nonzero(sizes)))

    def _step_views(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """ids, positions [B, W], mask [B, W, capacity + W] and uniforms [I, W] for a window of
        `size`: views of the flat buffers, made once per size for the current batch."""
        views = self._views.get(size)
        if views is None:
            batch, total = self.batch, self.capacity + size
            views = self._views[size] = (
                self._ids[: batch * size].reshape(batch, size), self._positions[: batch * size].reshape(batch, size),
                self._mask[: batch * size * total].reshape(batch, size, total),
                self._uniforms[: self.images * size].reshape(self.images, size))
        return views


    def hidden_rows(self, slots: Sequence[int]) -> np.ndarray:
        """The last prefill's or step's hidden states at window `slots`, [B, n, H] on the host, a
        fresh array (needs `keep_hidden`; an EAGLE head reads these, O(n·H) numbers per round, and
        keeps views of them)."""
        return self._hidden_rows(list(slots))

    def retain(self, images: Sequence[int]) -> None:
        """Keep only these images (positions in the current batch, in order), with their CFG
        twins: finished images leave the batch, and later steps cost nothing for them."""
        keep = np.asarray(images, dtype=np.int64)
        if len(keep) == self.images and np.array_equal(keep, np.arange(self.images)):
            return
        if np.any(np.diff(keep) <= 0) or (len(keep) and (keep[0] < 0 or keep[-1] >= self.images)):
            raise ValueError(f"retain takes batch positions in increasing order, got {keep.tolist()}")
        start = time.perf_counter()
        old_images, pairs = self.images, self.batch // self.images
        rows = np.concatenate([keep + old_images * k for k in range(pairs)])
        self._regroup(rows, self.mix[np.ix_(keep, rows)], self.lengths[keep], self.staged[keep], start)

    def grow(self, mix: np.ndarray) -> None:
        """One more image at the end of the batch, for in-flight batching to admit a request into
        (runtime/scheduling): a batch that grows and shrinks with its requests runs only the rows of
        images being decoded. `mix` is the grown batch's guidance matrix [images + 1, batch + pairs].
        Each image's CFG twins move up to their new rows (row i + images·k -> i + (images + 1)·k),
        within the buffers `allocate` made (allocate for the most images, then retain down); the new
        image holds nothing (length 0) until `admit` prefills it."""
        mix = np.ascontiguousarray(mix, dtype=np.float32)
        old_images = self.images
        pairs = self.batch // old_images
        images = old_images + 1
        if mix.shape != (images, images * pairs):
            raise ValueError(f"a batch of {old_images} images grows to {images}: mix {mix.shape} is not "
                             f"{(images, images * pairs)}")
        if images * pairs > self.batch_room:
            raise ValueError(f"{images} images need {images * pairs} model rows; the buffers hold {self.batch_room}")
        start = time.perf_counter()
        # the new image's rows take a copy of image 0's (any row would do: admit overwrites what is read)
        rows = np.concatenate([np.append(np.arange(old_images) + old_images * k, old_images * k) for k in range(pairs)])
        self._regroup(rows, mix, np.append(self.lengths, 0), np.append(self.staged, 0), start)

    def _regroup(self, rows: np.ndarray, mix: np.ndarray, lengths: np.ndarray, staged: np.ndarray,
                 start: float) -> None:
        """The batch becomes model rows `rows` of the old one (retain and grow), with the images'
        new guidance matrix, lengths and staged counts; the time since `start` counts as cache work."""
        self.mix = np.ascontiguousarray(mix)
        self.lengths, self.staged = lengths, staged
        if self._caption_mask is not None:
            self._caption_mask = self._caption_mask[rows]
        self._retain(rows)
        self.batch = len(rows)
        self._views = {}
        self.cache_seconds += time.perf_counter() - start

    def reset_counters(self) -> None:
        self.forwards, self.forward_seconds, self.cache_seconds, self.host_numbers, self.host_syncs = 0, 0.0, 0.0, 0, 0
        self.image_forwards = 0


def window_sizes(windows: Windows, images: int) -> np.ndarray:
    """Each image's window length (0: no window) for the forms runner.step takes."""
    if isinstance(windows, Window):
        return np.full(images, len(windows), dtype=np.int64)
    if isinstance(windows, np.ndarray):
        if windows.ndim != 2 or len(windows) != images:
            raise ValueError(f"chains of shape {windows.shape} for a batch of {images} images")
        return np.full(images, windows.shape[1], dtype=np.int64)
    if len(windows) != images:
        raise ValueError(f"{len(windows)} windows for a batch of {images} images")
    return np.array([len(w) if w is not None else 0 for w in windows], dtype=np.int64)
