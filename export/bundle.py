"""Write a bundle: the five ONNX graphs, the LANTERN neighbour table, the target's token embeddings
(GSD's) and manifest.json (t2i bundles may add a text encoder graph and its tokenizer).

The bundle is assembled in a hidden temporary directory next to the destination and
renamed into place only when every file and the manifest are written, so an interrupted or
failed export never leaves a directory that looks complete (a directory is a bundle exactly
when it has a manifest.json whose hashes match).
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch.nn as nn

from specrt import __version__
from specrt.bundle_dir import move_into_place, partial_dir, refuse_existing
from specrt import validation
from specrt.errors import SpecrtError
from specrt.export import onnx_export
from specrt.export.onnx_export import GraphLimits, capacity_for, is_prompt_model
from specrt.manifest import (DEFAULT_MAX_IMAGES, FORMAT, MANIFEST_NAME, VERSION, GraphSpec, Manifest, file_record,
                             read_manifest, rows_for_images)
from specrt.models.neighbours import codebook_neighbours, codebook_of, neighbour_count
from specrt.runtime import compatibility, kv_inputs
from specrt.runtime.defaults import as_dict, defaults_of
from specrt.runtime.eagle import EAGLE_KIND
from specrt.runtime.methods import DEFAULT_MAX_WINDOW, checked_max_window
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.token_embeddings import EMBEDDINGS_FILE, embedding_table_of
from specrt.runtime.tree import DEFAULT_GROWTH, DEFAULT_STATIC_TREE, static_shape

NEIGHBOURS_FILE = "neighbours.npy"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExportOptions:
    """Everything about a bundle that is not the weights. Each field is one CLI flag."""

    opset: int = onnx_export.DEFAULT_OPSET
    max_window: int = DEFAULT_MAX_WINDOW  # SJD-PAC at its defaults: L = 64 drafts + the pending token
    max_batch: int = DEFAULT_MAX_IMAGES  # images per pass; the graphs' batch (model rows) is twice that, for CFG pairs
    target_hidden: bool = True
    neighbours_k: int = 32
    sampling: SamplingParams | None = None  # None: the models' own defaults (ModelSet.sampling)
    # drafts per draft_chain call (runtime/chain.py: a round's L draft steps in one graph); 0: no chain graph
    draft_chain: int = onnx_export.DEFAULT_CHAIN_STEPS
    # the static tree the draft_tree graph drafts in one call (runtime/tree_call.py): a STATIC_TREES
    # name or a tree plan file; "" for none; None: the methods' default tree where max_window holds it
    draft_tree: str | None = None
    # the dynamic tree the draft_growth graph grows in one call: "DEPTH,TOP_K"; "" for none; None:
    # the methods' default (depth 6, tree_top_k 8) where max_window holds its fed frontier nodes
    draft_growth: str | None = None
    # how the step graphs take the KV cache (specrt.runtime.kv_inputs): "layers" (per-layer inputs,
    # which onnxruntime's CPU provider reads without copying), "stacked" (the one past_kv input), or
    # None: layers on a machine without a GPU runtime, where onnxruntime on the CPU runs the bundle
    kv_inputs: str | None = None

    def __post_init__(self) -> None:
        if self.opset not in onnx_export.SUPPORTED_OPSETS:
            raise SpecrtError(f"--opset must be one of {onnx_export.SUPPORTED_OPSETS}, got {self.opset}")
        for flag, value in (("--max-window", self.max_window), ("--max-batch", self.max_batch),
                            ("--neighbours", self.neighbours_k)):
            validation.count(flag, value)
        validation.integer("--draft-chain (0: none)", self.draft_chain, low=0)
        if self.kv_inputs not in (None, *kv_inputs.FORMS):
            raise SpecrtError(f"--kv-inputs must be one of auto, {', '.join(kv_inputs.FORMS)}; got {self.kv_inputs!r}")
        self.tree_paths  # a wrong name or plan, or a tree too large, fails here, before any export
        self.growth

    @property
    def step_kv_inputs(self) -> str:
        """The step graphs' cache form: kv_inputs, or where it is None (auto) per-layer inputs on a
        machine with no GPU runtime (onnxruntime on the CPU will run the bundle) and the stacked
        past_kv where TensorRT or a GPU provider of onnxruntime is installed (TensorRT binds one buffer)."""
        if self.kv_inputs is not None:
            return self.kv_inputs
        from specrt.engines.quantize import gpu_runtime_installed

        return kv_inputs.STACKED_FORM if gpu_runtime_installed() else kv_inputs.LAYERS

    @property
    def tree_paths(self) -> list[list[int]]:
        """The --draft-tree shape as paths of child ranks ([] for none), checked against
        --max-window: the target verifies the whole tree in one window. The default tree is
        left out where the window is too small for it (no method could draft it there)."""
        if self.draft_tree == "":
            return []
        try:
            shape = static_shape(self.draft_tree or DEFAULT_STATIC_TREE)
        except SpecrtError as exc:
            raise SpecrtError(f"--draft-tree: {exc}") from None
        if shape.size > self.max_window - 1:
            if self.draft_tree is None:
                return []
            raise SpecrtError(f"--draft-tree {self.draft_tree} has {shape.size} drafts; --max-window "
                              f"{self.max_window} verifies {self.max_window - 1} at most")
        return shape.paths

    @property
    def growth(self) -> tuple[int, int] | None:
        """The --draft-growth (depth, top_k), or None for no draft_growth graph. The graph feeds
        (depth − 1)·top_k frontier nodes after a window of at least one token, so --max-window
        must hold that many and one; the default is left out where it cannot."""
        if self.draft_growth == "":
            return None
        text = self.draft_growth or ",".join(map(str, DEFAULT_GROWTH))
        parts = text.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            raise SpecrtError(f"--draft-growth takes DEPTH,TOP_K (two positive integers, e.g. 6,8) or none, "
                              f"got {self.draft_growth!r}")
        depth, top_k = (int(p) for p in parts)
        fed = (depth - 1) * top_k
        if fed + 1 > self.max_window:
            if self.draft_growth is None:
                return None
            raise SpecrtError(f"--draft-growth {text} feeds {fed} frontier nodes after the window; --max-window "
                              f"{self.max_window} holds {self.max_window - 1} at most")
        return depth, top_k

    def fitted(self, config: Any, say: Callable[[str], None] = lambda _msg: None) -> "ExportOptions":
        """These options checked against the model they export (its image tokens and vocabulary).

        Why: what fits one model does not fit every model. A window longer than an image's
        tokens + 1 is never used by any method, yet sizes every KV buffer (--max-window 100000
        made each generate allocate tens of GiB), so it is refused. A tree or growth graph
        keeps up to top-k children per node: a default that wants more children than the
        vocabulary has is left out with a note (torch.export failed on it with a long
        traceback); a value the user gave is refused, one line each."""
        tokens = int(config.grammar.stream_len if is_prompt_model(config) else config.grid_size ** 2)
        vocab = int(config.vocab_size)
        checked_max_window(self.max_window, tokens)
        fitted = self
        growth = self.growth
        if growth is not None and growth[1] > vocab:
            if self.draft_growth is not None:
                raise SpecrtError(f"--draft-growth {self.draft_growth}: top-k {growth[1]} is more than this model's "
                                  f"{vocab} tokens; give a top-k of at most {vocab}, or none")
            say(f"note: no draft_growth graph: the default dynamic tree keeps {growth[1]} children per node and "
                f"this model has {vocab} tokens (--draft-growth DEPTH,{vocab} makes one)")
            fitted = replace(fitted, draft_growth="")
        paths = self.tree_paths
        widest = max((rank + 1 for path in paths for rank in path), default=0)
        if widest > vocab:
            if self.draft_tree is not None:
                raise SpecrtError(f"--draft-tree {self.draft_tree}: a node has {widest} children, more than this "
                                  f"model's {vocab} tokens")
            say(f"note: no draft_tree graph: the default static tree has a node with {widest} children and this "
                f"model has {vocab} tokens")
            fitted = replace(fitted, draft_tree="")
        return fitted

    @property
    def chain_steps(self) -> int:
        """Drafts per draft_chain call: --draft-chain, at most max_window − 1 (no method drafts
        more: its target window holds the drafts and the pending token)."""
        return min(self.draft_chain, self.max_window - 1)


@dataclass
class ModelSet:
    """The PyTorch models a bundle is exported from (eval mode, float32); the draft is optional.

    sources: free-form provenance per role (checkpoint path, "demo", "random") for the manifest.
    sampling: the manifest's sampling_defaults; None: the target's own (specrt.runtime.defaults),
      the same Pipeline.from_torch uses, so a bundle and its PyTorch modules sample alike.
    text_encoder: t2i only, a runtime.text.T5TextEncoder exported into the bundle as its own graph.
    """

    target: nn.Module
    draft: nn.Module | None  # None: no draft graphs (ar, sjd and sjd-pac need none)
    vq: nn.Module
    sources: dict[str, str] = field(default_factory=dict)
    sampling: SamplingParams | None = None
    text_encoder: Any = None

    @property
    def sampling_defaults(self) -> SamplingParams:
        return self.sampling or defaults_of(self.target)

    @property
    def grid_size(self) -> int:
        return self.target.config.grid_size

    @property
    def image_size(self) -> int:
        return self.grid_size * self.vq.config.downsample


def is_eagle(draft: nn.Module | None) -> bool:
    """An EAGLE head (specrt.export.eagle) rather than an independent draft model."""
    return getattr(draft, "draft_kind", None) == EAGLE_KIND


def check_compatible(models: ModelSet) -> None:
    """The draft must speak the target's token language and the VQ must decode it; say which
    number disagrees otherwise (one line, SpecrtError). An EAGLE head must fit the target's
    features (its loader checks the rest)."""
    draft = models.draft.config if models.draft is not None and not is_eagle(models.draft) else None
    if is_eagle(models.draft):
        head, target = models.draft.config, models.target.config
        for name in ("dim", "vocab_size", "grid_size", "cond_len"):
            if getattr(head, name) != getattr(target, name):
                raise SpecrtError(f"the EAGLE head's {name} {getattr(head, name)} != the target's {getattr(target, name)}")
        if target.model_type != "c2i":
            raise SpecrtError("EAGLE heads are exported for class-conditional (c2i) targets only so far")
    compatibility.check_compatible(models.target.config, draft, models.vq.config, "specrt export")
    encoder = models.text_encoder
    if encoder is not None:
        target = models.target.config
        if target.model_type != "t2i":
            raise SpecrtError("a text encoder goes with text-to-image (t2i) models; these are c2i")
        if (encoder.dim, encoder.max_length) != (target.caption_dim, target.cond_len):
            raise SpecrtError(f"text encoder gives {encoder.max_length} x {encoder.dim} features; the GPT reads "
                              f"{target.cond_len} x {target.caption_dim} caption embeddings")


def _model_entry(config, capacity: int, **extra: Any) -> dict[str, Any]:
    condition = ({"num_classes": config.num_classes, "null_class": config.num_classes} if config.model_type == "c2i"
                 else {"caption_dim": config.caption_dim})
    return {
        "family": "llamagen", "model_type": config.model_type, "vocab_size": config.vocab_size,
        "grid_size": config.grid_size, "cond_len": config.cond_len, **condition, "n_layer": config.n_layer,
        "n_head": config.n_head, "n_kv_head": config.n_kv_head, "head_dim": config.head_dim, "dim": config.dim,
        "capacity": capacity, **extra,
    }


def _draft_entry(models: ModelSet, capacity: int) -> dict[str, Any]:
    """models.draft: an independent GPT's own numbers, or an EAGLE head's (kind `eagle`: one
    layer, the target's condition keys, its FFN width)."""
    source = models.sources.get("draft", "")
    if not is_eagle(models.draft):
        return _model_entry(models.draft.config, capacity, kind="independent", source=source)
    head, target = models.draft.config, models.target.config
    entry = _model_entry(target, capacity, kind=EAGLE_KIND, source=source)
    entry.update(family="eagle", n_layer=1, n_head=head.n_head, n_kv_head=head.n_kv_head, head_dim=head.head_dim,
                 ffn_hidden=head.ffn_hidden)
    return entry


def _vq_entry(models: ModelSet) -> dict[str, Any]:
    vq = models.vq.config
    return {"codebook_size": vq.codebook_size, "codebook_embed_dim": vq.codebook_embed_dim,
            "downsample": vq.downsample, "image_size": models.image_size, "grid_size": models.grid_size}


def build_manifest(models: ModelSet, options: ExportOptions, graphs: list[GraphSpec], out_dir: Path,
                   text_encoder: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest.json content for files already written to out_dir (hashes computed here);
    `text_encoder` is the entry of an exported text encoder (export.text_encoder)."""
    capacity = capacity_for(models.target.config, options.max_window)
    sources = models.sources
    files = [g.file for g in graphs] + [g.external_data for g in graphs if g.external_data] + [NEIGHBOURS_FILE]
    embeddings = token_embeddings_entry(out_dir)
    files += [EMBEDDINGS_FILE] if embeddings else []
    if text_encoder:
        files.append(text_encoder["tokenizer"])
    s = options.sampling or models.sampling_defaults
    extra = {"text_encoder": text_encoder} if text_encoder else {}
    return {
        "format": FORMAT, "version": VERSION, "created_by": f"specrt {__version__}",
        "models": {
            "target": _model_entry(models.target.config, capacity, source=sources.get("target", "")),
            **({"draft": _draft_entry(models, capacity)} if models.draft is not None else {}),
            "vq": {**_vq_entry(models), "source": sources.get("vq", "")},
        },
        "sampling_defaults": as_dict(s),
        "limits": {"max_window": options.max_window, "max_images": options.max_batch,
                   "max_batch": rows_for_images(options.max_batch)},
        "graphs": {g.name: g.to_json() for g in graphs},
        "neighbours": {"file": NEIGHBOURS_FILE, "k": options.neighbours_k, "metric": "euclidean",
                       "codebook": "l2-normalised" if models.vq.config.codebook_l2_norm else "raw"},
        **embeddings,
        **extra,
        "files": {name: file_record(out_dir / name) for name in files},
    }


def _graph_jobs(models: ModelSet, options: ExportOptions, limits: GraphLimits) -> list[tuple[str, Callable[[Path], GraphSpec]]]:
    """(graph name, export function of the work directory), in manifest order."""
    opset, kv = options.opset, options.step_kv_inputs
    target = [
        ("target_prefill", lambda d: onnx_export.export_prefill(models.target, "target", limits, d, opset, options.target_hidden)),
        ("target_step", lambda d: onnx_export.export_step(models.target, "target", limits, d, opset, options.target_hidden,
                                                                       kv)),
    ]
    draft = [
        ("draft_prefill", lambda d: onnx_export.export_prefill(models.draft, "draft", limits, d, opset, False)),
        ("draft_step", lambda d: onnx_export.export_step(models.draft, "draft", limits, d, opset, False, kv)),
        *draft_chain_jobs(models.draft, options.chain_steps, limits, opset),
        *([("draft_tree", lambda d: onnx_export.export_tree(models.draft, "draft", limits, d, options.tree_paths, opset))]
          if options.tree_paths else []),
        *([("draft_growth", lambda d: onnx_export.export_growth(models.draft, "draft", limits, d, *options.growth, opset))]
          if options.growth else []),
    ] if models.draft is not None and not is_eagle(models.draft) else []
    if is_eagle(models.draft):
        if not options.target_hidden:
            raise SpecrtError("an EAGLE draft reads the target's hidden states: drop --no-hidden")
        from specrt.export import eagle_graphs as head

        steps = options.chain_steps  # the head's draft_chain, draft_tree and draft_growth, as an independent draft's
        draft = [(head.GRAPH, lambda d: head.export_head_step(models.draft, limits, d, opset)),
                 *([(head.CHAIN_GRAPH, lambda d: head.export_head_chain(models.draft, limits, d, opset, steps))]
                   if steps else []),
                 *([(head.TREE_GRAPH, lambda d: head.export_head_tree(models.draft, limits, d, options.tree_paths, opset))]
                   if options.tree_paths else []),
                 *([(head.GROWTH_GRAPH, lambda d: head.export_head_growth(models.draft, limits, d, *options.growth, opset))]
                   if options.growth else [])]
    text = []
    if models.text_encoder is not None:
        from specrt.export.text_encoder import GRAPH, export_text_encoder

        text = [(GRAPH, lambda d: export_text_encoder(models.text_encoder, limits.batch_profile(), d, opset))]
    return [*target, *draft,
            ("vq_decode", lambda d: onnx_export.export_vq_decode(models.vq, models.grid_size, limits, d, opset)), *text]


def draft_chain_jobs(draft: nn.Module, steps: int, limits: GraphLimits, opset: int) -> list[tuple[str, Any]]:
    """The `draft_chain` graph job for an independent LlamaGen draft (none when steps is 0), after
    draft_step; the unified writer exports its own in the weights' dtype (export_language_graph)."""
    if not steps:
        return []
    return [("draft_chain", lambda d: onnx_export.export_chain(draft, "draft", limits, d, opset, steps))]


def _text_encoder_entry(models: ModelSet) -> dict[str, Any] | None:
    if models.text_encoder is None:
        return None
    from specrt.export.text_encoder import text_encoder_entry

    return text_encoder_entry(models.text_encoder)


def write_neighbour_table(work: Path, vq: nn.Module, requested: int, total: int, say: Progress,
                          rows: Callable[[np.ndarray], np.ndarray] = lambda table: table) -> int:
    """LANTERN's table from the VQ's codebook into work/neighbours.npy (`rows` maps the codes' table
    onto the graphs' vocabulary); returns the k used (clamped, with a note, to the codebook)."""
    codebook = codebook_of(vq)
    if codebook is None:
        raise SpecrtError(f"{type(vq).__name__} exposes no codebook for LANTERN's neighbour table")
    k, note = neighbour_count(requested, codebook.shape[0])
    if note:
        say(f"note: {note}")
    say(f"[{total - 1}/{total}] {NEIGHBOURS_FILE} (k={k}) ...")
    np.save(work / NEIGHBOURS_FILE, rows(codebook_neighbours(codebook, k)))
    return k


def write_token_embeddings(work: Path, target: nn.Module, total: int, say: Progress) -> None:
    """GSD's table, the target's input embedding of every token of its sampling vocabulary
    (runtime/token_embeddings.py), into work/token_embeddings.npy as float32 [V, D]."""
    table = embedding_table_of(target)
    if table is None:
        raise SpecrtError(f"{type(target).__name__} exposes no token embeddings for GSD's clusters")
    say(f"[{total - 1}/{total}] {EMBEDDINGS_FILE} ({table.shape[0]} x {table.shape[1]}) ...")
    np.save(work / EMBEDDINGS_FILE, np.ascontiguousarray(table, dtype=np.float32))


def token_embeddings_entry(out_dir: Path) -> dict[str, Any]:
    """The manifest's `token_embeddings` entry for a table written to out_dir ({} where none is)."""
    path = out_dir / EMBEDDINGS_FILE
    if not path.is_file():
        return {}
    rows, dim = np.load(path, mmap_mode="r").shape
    return {"token_embeddings": {"file": EMBEDDINGS_FILE, "rows": int(rows), "dim": int(dim), "dtype": "float32",
                                 "of": "the target's input embedding of each token it samples"}}


def export_graphs(jobs: list[tuple[str, Callable[[Path], GraphSpec]]], work: Path, total: int,
                  say: Progress) -> list[GraphSpec]:
    """Run each (graph name, export function) into `work`, with a progress line before and after
    each (its size and time): the graph loop every bundle writer shares; `total` counts the
    writer's steps (graphs and what follows them)."""
    graphs = []
    for i, (name, export) in enumerate(jobs, start=1):
        started = time.monotonic()
        say(f"[{i}/{total}] {name}.onnx ...")
        spec = export(work)
        size = sum((work / f).stat().st_size for f in (spec.file, spec.external_data) if f)
        say(f"[{i}/{total}] {name}.onnx  {size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")
        graphs.append(spec)
    return graphs


REUSABLE_ROLES = ("target", "vq")  # a draft differs between the bundles that share a target (model, head)


def _copy_job(source: Manifest, name: str) -> Callable[[Path], GraphSpec]:
    """A graph job that copies graph `name` (and its external data) from `source` into the work directory."""
    spec = source.graph(name)

    def copy(work: Path) -> GraphSpec:
        for file in (spec.file, spec.external_data):
            if file:
                shutil.copyfile(source.root / file, work / file)
        return spec
    return copy


def write_bundle(models: ModelSet, out: str | Path, options: ExportOptions | None = None, force: bool = False,
                 progress: Progress | None = None, reuse: Manifest | None = None) -> Manifest:
    """Export every graph, the neighbour table and the manifest to `out`, atomically.

    Refuses an existing `out` unless force. Work happens in a hidden sibling directory that
    is removed on any failure; only a complete bundle is renamed to `out`. Returns the
    manifest as read back (hashes verified).

    `reuse`: a bundle exported from the same target and VQ weights with the same options (the
    caller vouches for it, as the demo cache does by its weights digest): its target and VQ graphs
    are copied instead of exported again — an EAGLE bundle of the demo then exports only its head.
    """
    options = options or ExportOptions()
    out = Path(out).absolute()
    say = progress or (lambda _msg: None)
    refuse_existing(out, force)
    check_compatible(models)
    options = options.fitted(models.target.config, say)
    limits = GraphLimits(capacity=capacity_for(models.target.config, options.max_window),
                         max_window=options.max_window, max_batch=rows_for_images(options.max_batch),
                         max_images=options.max_batch)
    with partial_dir(out, note=progress) as work:
        jobs = _graph_jobs(models, options, limits)
        if reuse is not None:
            jobs = [(name, _copy_job(reuse, name) if name in reuse.graphs and reuse.graph(name).role in REUSABLE_ROLES
                     else export) for name, export in jobs]
        total = len(jobs) + 2
        graphs = export_graphs(jobs, work, total, say)
        k = write_neighbour_table(work, models.vq, options.neighbours_k, total, say)
        write_token_embeddings(work, models.target, total, say)
        say(f"[{total}/{total}] {MANIFEST_NAME}")
        manifest = build_manifest(models, replace(options, neighbours_k=k), graphs, work, _text_encoder_entry(models))
        (work / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        read_manifest(work, partial_ok=True)  # never rename something we could not read back
        move_into_place(work, out, force)
    return read_manifest(out, check_hashes=False)
