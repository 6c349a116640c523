"""Write a unified-vocabulary bundle: a Hugging Face checkpoint directory -> graphs + recipe + manifest.

The bundle is the discrete family's (prefill/step graphs ending in the sampling head, vq_decode,
LANTERN's neighbour table, manifest.json) plus what only these models have (docs/contracts.md,
"Unified-vocabulary models"): the model's own tokenizer.json and its prompt recipe (template,
structural prefix/suffix ids, unconditional rule, sampling defaults) under the manifest's "prompt",
and the image grammar under models.target. Assembled in a hidden temporary directory and renamed
into place only when complete (specrt.bundle_dir), as every bundle is.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from specrt import __version__
from specrt.bundle_dir import move_into_place, partial_dir, refuse_existing
from specrt.errors import SpecrtError
from specrt.export import onnx_export
from specrt.export.bundle import (NEIGHBOURS_FILE, ExportOptions, export_graphs, token_embeddings_entry,
                                  write_neighbour_table, write_token_embeddings)
from specrt.runtime.token_embeddings import EMBEDDINGS_FILE
from specrt.export.onnx_export import GraphLimits, capacity_for
from specrt.manifest import FORMAT, MANIFEST_NAME, VERSION, GraphSpec, Manifest, file_record, read_manifest, rows_for_images
from specrt.runtime.chain import DraftChain, DraftGrowth
from specrt.runtime.grammar import head_neighbours

FAMILY = "unified"
TOKENIZER_FILE = "tokenizer.json"
Progress = Callable[[str], None]


@dataclass
class UnifiedModels:
    """What a unified bundle is exported from: the language model(s) (specrt.export.unified.UnifiedLM),
    the VQ decoder (decode_codes, config.downsample / codebook_size), the prompt recipe and tokenizer."""

    target: nn.Module
    draft: Optional[nn.Module]
    vq: Optional[nn.Module]                  # None: a tokens-only bundle (no vq_decode, no neighbour table)
    prompt: dict[str, Any]                   # the manifest's "prompt" block, tokenizer file name excepted
    sampling_defaults: dict[str, float]
    tokenizer_file: Optional[Path] = None    # the checkpoint's tokenizer.json (None: prompts as token ids only)
    sources: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        """The draft must share the target's grammar and prompt length, the VQ decode the codes."""
        target = self.target.config
        if self.draft is not None:
            draft = self.draft.config
            for name in ("grammar", "cond_len", "vocab_size"):
                if getattr(draft, name) != getattr(target, name):
                    raise SpecrtError(f"the draft's {name} {getattr(draft, name)} differs from the target's "
                                      f"{getattr(target, name)}: a draft must use the target's vocabulary and grammar")
        codes = int(self.vq.config.codebook_size) if self.vq is not None else target.grammar.image_vocab
        if codes != target.grammar.image_vocab:
            raise SpecrtError(f"the VQ decoder has {codes} codes but the model's vocabulary has "
                              f"{target.grammar.image_vocab} image tokens")


def model_entry(config: Any, capacity: int, **extra: Any) -> dict[str, Any]:
    """models.<role> of a unified bundle: the discrete keys (runtime/bundle_check.py) and the grammar."""
    grammar = config.grammar
    return {
        "family": FAMILY, "architecture": config.architecture, "model_type": "prompt",
        "vocab_size": grammar.vocab_size, "image_vocab": grammar.image_vocab, "grid_size": grammar.rows,
        "grid_cols": grammar.cols, "row_end": grammar.row_end, "stream_len": grammar.stream_len,
        "cond_len": config.cond_len, "text_vocab_size": getattr(config, "text_vocab_size", None),
        "n_layer": config.n_layer, "n_head": config.n_head, "n_kv_head": config.n_kv_head,
        "head_dim": config.head_dim, "dim": config.dim, "capacity": capacity, **extra,
    }


def vq_entry(models: UnifiedModels) -> dict[str, Any]:
    grammar, down = models.target.config.grammar, int(models.vq.config.downsample)
    return {"codebook_size": int(models.vq.config.codebook_size), "downsample": down,
            "grid_size": grammar.rows, "grid_cols": grammar.cols,
            "image_size": [grammar.rows * down, grammar.cols * down], "source": models.sources.get("vq", "")}


KV_NAMES = ("past_kv", "present_kv")
BFLOAT16_NOTE = ("note: bfloat16 graphs run on GPU execution providers (ort-cuda, TensorRT); onnxruntime CPU has no "
                 "bfloat16 kernels for them: export --dtype float16 for CPU")
_TORCH_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def kv_dtype(model: nn.Module) -> str:
    """The dtype of a model's KV cache: its weights' (k and v are projections of them). The graphs'
    past_kv / present_kv carry it and the manifest records it (the runtime allocates its cache
    with it); logits, hidden and the sampling head stay float32 whatever the weights."""
    dtype = getattr(model, "dtype", torch.float32)
    if dtype not in _TORCH_DTYPES:
        raise SpecrtError(f"weights of dtype {dtype} cannot be exported; use float32, float16 or bfloat16")
    return _TORCH_DTYPES[dtype]


def with_kv_dtype(spec: GraphSpec, dtype: str) -> GraphSpec:
    """`spec` with past_kv / present_kv in `dtype` (onnx_export's specs say float32)."""
    def retype(tensors):
        return tuple(replace(t, dtype=dtype) if t.name in KV_NAMES else t for t in tensors)
    return replace(spec, inputs=retype(spec.inputs), outputs=retype(spec.outputs))


def export_language_graph(model: nn.Module, kind: str, role: str, limits: GraphLimits, out_dir: Path, opset: int,
                          with_hidden: bool, shape: Any = 0) -> GraphSpec:
    """The `<role>_<kind>` graph (prefill, step, a draft chain of `shape` drafts or a dynamic tree's
    growth of `shape` = (depth, top_k)) with the KV cache in the weights' dtype (float16 /
    bfloat16 weights: a float16 / bfloat16 cache, as the model computes it)."""
    name = f"{role}_{kind}"
    if kind == "chain":
        spec = onnx_export.chain_spec(name, role, model.config, limits, opset, shape)
        graph: nn.Module = DraftChain(model, shape)
    elif kind == "growth":
        spec = onnx_export.growth_spec(name, role, model.config, limits, opset, *shape)
        graph = DraftGrowth(model, *shape)
    elif kind == "prefill":
        spec = onnx_export.prefill_spec(name, role, model.config, limits, opset, with_hidden)
        graph = onnx_export._PromptPrefillGraph(model, with_hidden)
    else:
        spec = onnx_export.step_spec(name, role, model.config, limits, opset, with_hidden)
        graph = onnx_export._StepGraph(model, with_hidden)
    spec = with_kv_dtype(spec, kv_dtype(model))
    examples = onnx_export._example_inputs(spec, model.config)
    examples = tuple(x.to(model.dtype) if name == "past_kv" else x for name, x in zip(spec.input_names, examples))
    return onnx_export._export(graph, spec, examples, out_dir)


def _graph_jobs(models: UnifiedModels, options: ExportOptions, limits: GraphLimits) -> list[tuple[str, Callable[[Path], GraphSpec]]]:
    opset, grammar = options.opset, models.target.config.grammar

    def language(model: nn.Module, role: str, kind: str, hidden: bool) -> Callable[[Path], GraphSpec]:
        return lambda d: export_language_graph(model, kind, role, limits, d, opset, hidden)

    jobs = [("target_prefill", language(models.target, "target", "prefill", options.target_hidden)),
            ("target_step", language(models.target, "target", "step", options.target_hidden))]
    if models.draft is not None:
        jobs += [("draft_prefill", language(models.draft, "draft", "prefill", False)),
                 ("draft_step", language(models.draft, "draft", "step", False))]
        draft = models.draft
        if options.chain_steps:
            jobs.append(("draft_chain", lambda d: export_language_graph(draft, "chain", "draft", limits, d, opset,
                                                                         False, options.chain_steps)))
        # dynamic trees grown in one call, as a LlamaGen bundle's: the same tokens as per pass. No
        # draft_tree: a forced row end is a point-mass row, where the per-pass drafter draws fewer
        # uniforms than the graph's fixed layout, so the two would draw different (equally exact) trees
        if options.growth:
            jobs.append(("draft_growth", lambda d: export_language_graph(draft, "growth", "draft", limits, d, opset,
                                                                          False, options.growth)))
    if models.vq is not None:
        jobs.append(("vq_decode", lambda d: onnx_export.export_vq_decode(models.vq, grammar.rows, limits, d, opset,
                                                                          cols=grammar.cols)))
    return jobs


def build_manifest(models: UnifiedModels, options: ExportOptions, graphs: list[GraphSpec], out_dir: Path) -> dict[str, Any]:
    capacity = capacity_for(models.target.config, options.max_window)
    files = [g.file for g in graphs] + [g.external_data for g in graphs if g.external_data]
    files += [NEIGHBOURS_FILE] if models.vq is not None else []
    embeddings = token_embeddings_entry(out_dir)
    files += [EMBEDDINGS_FILE] if embeddings else []
    prompt = dict(models.prompt)
    if models.tokenizer_file is not None:
        prompt["tokenizer"] = TOKENIZER_FILE
        files.append(TOKENIZER_FILE)
    draft = {}
    if models.draft is not None:
        draft = {"draft": model_entry(models.draft.config, capacity, kind="independent",
                                      source=models.sources.get("draft", ""))}
    return {
        "format": FORMAT, "version": VERSION, "created_by": f"specrt {__version__}", "family": FAMILY,
        "models": {"target": model_entry(models.target.config, capacity, source=models.sources.get("target", "")),
                   **draft, **({"vq": vq_entry(models)} if models.vq is not None else {})},
        "sampling_defaults": dict(models.sampling_defaults),
        "limits": {"max_window": options.max_window, "max_images": options.max_batch,
                   "max_batch": rows_for_images(options.max_batch)},
        "graphs": {g.name: g.to_json() for g in graphs},
        **({"neighbours": {"file": NEIGHBOURS_FILE, "k": options.neighbours_k, "metric": "euclidean",
                           "codebook": "raw"}} if models.vq is not None else {}),
        **embeddings,
        "prompt": prompt,
        "files": {name: file_record(out_dir / name) for name in files},
    }


def write_unified_bundle(models: UnifiedModels, out: str | Path, options: ExportOptions | None = None,
                         force: bool = False, progress: Progress | None = None) -> Manifest:
    """Export every graph, the neighbour table, the tokenizer and the manifest to `out`, atomically."""
    options = options or ExportOptions()
    out = Path(out).absolute()
    say = progress or (lambda _msg: None)
    refuse_existing(out, force)
    models.check()
    if kv_dtype(models.target) == "bfloat16":
        say(BFLOAT16_NOTE)
    limits = GraphLimits(capacity=capacity_for(models.target.config, options.max_window),
                         max_window=options.max_window, max_batch=rows_for_images(options.max_batch),
                         max_images=options.max_batch)
    with partial_dir(out, note=progress) as work, torch.no_grad():
        jobs = _graph_jobs(models, options, limits)
        total = len(jobs) + 2
        graphs = export_graphs(jobs, work, total, say)
        k = options.neighbours_k
        if models.vq is not None:  # LANTERN's table over the head vocabulary, measured on the decoder's codebook
            grammar = models.target.config.grammar
            k = write_neighbour_table(work, models.vq, k, total, say, lambda table: head_neighbours(table, grammar))
        write_token_embeddings(work, models.target, total, say)  # GSD's: the head vocabulary's input embeddings
        if models.tokenizer_file is not None:
            shutil.copyfile(models.tokenizer_file, work / TOKENIZER_FILE)
        say(f"[{total}/{total}] {MANIFEST_NAME}")
        manifest = build_manifest(models, replace(options, neighbours_k=k), graphs, work)
        (work / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        read_manifest(work, partial_ok=True)  # never rename something we could not read back
        move_into_place(work, out, force)
    return read_manifest(out, check_hashes=False)
