"""The onnxruntime backend: a bundle's graphs run through IOBinding on buffers allocated once.

Graph files, I/O names, dtypes and the KV capacity come only from manifest.json (read by
specrt.manifest); the names looked up are the contract's (docs/contracts.md) and a bundle
without them is refused with one line. Per generate call the runner allocates the KV buffer
and flat host buffers for ids, positions, mask, uniforms, present rows and the sampling
head's probs/draws, sized for the largest window; each step binds OrtValues that view those
buffers (no copies, no new buffers). Only present_kv and the head's outputs are bound: the
logits never leave the graph. probs/draws alternate between two buffers (runner.StepOutput).
`providers` is a provider list, or a function graph name -> provider list, so the CUDA and
TensorRT execution-provider options of specrt.engines plug in unchanged.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.manifest import GraphSpec, Manifest, as_manifest
from specrt.runtime.bundle_check import check_manifest, check_session, load_neighbours
from specrt.runtime.token_embeddings import load_token_embeddings
from specrt.runtime.conditions import Conditions
from specrt.runtime.eagle import EAGLE_KIND, HeadRunner
from specrt.runtime.kv_inputs import STACKED, layer_names, past_dtype, past_feeds, past_names
from specrt.runtime.kv_rows import regroup_kv, uniform_run
from specrt.runtime.runner import GrownTrees, ModelRunner, ModelSpec, StepOutput
from specrt.runtime.vq_decoder import VQDecoder
from specrt.runtime.tree import StaticShape
from specrt.runtime.tree_call import GrowthLayout, TreeLayout

Providers = Union[None, Sequence[Any], Callable[[str], Sequence[Any]]]
HEAD_INPUTS = ("mix", "uniforms")
HEAD_OUTPUTS = ("probs", "draws")
STEP_INPUTS = ("input_ids", "positions", "attention_mask", *HEAD_INPUTS)  # and the cache: past_kv, or per layer
STEP_OUTPUTS = ("present_kv", *HEAD_OUTPUTS)
CONDITION_INPUTS = {"c2i": ("class_ids",), "t2i": ("captions", "caption_mask", "uncond"),
                    "prompt": ("input_ids", "prompt_mask")}


def _ort():
    return require("onnxruntime", "the onnxruntime backend")


def session_options(threads: Optional[int] = None) -> Any:
    """Session options: `threads` intra-op threads (None: onnxruntime's default) and no spinning.

    Idle onnxruntime workers spin by default; on a small or shared CPU they steal the cores
    the decode loop needs between its many short graph calls (3x slower decoding measured
    on 2 shared cores), so they sleep instead.
    """
    options = _ort().SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = validation.threads("threads", threads)
        options.inter_op_num_threads = 1
    return options


def _session(manifest: Manifest, graph: str, providers: Providers, threads: Optional[int] = None) -> Any:
    ort = _ort()
    chosen = providers(graph) if callable(providers) else providers
    path = manifest.graph_path(graph)
    options = session_options(threads)  # a bad thread count is the caller's mistake, not the graph's
    try:
        session = ort.InferenceSession(str(path), sess_options=options,
                                       providers=list(chosen or ["CPUExecutionProvider"]))
    except Exception as exc:  # onnxruntime raises its own exception types
        raise SpecrtError(f"onnxruntime could not load {path.name}: {(str(exc).splitlines() or [''])[0]}") from exc
    check_session(manifest.graph(graph), session)  # the manifest's I/O against the graph's own
    return session


def _check_io(spec: GraphSpec, inputs: Sequence[str], outputs: Sequence[str]) -> None:
    missing = [n for n in inputs if n not in spec.input_names] + [n for n in outputs if n not in spec.output_names]
    if missing:
        raise SpecrtError(f"graph {spec.name} lacks {', '.join(missing)} (docs/contracts.md); re-export the bundle")


def model_spec(entry: dict[str, Any]) -> ModelSpec:
    """The runtime's view of a manifest 'models.<role>' entry (any backend's)."""
    model_type = entry.get("model_type", "c2i")
    if model_type not in CONDITION_INPUTS:
        raise SpecrtError(f"this specrt runs c2i, t2i and prompt models; the bundle's is {model_type!r}")
    return ModelSpec(vocab_size=int(entry["vocab_size"]), grid_size=int(entry["grid_size"]),
                     num_classes=int(entry.get("num_classes", 0)), cond_len=int(entry.get("cond_len", 1)),
                     model_type=model_type, caption_dim=int(entry.get("caption_dim", 0)),
                     stream_len=int(entry.get("stream_len", 0)))


class OrtRunner(ModelRunner):
    """A ModelRunner over `<role>_prefill` and `<role>_step` of a bundle."""

    has_prefill = True

    def __init__(self, manifest: Manifest, role: str, providers: Providers = None, threads: Optional[int] = None):
        entry = manifest.models[role]
        super().__init__(model_spec(entry), int(manifest.limits["max_window"]))
        self.ort = _ort()
        self.role = role
        self.step_spec = manifest.graph(f"{role}_step")
        _check_io(self.step_spec, STEP_INPUTS, STEP_OUTPUTS)
        _check_past(self.step_spec, int(entry["n_layer"]))
        if self.has_prefill:
            self.prefill_spec = manifest.graph(f"{role}_prefill")
            _check_io(self.prefill_spec, (*CONDITION_INPUTS[self.spec.model_type], *HEAD_INPUTS), STEP_OUTPUTS)
            self.prefill_session = _session(manifest, self.prefill_spec.name, providers, threads)
        self.bundle_capacity = int(entry["capacity"])
        self.kv_dtype = np.dtype(past_dtype(self.step_spec))
        self._input_dtypes = {n: np.dtype(self.step_spec.input(n).dtype) for n in STEP_INPUTS}
        self.step_session = _session(manifest, self.step_spec.name, providers, threads)
        # a draft chain graph (runtime/chain.py: `steps` drafts in one call), where the bundle has one
        chain = manifest.graphs.get(f"{role}_chain")
        if chain is not None:
            _check_io(chain, (*STEP_INPUTS, STACKED, "last"), STEP_OUTPUTS)
        self.chain_steps = int(chain.input("uniforms").shape[1]) if chain is not None else 0
        self.chain_session = _session(manifest, chain.name, providers, threads) if chain is not None else None
        # a static tree drafted in one call (runtime/chain.py DraftTree), where the bundle has one
        tree = manifest.graphs.get(f"{role}_tree")
        if tree is not None:
            _check_io(tree, (*STEP_INPUTS, STACKED, "last"), STEP_OUTPUTS)
        self.tree_layout = TreeLayout(StaticShape(tree.tree)) if tree is not None else None
        self.tree_session = _session(manifest, tree.name, providers, threads) if tree is not None else None
        # a dynamic tree grown in one call (runtime/chain.py DraftGrowth), where the bundle has one
        growth = manifest.graphs.get(f"{role}_growth")
        if growth is not None:
            _check_io(growth, (*(n for n in STEP_INPUTS if n != "uniforms"), STACKED, "last"),  # it draws nothing
                      ("present_kv", "tokens", "scores", "fronts"))
        self.growth_layout = GrowthLayout(growth.growth["depth"], growth.growth["top_k"]) if growth is not None else None
        self.growth_session = _session(manifest, growth.name, providers, threads) if growth is not None else None
        # session -> its graph: how it reads the cache (past_kv, or per layer: runtime.kv_inputs)
        self._past = {session: graph for session, graph in ((self.step_session, self.step_spec),
                      (self.chain_session, chain), (self.tree_session, tree), (self.growth_session, growth))
                      if session is not None}
        self.layers, self.kv_heads, self.head_dim = (int(entry[k]) for k in ("n_layer", "n_kv_head", "head_dim"))
        self.dim = int(entry.get("dim", 0))
        self._hidden = np.zeros((0, 0, 0), dtype=np.float32)

    def default_capacity(self) -> int:
        return self.bundle_capacity

    def allocate(self, mix: np.ndarray, capacity: int | None = None) -> None:
        if capacity not in (None, self.bundle_capacity):
            raise SpecrtError(f"this bundle's graphs were built for a KV capacity of {self.bundle_capacity}, not {capacity}")
        super().allocate(mix, self.bundle_capacity)

    def _allocate_kv(self, batch: int, capacity: int) -> None:
        rows = (self.layers, 2, batch, self.kv_heads)
        self._kv_flat = np.zeros(int(np.prod(rows)) * capacity * self.head_dim, dtype=self.kv_dtype)
        self._kv = self._kv_flat.reshape(*rows, capacity, self.head_dim)
        self._kv_values = self._past_values()
        images, window, vocab = self.images, self.max_window, self.spec.vocab_size
        self._probs = [np.zeros(images * window * vocab, dtype=np.float32) for _ in range(2)]
        self._draws = [np.zeros(images * window, dtype=np.int32) for _ in range(2)]
        self._present_flat = np.zeros(int(np.prod(rows)) * window * self.head_dim, dtype=self.kv_dtype)
        self._present = self._present_flat[:0]
        self._bindings: dict[tuple, Any] = {}  # (graph, window size, output buffer) -> IOBinding
        self._call_views: dict[tuple, tuple[np.ndarray, ...]] = {}  # the same key -> its output views
        self._parity = 0
        # the ids/positions buffers must carry the graph's integer dtype (int32 by contract)
        self._ids = self._ids.astype(self._input_dtypes["input_ids"])
        self._positions = self._positions.astype(self._input_dtypes["positions"])
        if self.keep_hidden:
            if "hidden" not in self.step_spec.output_names:
                raise SpecrtError(f"graph {self.step_spec.name} has no hidden output, which an EAGLE draft reads: "
                                  "re-export the bundle without --no-hidden")
            self._hidden_flat = np.zeros(batch * window * self.dim, dtype=np.float32)

    @property
    def kv_buffer(self) -> np.ndarray:
        return self._kv_flat

    def _retain(self, rows: np.ndarray) -> None:
        """The kept rows move to the front of the same buffer (regroup_kv); the bindings are
        remade for the new batch."""
        self._kv = regroup_kv(self._kv_flat, self._kv, rows, self.columns_in_use())
        self._kv_values = self._past_values()
        self._bindings.clear()
        self._call_views.clear()

    def _past_values(self) -> dict[str, Any]:
        """OrtValues over the KV buffer for every cache input the runner's graphs read: the stacked
        `past_kv`, or each layer's keys and values (views of the same buffer: kv_inputs.past_feeds)."""
        value = self.ort.OrtValue.ortvalue_from_numpy
        arrays: dict[str, np.ndarray] = {}
        for spec in self._past.values():
            arrays.update(past_feeds(spec, self._kv))
        return {name: value(array) for name, array in arrays.items()}

    def _bound_views(self, key: tuple, batch: int, width: int, rows: int,
                     draws: Optional[int] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The present rows [L, 2, B, Hkv, width, D] and one of the two probs [I, rows, V] / draws
        [I, draws (default: rows)] buffers (key's last entry: which) a call binds: views made once
        per key and batch, as the bindings are (a decode loop alternates a few keys)."""
        views = self._call_views.get(key)
        if views is None:
            shape = (self.layers, 2, batch, self.kv_heads, width, self.head_dim)
            count, vocab, drawn = self.images * rows, self.spec.vocab_size, rows if draws is None else draws
            views = self._call_views[key] = (
                self._present_flat[: math.prod(shape)].reshape(shape),
                self._probs[key[-1]][: count * vocab].reshape(self.images, rows, vocab),
                self._draws[key[-1]][: self.images * drawn].reshape(self.images, drawn))
        return views

    def prefill_feeds(self, rows: Conditions, uniforms: np.ndarray, mix: Optional[np.ndarray] = None
                      ) -> dict[str, np.ndarray]:
        """The prefill graph's inputs by name, each in the dtype the manifest gives it (`mix`: the
        guidance of these rows, the batch's by default)."""
        feeds = {name: value.astype(np.dtype(self.prefill_spec.input(name).dtype), copy=False)
                 for name, value in rows.feeds().items()}
        feeds.update(mix=self.mix if mix is None else mix, uniforms=uniforms)
        return feeds

    def _prefill_rows(self, model_rows: np.ndarray, rows: Conditions, mix: np.ndarray,
                      uniforms: np.ndarray) -> StepOutput:
        """The prefill graph over the admitted images' rows (its batch dimension is dynamic), its
        present rows copied into those rows of the cache."""
        present, probs, draws = self.prefill_session.run(list(STEP_OUTPUTS), self.prefill_feeds(rows, uniforms, mix))
        self._kv[:, :, model_rows, :, : present.shape[4]] = present
        return StepOutput(probs, draws)

    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        names = [*STEP_OUTPUTS, "hidden"] if self.keep_hidden else list(STEP_OUTPUTS)
        present, probs, draws, *hidden = self.prefill_session.run(names, self.prefill_feeds(rows, uniforms))
        self._kv[:, :, :, :, : present.shape[4]] = present
        if hidden:
            self._hidden = hidden[0]
        return StepOutput(probs, draws)

    def _extra_io(self, batch: int, size: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Inputs and outputs bound beside the contract's: the target's hidden rows for an EAGLE head."""
        if not self.keep_hidden:
            return {}, {}
        self._hidden = self._hidden_flat[: batch * size * self.dim].reshape(batch, size, self.dim)
        return {}, {"hidden": self._hidden}

    def _hidden_rows(self, slots: Sequence[int]) -> np.ndarray:
        return self._hidden[:, list(slots)]

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        batch, size = ids.shape
        parity = self._parity = 1 - self._parity
        self._present, probs, draws = self._bound_views((size, parity), batch, size, size)
        extra_inputs, extra_outputs = self._extra_io(batch, size)
        self._run_bound(self.step_session, (size, parity), {
            "input_ids": ids, "positions": positions, "attention_mask": mask, "mix": self.mix, "uniforms": uniforms,
            **extra_inputs}, {"present_kv": self._present, "probs": probs, "draws": draws, **extra_outputs})
        return StepOutput(probs, draws)

    def can_chain(self, steps: int) -> bool:
        return self.chain_session is not None and steps == self.chain_steps

    def _chain(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
               uniforms: np.ndarray, extra_inputs: Optional[dict[str, np.ndarray]] = None) -> StepOutput:
        """The chain graph on the runner's buffers (`extra_inputs`: an EAGLE head's `hidden`)."""
        batch, size = ids.shape
        steps = uniforms.shape[1]
        parity = self._parity = 1 - self._parity
        key = ("chain", size, parity)
        self._present, probs, draws = self._bound_views(key, batch, size + steps - 1, steps)
        self._run_bound(self.chain_session, key, {
            "input_ids": ids, "positions": positions, "attention_mask": mask, "last": last, "mix": self.mix,
            "uniforms": uniforms, **(extra_inputs or {})}, {"present_kv": self._present, "probs": probs, "draws": draws})
        return StepOutput(probs, draws)

    def can_draft_tree(self, layout: Any) -> bool:
        return self.tree_session is not None and layout.key == self.tree_layout.key

    def _draft_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray, layout: Any,
                    uniforms: np.ndarray, extra_inputs: Optional[dict[str, np.ndarray]] = None) -> StepOutput:
        """The draft_tree graph (runtime/chain.py DraftTree, or an EAGLE head's HeadTree with its
        `hidden` among `extra_inputs`) on the runner's buffers."""
        batch, size = ids.shape
        parity = self._parity = 1 - self._parity
        key = ("tree", size, parity)
        self._present, probs, draws = self._bound_views(key, batch, size + len(layout.fed), len(layout.inner),
                                                        layout.nodes - 1)
        self._run_bound(self.tree_session, key, {
            "input_ids": ids, "positions": positions, "attention_mask": mask, "last": last, "mix": self.mix,
            "uniforms": uniforms, **(extra_inputs or {})}, {"present_kv": self._present, "probs": probs, "draws": draws})
        return StepOutput(probs, draws)

    def can_grow_tree(self, layout: Any) -> bool:
        return self.growth_session is not None and layout.key == self.growth_layout.key

    def _grow_tree(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, last: np.ndarray,
                   layout: Any, extra_inputs: Optional[dict[str, np.ndarray]] = None) -> GrownTrees:
        """The draft_growth graph (runtime/chain.py DraftGrowth) on the runner's buffers; its
        candidates land in arrays made once per window size (and batch, as the views are)."""
        batch, size = ids.shape
        key = ("growth", size, 0)
        self._present = self._bound_views(key, batch, size + layout.fed, 0)[0]
        grown = self._call_views.get(("grown", size))
        if grown is None:
            grown = self._call_views[("grown", size)] = (np.zeros((self.images, layout.candidates), dtype=np.int32),
                                                         np.zeros((self.images, layout.candidates)),
                                                         np.zeros((self.images, layout.fed), dtype=np.int64))
        tokens, scores, fronts = grown
        self._run_bound(self.growth_session, key, {
            "input_ids": ids, "positions": positions, "attention_mask": mask, "last": last, "mix": self.mix,
            **(extra_inputs or {})}, {"present_kv": self._present, "tokens": tokens, "scores": scores, "fronts": fronts})
        return GrownTrees(tokens, scores, fronts)

    def _run_bound(self, session: Any, key: tuple, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        """Run `session` on these buffers (and the KV buffer as its cache inputs) through an IOBinding made
        on first use per key (graph, window size, output buffer): its OrtValues wrap views of the
        preallocated buffers, which for a given key always cover the same memory, so a decode loop
        that alternates sizes never rebinds."""
        binding = self._bindings.get(key)
        if binding is None:
            value = self.ort.OrtValue.ortvalue_from_numpy
            binding = self._bindings[key] = session.io_binding()
            for name, array in inputs.items():
                binding.bind_ortvalue_input(name, value(array))
            for name in past_names(self._past[session]):
                binding.bind_ortvalue_input(name, self._kv_values[name])
            for name, array in outputs.items():
                binding.bind_ortvalue_output(name, value(array))
        session.run_with_iobinding(binding)

    def _write_kv(self, rows: np.ndarray, columns: np.ndarray, slots: np.ndarray) -> None:
        self._kv[:, :, rows, :, columns] = self._present[:, :, rows, :, slots]

    stages_trees = True

    def _move_kv(self, rows: np.ndarray, columns: np.ndarray, sources: np.ndarray) -> None:
        self._kv[:, :, rows, :, columns] = self._kv[:, :, rows, :, sources]  # the gather copies first

    def _write_block(self, column: int, start: int, count: int) -> None:
        self._kv[:, :, :, :, column:column + count] = self._present[:, :, :, :, start:start + count]

    def _move_block(self, column: int, source: int, count: int) -> None:
        self._kv[:, :, :, :, column:column + count] = self._kv[:, :, :, :, source:source + count]  # numpy buffers overlaps

    def _write_runs(self, columns: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> None:
        block = uniform_run(columns, starts, counts)
        if block is not None:  # one strided copy for the whole batch
            self._write_block(*block)
            return
        images = self.images
        for i in np.flatnonzero(counts).tolist():  # one strided copy per image, its CFG twins included
            column, start, count = int(columns[i]), int(starts[i]), int(counts[i])
            self._kv[:, :, i::images, :, column:column + count] = self._present[:, :, i::images, :, start:start + count]


def _check_past(spec: GraphSpec, layers: int) -> None:
    """A step graph reads the cache as past_kv, or through every layer's keys and values."""
    names = past_names(spec)
    if names != (STACKED,) and set(names) != set(layer_names(layers)):
        raise SpecrtError(f"graph {spec.name} lacks past_kv (or past_key_<i> / past_value_<i> for each of its "
                          f"{layers} layers) (docs/contracts.md); re-export the bundle")


class OrtHeadRunner(HeadRunner, OrtRunner):
    """An EAGLE head's `draft_step` (models.draft.kind `eagle`): no prefill graph; each step binds
    the features before its tokens (`hidden`) and the head's own (`features`) beside the contract's.
    Its `draft_chain`, `draft_tree` and `draft_growth` (runtime/chain.py HeadChain, HeadTree,
    HeadGrowth), where the bundle has them, bind `hidden` too."""

    has_prefill = False

    def __init__(self, manifest: Manifest, role: str = "draft", providers: Providers = None,
                 threads: Optional[int] = None):
        OrtRunner.__init__(self, manifest, role, providers, threads)
        _check_io(self.step_spec, ("hidden",), ("features",))
        for kind in ("chain", "tree", "growth"):  # its drafting graphs take the features too
            if f"{role}_{kind}" in manifest.graphs:
                _check_io(manifest.graph(f"{role}_{kind}"), ("hidden",), ())

    def _extra_io(self, batch: int, size: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return {"hidden": self._pending}, {"features": self.features_out}

    def _head_step(self, ids, features, positions, mask, uniforms) -> StepOutput:
        return OrtRunner._step(self, ids, positions, mask, uniforms)

    def _head_chain(self, ids, features, positions, mask, last, uniforms) -> StepOutput:
        return OrtRunner._chain(self, ids, positions, mask, last, uniforms, {"hidden": features})

    def _head_tree(self, ids, features, positions, mask, last, layout, uniforms) -> StepOutput:
        return OrtRunner._draft_tree(self, ids, positions, mask, last, layout, uniforms, {"hidden": features})

    def _head_grow(self, ids, features, positions, mask, last, layout) -> GrownTrees:
        return OrtRunner._grow_tree(self, ids, positions, mask, last, layout, {"hidden": features})


class OrtVQ(VQDecoder):
    """The bundle's vq_decode graph."""

    def __init__(self, manifest: Manifest, providers: Providers = None, threads: Optional[int] = None):
        self.spec = manifest.graph("vq_decode")
        _check_io(self.spec, ("codes",), ("image",))
        self.session = _session(manifest, "vq_decode", providers, threads)
        self.downsample = int(manifest.models["vq"]["downsample"])

    def decode(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes).astype(np.dtype(self.spec.input("codes").dtype))
        return self.session.run(["image"], {"codes": codes})[0]


def bundle_companions(manifest: Manifest) -> dict[str, Any]:
    """What a Pipeline takes from a bundle besides its runners: LANTERN's neighbour table, GSD's token
    embeddings (None in a bundle exported before them), the
    models' sampling defaults, the images-per-call limit and a t2i bundle's text encoder
    (onnxruntime on the CPU: it runs once per prompt; the same for every backend)."""
    from specrt.runtime.text import text_encoder_from_manifest

    limits = check_manifest(manifest)  # every number of the manifest checked before anything runs
    vocab = int(manifest.models["target"]["vocab_size"])
    neighbours = load_neighbours(manifest, vocab)
    embeddings = load_token_embeddings(manifest.raw.get("token_embeddings"), manifest.root, vocab)  # GSD's
    return {"neighbours": neighbours, "token_embeddings": embeddings, "sampling_defaults": dict(manifest.sampling_defaults),
            "max_images": limits["max_images"], "text_encoder": text_encoder_from_manifest(manifest)}


def pipeline_parts_from_bundle(bundle: str | Path | Manifest, providers: Providers = None,
                               threads: Optional[int] = None) -> dict[str, Any]:
    """Keyword arguments of Pipeline(...) for a bundle, its checked manifest or its directory
    (`threads`: see session_options)."""
    manifest = as_manifest(bundle)
    companions = bundle_companions(manifest)  # first: it cross-checks the manifest
    draft = None
    if "draft_step" in manifest.graphs:
        kind = OrtHeadRunner if is_eagle(manifest) else OrtRunner
        draft = kind(manifest, "draft", providers, threads)
    target = OrtRunner(manifest, "target", providers, threads)
    target.keep_hidden = isinstance(draft, HeadRunner)
    vq = OrtVQ(manifest, providers, threads) if "vq_decode" in manifest.graphs else None  # unified: may be tokens only
    return {"target": target, "draft": draft, "vq": vq, **companions}


def is_eagle(manifest: Manifest) -> bool:
    """The bundle's draft is an EAGLE head (models.draft.kind `eagle`)."""
    return manifest.models.get("draft", {}).get("kind") == EAGLE_KIND
