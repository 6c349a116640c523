"""TensorRT runtime backend: a ModelRunner over engines built by `specrt build`.

Written against the documented TensorRT 10/11 Python API and cuda-python's runtime API;
NOT executed where it was written (no TensorRT, no GPU). tests/engines/test_tensorrt.py
runs it when both are present.

Why it looks like this (DESIGN.md's per-step budget):
- every device buffer is allocated once per generate call for the largest window: step
  inputs, outputs, and the KV buffer [L, 2, B, Hkv, capacity, D] that the step engine reads
  *in place* as `past_kv` (its tensor address is the KV buffer itself, no copy);
- a step copies ids/positions/mask and the sampling head's mix/uniforms to the device, calls
  set_input_shape for the actual window, execute_async_v3 on one stream, and copies back
  only the head's draws [I, W] (int32). The logits never leave the device; the head's probs
  [I, W, V] stay there too and are read through DeviceProbs, entry by entry or row by row,
  as the host asks for them;
- probs/draws alternate between two device buffers (both engines share the pair), so a
  StepOutput stays valid until the runner's second next call (runtime/runner.StepOutput);
- a draft's chain and static-tree engines (runtime/chain.py DraftChain, DraftTree), where the
  bundle has them and `specrt build` made them, draft a round in one execution on the same
  buffers; a dynamic tree (draft_growth, float64 scores) grows level by level here;
- `commit` moves the accepted slots' rows from `present_kv` into the KV buffer on the
  device: one strided 2D copy per run of consecutive slots when every image commits alike,
  one per (layer, k/v) and image run in a ragged batch, nothing through the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.manifest import Manifest, as_manifest
from specrt.runtime.backends.ort_backend import model_spec
from specrt.runtime.conditions import Conditions
from specrt.runtime.runner import ModelRunner, ModelSpec, StepOutput
from specrt.runtime.tree import StaticShape
from specrt.runtime.tree_call import TreeLayout
from specrt.runtime.vq_decoder import VQDecoder

from .build import refuse_layer_inputs, require_tensorrt


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError:
            raise SpecrtError("the TensorRT backend needs cuda-python: pip install 'specrt[trt]'") from None
    return cudart


def _check(result: tuple) -> Any:
    """cuda-python calls return (error, *values); raise on an error, return the value(s)."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return values[0] if len(values) == 1 else tuple(values) or None


class DeviceBuffer:
    """One cudaMalloc'd block; `ptr` never changes while it lives (tensor addresses are set once)."""

    def __init__(self, nbytes: int):
        self.cudart = _cudart()
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(_check(self.cudart.cudaMalloc(self.nbytes)))

    def free(self) -> None:
        if self.ptr:
            _check(self.cudart.cudaFree(self.ptr))
            self.ptr = 0

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:
            pass


class TrtEngine:
    """A deserialized engine with one execution context and one stream.

    `allocate(max_shapes)` sizes a device buffer for every I/O tensor once; `bind(name, ptr)`
    points a tensor at memory owned elsewhere (the KV buffer); `run` executes with the
    shapes of the given host inputs.
    """

    def __init__(self, engine_path: str | Path, stream: Any = None):
        self.trt = require_tensorrt()
        self.cudart = _cudart()
        self.logger = self.trt.Logger(self.trt.Logger.WARNING)
        self.runtime = self.trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise SpecrtError(f"TensorRT could not load {engine_path} (built by another TensorRT version? rebuild it)")
        self.context = self.engine.create_execution_context()
        self.stream = stream if stream is not None else _check(self.cudart.cudaStreamCreate())
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == self.trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.buffers: dict[str, DeviceBuffer] = {}
        self.addresses: dict[str, int] = {}

    @property
    def stream_handle(self) -> int:
        return int(self.stream)

    def max_profile_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.engine.get_tensor_profile_shape(name, 0)[2])

    def allocate(self, max_shapes: dict[str, tuple[int, ...]], skip: Sequence[str] = ()) -> None:
        """Device buffers for every tensor at its largest shape (inputs from `max_shapes`,
        outputs as TensorRT infers them from those); `skip` names tensors bound elsewhere."""
        for name in self.inputs:
            if not self.context.set_input_shape(name, max_shapes[name]):
                raise SpecrtError(f"shape {max_shapes[name]} of {name} is outside the engine's profile "
                                  f"(max {self.max_profile_shape(name)}): rebuild with a larger profile")
        for buffer in self.buffers.values():
            buffer.free()
        self.buffers = {}
        for name in self.inputs + self.outputs:
            if name in skip:
                continue
            shape = max_shapes[name] if name in self.inputs else tuple(self.context.get_tensor_shape(name))
            self.buffers[name] = DeviceBuffer(int(np.prod(shape)) * self.dtypes[name].itemsize)
            self.bind(name, self.buffers[name].ptr)

    def bind(self, name: str, ptr: int) -> None:
        self.context.set_tensor_address(name, ptr)
        self.addresses[name] = ptr

    def run(self, host_inputs: dict[str, np.ndarray], device_shapes: dict[str, tuple[int, ...]] | None = None) -> None:
        """Copy host inputs in, set every input's shape, execute (asynchronously, on the stream)."""
        h2d = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name, array in host_inputs.items():
            array = np.ascontiguousarray(array, dtype=self.dtypes[name])
            _check(self.cudart.cudaMemcpyAsync(self.addresses[name], array.ctypes.data, array.nbytes, h2d, self.stream))
            self.context.set_input_shape(name, array.shape)
        for name, shape in (device_shapes or {}).items():
            self.context.set_input_shape(name, shape)
        if not self.context.execute_async_v3(self.stream_handle):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")

    def fetch(self, name: str, out: np.ndarray) -> np.ndarray:
        """Copy output `name` (its current shape) into the front of the host array `out`; synchronizes."""
        if out.dtype != self.dtypes[name]:
            raise SpecrtError(f"engine output {name} is {self.dtypes[name]}, the host buffer is {out.dtype}")
        shape = tuple(self.context.get_tensor_shape(name))
        view = out.reshape(-1)[: int(np.prod(shape))].reshape(shape)
        _check(self.cudart.cudaMemcpyAsync(view.ctypes.data, self.addresses[name], view.nbytes,
                                           self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream))
        _check(self.cudart.cudaStreamSynchronize(self.stream))
        return view


class DeviceProbs:
    """The head's probabilities [..., V] in device memory, read only as far as the host indexes.

    `read(offset, count)` copies `count` float32 values starting `offset` elements into the
    buffer to a new host array (TrtRunner: one synchronous cudaMemcpy). Integer indices
    narrow the view without any copy; a single entry is one 4-byte read; a gather of a
    row (`row[tokens]`) or any other index reads the view once and indexes on the host;
    numpy functions see the whole view through __array__. `copy()` is a host copy, so a
    kept row outlives the device buffer's next reuse.
    """

    def __init__(self, read: Any, shape: tuple[int, ...], offset: int = 0):
        self.read, self.shape, self.offset = read, tuple(int(d) for d in shape), int(offset)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> Any:
        parts = index if isinstance(index, tuple) else (index,)
        offset, shape, used = self.offset, self.shape, 0
        for part in parts:
            if not shape or isinstance(part, (bool, np.bool_)) or not isinstance(part, (int, np.integer)):
                break
            position = int(part) + shape[0] if part < 0 else int(part)
            if not 0 <= position < shape[0]:
                raise IndexError(f"index {int(part)} is out of bounds for an axis of size {shape[0]}")
            offset += position * int(np.prod(shape[1:], dtype=np.int64))
            shape, used = shape[1:], used + 1
        rest = parts[used:]
        if not rest:
            return float(self.read(offset, 1)[0]) if not shape else DeviceProbs(self.read, shape, offset)
        return DeviceProbs(self.read, shape, offset).__array__()[rest]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.read(self.offset, self.size).reshape(self.shape)
        return host if dtype is None else host.astype(dtype)

    def copy(self) -> np.ndarray:
        return self.__array__()


@dataclass(frozen=True)
class KVLayout:
    """The manifest's KV geometry of one model role."""

    n_layer: int
    n_kv_head: int
    head_dim: int


class TrtRunner(ModelRunner):
    """ModelRunner over a prefill and a step engine (and a draft's chain and static-tree engines,
    runtime/chain.py) sharing one stream and one device KV buffer."""

    siblings = False  # its engines' execution contexts bind their device buffers

    meters_host_reads = True
    chain_engine: "TrtEngine | None" = None
    chain_steps = 0
    tree_engine: "TrtEngine | None" = None
    tree_layout: "TreeLayout | None" = None  # the static tree the tree engine drafts (its manifest entry's)
    _present_engine: "TrtEngine | None" = None  # whose present_kv the next commit copies (None: the step's)

    def __init__(self, spec: ModelSpec, kv: KVLayout, prefill_engine: str | Path, step_engine: str | Path,
                 max_window: int, chain_engine: str | Path | None = None, tree_engine: str | Path | None = None,
                 tree_layout: "TreeLayout | None" = None):
        super().__init__(spec, max_window)
        self.kv_layout = kv
        self.prefill_engine = TrtEngine(prefill_engine)
        self.step_engine = TrtEngine(step_engine, stream=self.prefill_engine.stream)
        if chain_engine is not None:
            self.chain_engine = TrtEngine(chain_engine, stream=self.prefill_engine.stream)
            self.chain_steps = int(self.chain_engine.engine.get_tensor_shape("uniforms")[1])  # static: L
        if tree_engine is not None and tree_layout is not None and tree_fits(tree_layout, max_window):
            self.tree_engine = TrtEngine(tree_engine, stream=self.prefill_engine.stream)
            self.tree_layout = tree_layout
        self.cudart = self.prefill_engine.cudart
        self._kv: DeviceBuffer | None = None
        self._probs: list[DeviceBuffer] = []  # two of each: outputs alternate between calls
        self._draws: list[DeviceBuffer] = []
        self._draws_host = [np.zeros(0, dtype=np.int32)] * 2
        self._parity = 0
        self._last_window = 0

    def _kv_shape(self, batch: int, rows: int) -> tuple[int, ...]:
        return (self.kv_layout.n_layer, 2, batch, self.kv_layout.n_kv_head, rows, self.kv_layout.head_dim)

    def _allocate_kv(self, batch: int, capacity: int) -> None:
        """KV buffer, every engine I/O at its largest shape, and the two probs/draws buffers.

        The base class has set self.mix [images, batch] before calling this.
        """
        step, w, images = self.step_engine, self.max_window, self.images
        head = ("probs", "draws")
        self._kv = DeviceBuffer(int(np.prod(self._kv_shape(batch, capacity))) * step.dtypes["past_kv"].itemsize)
        step.allocate({"input_ids": (batch, w), "positions": (batch, w), "attention_mask": (batch, w, capacity + w),
                       "past_kv": self._kv_shape(batch, capacity), "mix": (images, batch), "uniforms": (images, w)},
                      skip=("past_kv", *head))
        step.bind("past_kv", self._kv.ptr)  # the engine reads the KV buffer in place
        if self.chain_engine is not None:
            window = w - self.chain_steps + 1  # the longest window a chain of L drafts may follow
            self.chain_engine.allocate({"input_ids": (batch, window), "positions": (batch, window),
                                        "attention_mask": (batch, window, capacity + window),
                                        "past_kv": self._kv_shape(batch, capacity), "last": (images,),
                                        "mix": (images, batch), "uniforms": (images, self.chain_steps)},
                                       skip=("past_kv", *head))
            self.chain_engine.bind("past_kv", self._kv.ptr)
        if self.tree_engine is not None:
            window = w - len(self.tree_layout.fed)  # the longest window the tree's fed nodes may follow
            self.tree_engine.allocate({"input_ids": (batch, window), "positions": (batch, window),
                                       "attention_mask": (batch, window, capacity + window),
                                       "past_kv": self._kv_shape(batch, capacity), "last": (images,),
                                       "mix": (images, batch), "uniforms": (images, self.tree_layout.nodes - 1)},
                                      skip=("past_kv", *head))
            self.tree_engine.bind("past_kv", self._kv.ptr)
        condition = ({"class_ids": (batch,)} if self.spec.model_type == "c2i" else
                     {"captions": (batch, self.spec.cond_len, self.spec.caption_dim),
                      "caption_mask": (batch, self.spec.cond_len), "uncond": (batch,)})
        self.prefill_engine.allocate({**condition, "mix": (images, batch), "uniforms": (images, 1)}, skip=head)
        rows = images * w
        self._probs = [DeviceBuffer(rows * self.spec.vocab_size * step.dtypes["probs"].itemsize) for _ in range(2)]
        self._draws = [DeviceBuffer(rows * step.dtypes["draws"].itemsize) for _ in range(2)]
        self._draws_host = [np.zeros(rows, dtype=step.dtypes["draws"]) for _ in range(2)]

    @property
    def kv_buffer(self) -> DeviceBuffer | None:
        return self._kv

    def _run_with_head(self, engine: TrtEngine, inputs: dict[str, np.ndarray], rows: int,
                       device_shapes: dict[str, tuple[int, ...]] | None = None) -> StepOutput:
        """Run `engine` with the head writing into the next of the two output buffers; fetch the
        draws. `rows`: the head's rows per image (a step's window, a chain's drafts, a tree's
        inner nodes), the probs' shape [images, rows, V] left on the device."""
        self._parity = parity = 1 - self._parity
        engine.bind("probs", self._probs[parity].ptr)
        engine.bind("draws", self._draws[parity].ptr)
        engine.run({**inputs, "mix": self.mix}, device_shapes)
        draws = engine.fetch("draws", self._draws_host[parity])  # synchronizes: probs are ready too
        self.host_numbers += draws.size
        probs_ptr, itemsize = self._probs[parity].ptr, engine.dtypes["probs"].itemsize
        return StepOutput(DeviceProbs(lambda offset, count: self._read(probs_ptr + offset * itemsize, count),
                                      (self.images, rows, self.spec.vocab_size)), draws)

    def _read(self, ptr: int, count: int) -> np.ndarray:
        self.host_numbers += count
        host = np.empty(count, dtype=np.float32)
        _check(self.cudart.cudaMemcpyAsync(host.ctypes.data, ptr, host.nbytes,
                                           self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.prefill_engine.stream))
        _check(self.cudart.cudaStreamSynchronize(self.prefill_engine.stream))
        return host

    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        engine = self.prefill_engine
        out = self._run_with_head(engine, {**rows.feeds(), "uniforms": uniforms}, 1)
        self._copy_block(engine.addresses["present_kv"], self.spec.cond_len, 0, 0, self.spec.cond_len)
        return out

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        self._present_engine, self._last_window = self.step_engine, ids.shape[1]
        return self._run_with_head(self.step_engine,
                                   {"input_ids": ids, "positions": positions, "attention_mask": mask, "uniforms": uniforms},
                                   ids.shape[1], device_shapes={"past_kv": self._kv_shape(self.batch, self.capacity)})

    def can_chain(self, steps: int) -> bool:
        return self.chain_engine is not None and steps == self.chain_steps

    def _chain(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
               uniforms: np.ndarray) -> StepOutput:
        """The chain engine on the KV buffer: L drafts in one execution, one read of their draws;
        its present rows (window + L − 1 slots) are what the next commit copies."""
        steps = uniforms.shape[1]
        self._present_engine, self._last_window = self.chain_engine, ids.shape[1] + steps - 1
        return self._run_with_head(self.chain_engine,
                                   {"input_ids": ids, "positions": positions, "attention_mask": mask, "last": last,
                                    "uniforms": uniforms},
                                   steps, device_shapes={"past_kv": self._kv_shape(self.batch, self.capacity)})

    def can_draft_tree(self, layout: Any) -> bool:
        return self.tree_engine is not None and layout.key == self.tree_layout.key

    def _draft_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray, layout: Any,
                    uniforms: np.ndarray) -> StepOutput:
        """The static-tree engine on the KV buffer: the window, then every level of `layout` in one
        execution, one read of the nodes' draws; the inner nodes' rows stay on the device. Its
        present rows (window + fed nodes) are what the next commit and stage copy."""
        self._present_engine, self._last_window = self.tree_engine, ids.shape[1] + len(layout.fed)
        return self._run_with_head(self.tree_engine,
                                   {"input_ids": ids, "positions": positions, "attention_mask": mask, "last": last,
                                    "uniforms": uniforms},
                                   len(layout.inner), device_shapes={"past_kv": self._kv_shape(self.batch, self.capacity)})

    def _write_kv(self, rows: np.ndarray, columns: np.ndarray, slots: np.ndarray) -> None:
        present = (self._present_engine or self.step_engine).addresses["present_kv"]
        runs = _runs(rows, columns, slots)
        if len(runs) == self.batch and len({tuple(r) for r in runs.values()}) == 1:  # every row alike
            for column, slot, count in next(iter(runs.values())):
                self._copy_block(present, self._last_window, slot, column, count)
            return
        for row, row_runs in runs.items():
            for column, slot, count in row_runs:
                self._copy_row(present, self._last_window, row, slot, column, count)

    def _copy_block(self, present_ptr: int, window: int, slot: int, column: int, count: int) -> None:
        """kv[..., column:column+count, :] = present[..., slot:slot+count, :] in every batch row: one 2D copy.

        Both tensors are [L, 2, B, Hkv, rows, D] row-major, so a run of rows is one strided
        block per (layer, k/v, batch, head): rows of `count * D` elements, pitches of
        `rows * D` elements on either side.
        """
        row = self._row_bytes()
        blocks = self.kv_layout.n_layer * 2 * self.batch * self.kv_layout.n_kv_head
        _check(self.cudart.cudaMemcpy2DAsync(
            self._kv.ptr + column * row, self.capacity * row, present_ptr + slot * row, window * row,
            count * row, blocks, self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, self.prefill_engine.stream))

    def _copy_row(self, present_ptr: int, window: int, batch_row: int, slot: int, column: int, count: int) -> None:
        """The same for one batch row (ragged commits): one 2D copy over the heads per (layer, k/v)."""
        row, heads = self._row_bytes(), self.kv_layout.n_kv_head
        for block in range(self.kv_layout.n_layer * 2):
            first = (block * self.batch + batch_row) * heads  # (layer, k/v, b, head 0)
            _check(self.cudart.cudaMemcpy2DAsync(
                self._kv.ptr + (first * self.capacity + column) * row, self.capacity * row,
                present_ptr + (first * window + slot) * row, window * row,
                count * row, heads, self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, self.prefill_engine.stream))

    def _retain(self, rows: np.ndarray) -> None:
        """Move the kept rows' caches to the front of the KV buffer (whose address the step engine
        keeps) in place: per (layer, k/v) block and kept row, in ascending order, one 2D copy of
        the columns in use over the heads. Row (b, j) of the new batch lands at or below row
        (b, r) of the old one it comes from (j ≤ r, fewer rows per block), a whole row's span
        lower or not at all, so no copy overlaps its source and none overwrites a row still to be
        read: no scratch buffer (a cudaMalloc each time) and one copy of the data where gathering
        into a scratch and back made two. Columns past those in use are never read before they
        are written (ModelRunner._retain)."""
        row, heads = self._row_bytes(), self.kv_layout.n_kv_head
        used, pitch = self.columns_in_use(), self.capacity * row
        d2d = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for block in range(self.kv_layout.n_layer * 2):
            for new, old in enumerate(int(r) for r in rows):
                target, source = (block * len(rows) + new) * heads, (block * self.batch + old) * heads
                if target != source and used:
                    _check(self.cudart.cudaMemcpy2DAsync(self._kv.ptr + target * pitch, pitch, self._kv.ptr + source * pitch,
                                                         pitch, used * row, heads, d2d, self.prefill_engine.stream))
        _check(self.cudart.cudaStreamSynchronize(self.prefill_engine.stream))

    def _row_bytes(self) -> int:
        return self.kv_layout.head_dim * self.step_engine.dtypes["past_kv"].itemsize


def _runs(rows: np.ndarray, columns: np.ndarray, slots: np.ndarray) -> dict[int, list[tuple[int, int, int]]]:
    """Per batch row, its commits as runs (first column, first slot, count) of consecutive rows."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    for row, column, slot in zip(rows.tolist(), columns.tolist(), slots.tolist()):
        runs = out.setdefault(row, [])
        if runs and runs[-1][0] + runs[-1][2] == column and runs[-1][1] + runs[-1][2] == slot:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((column, slot, 1))
    return out


class TrtVQDecoder(VQDecoder):
    """codes -> images through the vq_decode engine, buffers sized once for `max_batch`."""

    def __init__(self, engine_path: str | Path, grid_size: int, max_batch: int, downsample: int = 16):
        self.downsample = downsample
        self.engine = TrtEngine(engine_path)
        self.grid_size, self.max_batch = grid_size, max_batch
        self.engine.allocate({"codes": (max_batch, grid_size, grid_size)})
        shape = tuple(self.engine.context.get_tensor_shape("image"))
        self._image = np.empty(int(np.prod(shape)), dtype=np.float32)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        images = []
        for begin in range(0, len(codes), self.max_batch):
            self.engine.run({"codes": np.asarray(codes[begin:begin + self.max_batch], dtype=np.int32)})
            images.append(self.engine.fetch("image", self._image).copy())
        return np.concatenate(images)


def find_engines(bundle: str | Path | Manifest, graphs: list[str], precision: str = "fp32",
                 max_window: int | None = None) -> dict[str, Path]:
    """Engines of `graphs` built by `specrt build` for this GPU + TensorRT, keys checked; SpecrtError if any is missing or stale."""
    from .build import plan_jobs
    from .cache import EngineCache, detect_device

    trt = require_tensorrt()
    manifest = as_manifest(bundle)
    device = detect_device()
    cache = EngineCache(manifest.root, device, trt.__version__)
    found = {}
    for job in plan_jobs(manifest, precision, trt.__version__, device, max_window, graphs):
        path = cache.lookup(job.key)
        if path is None:
            raise SpecrtError(f"no up-to-date {precision} engine for {job.entry.name} on {device.name} with TensorRT "
                              f"{trt.__version__}: run `specrt build {manifest.root} --precision {precision}`")
        found[job.entry.name] = path
    return found


def runner_from_bundle(bundle: str | Path | Manifest, role: str, precision: str = "fp32",
                       max_window: int | None = None) -> TrtRunner:
    """A TrtRunner for `role` ('target' or 'draft') from a bundle whose engines are built (its
    checked manifest, or its directory)."""
    manifest = as_manifest(bundle)
    refuse_layer_inputs(f"{role}_step", list(manifest.graph(f"{role}_step").input_names))
    model = manifest.models[role]
    window = max_window or int(manifest.limits.get("max_window", 64))
    engines = find_engines(manifest, [f"{role}_prefill", f"{role}_step"], precision, max_window)
    chain = None
    if f"{role}_chain" in manifest.graphs:  # a draft chain, where its engine was built (else: step by step)
        chain = _built_engine(manifest, f"{role}_chain", precision, max_window)
    tree, layout = None, None
    if f"{role}_tree" in manifest.graphs:  # a static tree in one call, where its engine was built (else: level by level)
        layout = TreeLayout(StaticShape(manifest.graphs[f"{role}_tree"].tree))
        tree = _built_engine(manifest, f"{role}_tree", precision, max_window)  # used where it fits (TrtRunner)
    spec = model_spec(model)
    kv = KVLayout(model["n_layer"], model["n_kv_head"], model["head_dim"])
    return TrtRunner(spec, kv, engines[f"{role}_prefill"], engines[f"{role}_step"], window, chain, tree, layout)


def tree_fits(layout: TreeLayout, max_window: int) -> bool:
    """True when a window of at least one token and the tree's fed nodes fit `max_window`, and so
    do its drafted nodes (ModelRunner.draft_tree's check): else the tree is drafted level by level."""
    return len(layout.fed) < max_window and layout.nodes - 1 <= max_window


def _built_engine(bundle: Manifest, graph: str, precision: str, max_window: int | None) -> Path | None:
    """The engine of an optional graph where `specrt build` made one, else None (the runner then
    does that graph's work step by step)."""
    try:
        return find_engines(bundle, [graph], precision, max_window)[graph]
    except SpecrtError:
        return None


def pipeline_parts_from_bundle(bundle: str | Path | Manifest, precision: str = "fp32") -> dict[str, Any]:
    """Keyword arguments of runtime Pipeline(...) over the bundle's TensorRT engines (`--backend trt`;
    `bundle`: its checked manifest, or its directory).

    The graphs' companions (neighbour table, sampling defaults, limits) come from the same
    bundle as on onnxruntime, so only the runners and the VQ decoder differ between backends.
    """
    from specrt.runtime.backends.ort_backend import bundle_companions, is_eagle

    require_tensorrt()  # fail at once, with the install hint, before touching any engine
    manifest = as_manifest(bundle)
    companions = bundle_companions(manifest)  # first: it cross-checks the manifest
    vq = manifest.models["vq"]
    max_batch = int(manifest.limits.get("max_batch", 8))
    vq_engine = find_engines(manifest, ["vq_decode"], precision)["vq_decode"]
    if is_eagle(manifest):  # its step binds a feature input and output the TrtRunner does not have yet
        raise SpecrtError("the TensorRT backend does not run EAGLE draft heads yet: use --backend ort or ort-cuda "
                          "for this bundle (its engines build; only the runner lacks the head's feature I/O)")
    draft = runner_from_bundle(manifest, "draft", precision) if "draft_step" in manifest.graphs else None
    return {"target": runner_from_bundle(manifest, "target", precision), "draft": draft,
            "vq": TrtVQDecoder(vq_engine, int(vq["grid_size"]), max_batch, int(vq["downsample"])),
            **companions}
