"""PyTorch models -> the ONNX graphs of a bundle (docs/contracts.md, "Graphs of a bundle").

Each graph is a thin wrapper around one entry point of the PyTorch model (GPT.prefill,
GPT.step, VQ decode), so the torch backend and the graphs cannot drift apart. The prefill
and step wrappers end in the runtime's own sampling head (specrt.runtime.head.SamplingHead:
mix, uniforms -> probs, draws), the very module the PyTorch backend runs. Otherwise the
wrappers only adapt dtypes: the graphs take int32 ids/positions (what TensorRT wants) and
cast to int64 inside, where torch needs it.

Why the export looks the way it does (DESIGN.md, pitfalls):
- torch.onnx.export's dynamo path with `dynamic_shapes`; example sizes are >= 2 and pairwise
  different for every dynamic dim, or torch.export specialises or merges them.
- The mask has its own dim `total_len` (exporters reject the derived cache_len + window).
- After export we stamp our symbolic dim names on every graph input and output and check
  names, dtypes and static dims against the GraphSpec the manifest will carry, so a
  contract break fails the export rather than the runtime.
"""
from __future__ import annotations

import contextlib
import gc
import io
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.manifest import GraphSpec, TensorSpec
from specrt.models.kv_cache import LayerInputs
from specrt.runtime.chain import DraftChain, DraftGrowth, DraftTree
from specrt.runtime.head import SamplingHead
from specrt.runtime.kv_inputs import LAYERS, STACKED_FORM, is_layer_name, layer_names
from specrt.runtime.methods import DEFAULT_MAX_WINDOW
from specrt.runtime.tree import StaticShape
from specrt.runtime.tree_call import GrowthLayout, TreeLayout

BATCH, WINDOW, CACHE_LEN, TOTAL_LEN, IMAGES = "batch", "window", "cache_len", "total_len", "images"
TREE_LEN = "tree_len"  # a draft tree's present rows: its window and the nodes it fed (runtime/tree_call.py)
GROWTH_LEN = "growth_len"  # a dynamic tree's present rows: its window and the frontier nodes it fed
CHAIN_LEN = "chain_len"  # a draft chain's present rows: its window and the drafts it fed (window + steps - 1)
DEFAULT_CHAIN_STEPS = 4  # drafts per draft_chain call: the draft-then-verify methods' default draft_len
DEFAULT_OPSET = 18
SUPPORTED_OPSETS = (18, 19, 20, 23)  # torch's dynamo exporter emits nothing older than 18
EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's hard limit is 2 GiB; keep a margin for the graph itself

# Example sizes used while tracing: >= 2 and all different (see module docstring), total_len
# = cache_len + window = 8 included; so images is 4 here, although a real call has images <= batch.
# A draft chain pairs each image with its model rows (batch = images · pairs): its own sizes.
_EXAMPLE = {BATCH: 2, WINDOW: 3, CACHE_LEN: 5, IMAGES: 4}
_CHAIN_EXAMPLE = {BATCH: 6, WINDOW: 3, CACHE_LEN: 5, IMAGES: 2}


@dataclass(frozen=True)
class GraphLimits:
    """The sizes the graphs' optimization profiles are made for.

    capacity: KV buffer length = cond_len + grid² + max_window (docs/contracts.md).
    max_batch counts model rows (the graphs' `batch`), max_images the images a pass decodes
    (the head's `images`; None: max_batch). `specrt export --max-batch N` counts images:
    max_images N, max_batch rows_for_images(N).
    """

    capacity: int
    max_window: int = DEFAULT_MAX_WINDOW
    opt_window: int | None = None  # None: min(16, max_window)
    max_batch: int = 8
    opt_batch: int | None = None  # None: min(2, max_batch)
    max_images: int | None = None

    def __post_init__(self) -> None:
        if self.opt_window is None:
            object.__setattr__(self, "opt_window", min(16, self.max_window))
        if self.opt_batch is None:
            object.__setattr__(self, "opt_batch", min(2, self.max_batch))
        if self.max_images is None:
            object.__setattr__(self, "max_images", self.max_batch)
        if self.max_window < 1:
            raise SpecrtError(f"--max-window must be >= 1, got {self.max_window}")
        if self.max_batch < 1:
            raise SpecrtError(f"--max-batch must be >= 1, got {self.max_batch}")
        if not 1 <= self.opt_window <= self.max_window or not 1 <= self.opt_batch <= self.max_batch:
            raise SpecrtError("optimization profile needs 1 <= opt <= max for window and batch")

    def batch_profile(self) -> dict[str, int]:
        return {"min": 1, "opt": self.opt_batch, "max": self.max_batch}

    def images_profile(self) -> dict[str, int]:
        """Images per pass (the head's output rows): batch / 2 with CFG, batch without; opt is
        the CFG pair of the batch's opt (one image at the default opt batch 2)."""
        return {"min": 1, "opt": max(1, self.opt_batch // 2), "max": self.max_images}

    def prefill_profile(self) -> dict[str, dict[str, int]]:
        return {BATCH: self.batch_profile(), IMAGES: self.images_profile()}

    def step_profile(self) -> dict[str, dict[str, int]]:
        """batch, images, window, cache_len (pinned to capacity: the runtime always binds the
        whole buffer) and total_len = cache_len + window at every level."""
        window = {"min": 1, "opt": self.opt_window, "max": self.max_window}
        cache = {level: self.capacity for level in ("min", "opt", "max")}
        return {BATCH: self.batch_profile(), IMAGES: self.images_profile(), WINDOW: window, CACHE_LEN: cache,
                TOTAL_LEN: {level: cache[level] + window[level] for level in window}}


def capacity_for(config, max_window: int) -> int:
    """KV buffer length of a model: every condition and image token (a unified model's whole
    stream, row ends included) plus one full window."""
    if is_prompt_model(config):
        return config.cond_len + config.grammar.stream_len + max_window
    return config.cond_len + config.grid_size**2 + max_window


# ---- wrappers: the graphs' exact signatures ---------------------------------------------


class _WithHead(nn.Module):
    """The model's (logits, hidden, present_kv) followed by the sampling head's (probs, draws)."""

    def __init__(self, gpt: nn.Module, with_hidden: bool):
        super().__init__()
        self.gpt, self.with_hidden, self.head = gpt, with_hidden, SamplingHead()

    def _outputs(self, logits, hidden, present_kv, mix, uniforms):
        probs, draws = self.head(logits, mix, uniforms)
        return (logits, hidden, present_kv, probs, draws) if self.with_hidden else (logits, present_kv, probs, draws)


class _PrefillGraph(_WithHead):
    def forward(self, class_ids: torch.Tensor, mix: torch.Tensor, uniforms: torch.Tensor):
        return self._outputs(*self.gpt.prefill(class_ids.long()), mix, uniforms)


class _CaptionPrefillGraph(_WithHead):
    """t2i: captions and their padding mask; `uncond` rows take the checkpoint's uncond_embedding."""

    def forward(self, captions: torch.Tensor, caption_mask: torch.Tensor, uncond: torch.Tensor,
                mix: torch.Tensor, uniforms: torch.Tensor):
        return self._outputs(*self.gpt.prefill(captions, caption_mask, uncond), mix, uniforms)


class _PromptPrefillGraph(_WithHead):
    """Unified-vocabulary models: a left-padded token prompt and its mask (docs/contracts.md)."""

    def forward(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, mix: torch.Tensor, uniforms: torch.Tensor):
        return self._outputs(*self.gpt.prefill(input_ids.long(), prompt_mask), mix, uniforms)


class _StepGraph(_WithHead):
    def forward(self, input_ids, positions, attention_mask, past_kv, mix, uniforms):
        return self._outputs(*self.gpt.step(input_ids.long(), positions.long(), attention_mask, past_kv), mix, uniforms)


class _LayerInputsStepGraph(_WithHead):
    """The step graph with the cache as per-layer inputs (specrt.runtime.kv_inputs): `rest` is
    past_key_0, past_value_0, ..., then mix and uniforms; attention reads each layer's past beside
    the window's rows (models.kv_cache.LayerInputs), so the graph copies none of it."""

    def forward(self, input_ids, positions, attention_mask, *rest):
        past, (mix, uniforms) = rest[:-2], rest[-2:]
        cache = LayerInputs(tuple(past[0::2]), tuple(past[1::2]))
        return self._outputs(*self.gpt.step(input_ids.long(), positions.long(), attention_mask, cache), mix, uniforms)


def decode_codes(vq: nn.Module, codes: torch.Tensor) -> torch.Tensor:
    """codes int [B,h,w] -> image, for a full VQModel (decode_codes) or a VQDecoder (forward)."""
    return vq.decode_codes(codes.long()) if hasattr(vq, "decode_codes") else vq(codes.long())


class _VQDecodeGraph(nn.Module):
    def __init__(self, vq: nn.Module):
        super().__init__()
        self.vq = vq

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return decode_codes(self.vq, codes)


# ---- graph specs (what the manifest says about each graph) -----------------------------


def _kv_shape(config, batch: str, length) -> tuple:
    return (config.n_layer, 2, batch, config.n_kv_head, length, config.head_dim)


def head_inputs(window) -> tuple[TensorSpec, ...]:
    """The sampling head's inputs: the guidance matrix and one uniform per output row."""
    return (TensorSpec("mix", "float32", (IMAGES, BATCH)), TensorSpec("uniforms", "float32", (IMAGES, window)))


def head_outputs(config, window) -> tuple[TensorSpec, ...]:
    """The sampling head's outputs, after the model's: probabilities and one draw per row."""
    return (TensorSpec("probs", "float32", (IMAGES, window, config.vocab_size)),
            TensorSpec("draws", "int32", (IMAGES, window)))


def is_prompt_model(config) -> bool:
    """A unified-vocabulary model (specrt.export.unified): token prompts and an image grammar."""
    return getattr(config, "grammar", None) is not None


def condition_inputs(config) -> tuple[TensorSpec, ...]:
    """What a prefill graph is conditioned on: class ids (c2i), or caption embeddings, their
    padding mask (False = padded position) and the CFG rows' flag (t2i), or a token prompt and
    its padding mask (unified-vocabulary models)."""
    if is_prompt_model(config):
        return (TensorSpec("input_ids", "int32", (BATCH, config.cond_len)),
                TensorSpec("prompt_mask", "bool", (BATCH, config.cond_len)))
    if config.model_type == "c2i":
        return (TensorSpec("class_ids", "int32", (BATCH,)),)
    return (TensorSpec("captions", "float32", (BATCH, config.cond_len, config.caption_dim)),
            TensorSpec("caption_mask", "bool", (BATCH, config.cond_len)),
            TensorSpec("uncond", "bool", (BATCH,)))


def prefill_spec(name: str, role: str, config, limits: GraphLimits, opset: int, with_hidden: bool) -> GraphSpec:
    outputs = [TensorSpec("logits", "float32", (BATCH, 1, config.vocab_size))]
    if with_hidden:
        outputs.append(TensorSpec("hidden", "float32", (BATCH, 1, config.dim)))
    outputs.append(TensorSpec("present_kv", "float32", _kv_shape(config, BATCH, config.cond_len)))
    return GraphSpec(name=name, file=f"{name}.onnx", role=role, kind="prefill", opset=opset,
                     inputs=(*condition_inputs(config), *head_inputs(1)),
                     outputs=(*outputs, *head_outputs(config, 1)), profile=limits.prefill_profile())


def past_inputs(config, kv_inputs: str = STACKED_FORM) -> tuple[TensorSpec, ...]:
    """A step graph's cache inputs: the contract's stacked `past_kv`, or (kv_inputs `layers`)
    past_key_<i> / past_value_<i> [batch, Hkv, cache_len, D] per layer (specrt.runtime.kv_inputs)."""
    if kv_inputs == STACKED_FORM:
        return (TensorSpec("past_kv", "float32", _kv_shape(config, BATCH, CACHE_LEN)),)
    if kv_inputs != LAYERS:
        raise SpecrtError(f"--kv-inputs must be {LAYERS} or {STACKED_FORM}, got {kv_inputs!r}")
    shape = (BATCH, config.n_kv_head, CACHE_LEN, config.head_dim)
    return tuple(TensorSpec(name, "float32", shape) for name in layer_names(config.n_layer))


def step_spec(name: str, role: str, config, limits: GraphLimits, opset: int, with_hidden: bool,
              kv_inputs: str = STACKED_FORM) -> GraphSpec:
    inputs = (
        TensorSpec("input_ids", "int32", (BATCH, WINDOW)),
        TensorSpec("positions", "int32", (BATCH, WINDOW)),
        TensorSpec("attention_mask", "bool", (BATCH, WINDOW, TOTAL_LEN)),
        *past_inputs(config, kv_inputs),
        *head_inputs(WINDOW),
    )
    outputs = [TensorSpec("logits", "float32", (BATCH, WINDOW, config.vocab_size))]
    if with_hidden:
        outputs.append(TensorSpec("hidden", "float32", (BATCH, WINDOW, config.dim)))
    outputs.append(TensorSpec("present_kv", "float32", _kv_shape(config, BATCH, WINDOW)))
    return GraphSpec(name=name, file=f"{name}.onnx", role=role, kind="step", opset=opset,
                     inputs=inputs, outputs=(*outputs, *head_outputs(config, WINDOW)), profile=limits.step_profile())


def drafting_inputs(config, drafts: int | None) -> tuple[TensorSpec, ...]:
    """A draft chain's or tree's inputs: the step graph's, each image's last real window slot
    after past_kv, and one uniform per draft (None: a graph that draws nothing, the mix alone)."""
    return (
        TensorSpec("input_ids", "int32", (BATCH, WINDOW)),
        TensorSpec("positions", "int32", (BATCH, WINDOW)),
        TensorSpec("attention_mask", "bool", (BATCH, WINDOW, TOTAL_LEN)),
        TensorSpec("past_kv", "float32", _kv_shape(config, BATCH, CACHE_LEN)),
        TensorSpec("last", "int32", (IMAGES,)),
        *(head_inputs(drafts) if drafts is not None else head_inputs(1)[:1]),
    )


def chain_spec(name: str, role: str, config, limits: GraphLimits, opset: int, steps: int) -> GraphSpec:
    """A draft chain (runtime/chain.py): the step graph's inputs plus each image's last real
    window slot; `steps` drafts out (probs and draws [images, steps]) and the present rows of
    the window and of the drafts it fed (chain_len = window + steps - 1)."""
    inputs = drafting_inputs(config, steps)
    profile = limits.step_profile()
    profile[CHAIN_LEN] = {level: size + steps - 1 for level, size in profile[WINDOW].items()}
    return GraphSpec(name=name, file=f"{name}.onnx", role=role, kind="chain", opset=opset, inputs=inputs,
                     outputs=(TensorSpec("present_kv", "float32", _kv_shape(config, BATCH, CHAIN_LEN)),
                              *head_outputs(config, steps)), profile=profile)


def tree_spec(name: str, role: str, config, limits: GraphLimits, opset: int, paths: Sequence[Sequence[int]]) -> GraphSpec:
    """A static tree drafted in one call (runtime/chain.py DraftTree; runtime/tree_call.py its
    layout): the chain's inputs with one uniform per tree node; the rows of the inner nodes, every
    node's token, and the present rows of the window and the fed nodes (tree_len = window + fed)."""
    layout = TreeLayout(StaticShape(paths))
    drafts, inner = layout.nodes - 1, len(layout.inner)
    inputs = drafting_inputs(config, drafts)
    profile = limits.step_profile()
    profile[TREE_LEN] = {level: size + len(layout.fed) for level, size in profile[WINDOW].items()}
    return GraphSpec(name=name, file=f"{name}.onnx", role=role, kind="tree", opset=opset, inputs=inputs,
                     outputs=(TensorSpec("present_kv", "float32", _kv_shape(config, BATCH, TREE_LEN)),
                              TensorSpec("probs", "float32", (IMAGES, inner, config.vocab_size)),
                              TensorSpec("draws", "int32", (IMAGES, drafts))),
                     profile=profile, tree=tuple(tuple(int(r) for r in path) for path in paths))


def growth_spec(name: str, role: str, config, limits: GraphLimits, opset: int, depth: int, top_k: int) -> GraphSpec:
    """A dynamic tree grown in one call (runtime/chain.py DraftGrowth; runtime/tree_call.py
    GrowthLayout its orders): the chain's inputs without uniforms (nothing is drawn); every
    candidate's token and float64 score, each fed frontier node's index in its pass, and the
    present rows of the window and the fed nodes (growth_len = window + (depth − 1)·top_k)."""
    layout = GrowthLayout(depth, top_k)
    profile = limits.step_profile()
    profile[GROWTH_LEN] = {level: size + layout.fed for level, size in profile[WINDOW].items()}
    return GraphSpec(name=name, file=f"{name}.onnx", role=role, kind="growth", opset=opset,
                     inputs=drafting_inputs(config, None),
                     outputs=(TensorSpec("present_kv", "float32", _kv_shape(config, BATCH, GROWTH_LEN)),
                              TensorSpec("tokens", "int32", (IMAGES, layout.candidates)),
                              TensorSpec("scores", "float64", (IMAGES, layout.candidates)),
                              TensorSpec("fronts", "int64", (IMAGES, layout.fed))),
                     profile=profile, growth={"depth": depth, "top_k": top_k})


def vq_decode_spec(grid: int, image_size: int, limits: GraphLimits, opset: int, cols: int | None = None) -> GraphSpec:
    """codes [B, grid, cols] -> image [B, 3, image_size, image_size · cols / grid] (cols: the grid's
    columns when it is not square)."""
    cols = cols or grid
    width = image_size * cols // grid
    return GraphSpec(name="vq_decode", file="vq_decode.onnx", role="vq", kind="decode", opset=opset,
                     inputs=(TensorSpec("codes", "int32", (BATCH, grid, cols)),),
                     outputs=(TensorSpec("image", "float32", (BATCH, 3, image_size, width)),),
                     profile={BATCH: limits.batch_profile()})


# ---- examples for tracing -----------------------------------------------------------------


def _example_inputs(spec: GraphSpec, config, grid: int | None = None) -> tuple[torch.Tensor, ...]:
    """Small valid inputs with the example sizes: ids in range, positions past the condition,
    a causal mask that gives every window slot some visible columns."""
    gen = torch.Generator().manual_seed(0)
    example = _CHAIN_EXAMPLE if spec.kind in ("chain", "tree", "growth") else _EXAMPLE
    size = dict(example, **{TOTAL_LEN: example[CACHE_LEN] + example[WINDOW]})
    tensors = []
    for t in spec.inputs:
        shape = tuple(size[d] if isinstance(d, str) else d for d in t.shape)
        if t.name == "class_ids":
            tensors.append(torch.randint(0, config.num_classes, shape, generator=gen, dtype=torch.int32))
        elif t.name == "captions":
            tensors.append(torch.randn(shape, generator=gen))
        elif t.name == "caption_mask":  # left-padded captions of different lengths, as LlamaGen feeds them
            lengths = torch.arange(shape[0]) % shape[1] + 1
            tensors.append(torch.arange(shape[1])[None] >= shape[1] - lengths[:, None])
        elif t.name == "uncond":
            tensors.append(torch.arange(shape[0]) % 2 == 1)
        elif t.name == "input_ids" and spec.kind == "prefill":  # a token prompt of the model's own vocabulary
            tensors.append(torch.randint(0, 4, shape, generator=gen, dtype=torch.int32))
        elif t.name == "prompt_mask":  # left-padded prompts of different lengths
            lengths = torch.arange(shape[0]) % shape[1] + 1
            tensors.append(torch.arange(shape[1])[None] >= shape[1] - lengths[:, None])
        elif t.name == "input_ids":
            tensors.append(torch.randint(0, config.vocab_size, shape, generator=gen, dtype=torch.int32))
        elif t.name == "positions":
            start = config.cond_len + 1
            tensors.append((start + torch.arange(shape[1], dtype=torch.int32)).expand(shape).contiguous())
        elif t.name == "attention_mask":
            cache, window = size[CACHE_LEN], size[WINDOW]
            mask = torch.zeros(shape, dtype=torch.bool)
            mask[..., : config.cond_len + 1] = True
            mask[..., cache:] = torch.ones(window, window, dtype=torch.bool).tril()
            tensors.append(mask)
        elif t.name == "last":  # each image's last real window slot
            tensors.append(torch.arange(shape[0], dtype=torch.int32) % size[WINDOW])
        elif t.name == "past_kv" or is_layer_name(t.name):
            tensors.append(torch.randn(shape, generator=gen))
        elif t.name == "codes":
            tensors.append(torch.randint(0, config.codebook_size, shape, generator=gen, dtype=torch.int32))
        elif t.name == "mix":
            tensors.append(torch.randn(shape, generator=gen))
        elif t.name == "uniforms":
            tensors.append(torch.rand(shape, generator=gen))
        else:  # pragma: no cover - a new input needs an example here
            raise AssertionError(f"no example for input {t.name}")
    return tuple(tensors)


def _dynamic_shapes(spec: GraphSpec) -> dict[str, dict[int, object]] | tuple:
    # No upper bounds: the profile's max is TensorRT's business; onnxruntime may go beyond it.
    dims = {d: torch.export.Dim(d, min=2 if d == TOTAL_LEN else 1) for d in spec.profile}
    shapes = {t.name: {axis: dims[d] for axis, d in enumerate(t.shape) if isinstance(d, str)} for t in spec.inputs}
    if any(is_layer_name(name) for name in shapes):  # _LayerInputsStepGraph: three named inputs, then *rest
        values = list(shapes.values())
        return (*values[:3], tuple(values[3:]))
    return shapes


# ---- export + contract check -----------------------------------------------------------


def _parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _export(module: nn.Module, spec: GraphSpec, examples: tuple[torch.Tensor, ...], out_dir: Path) -> GraphSpec:
    """Trace `module` to out_dir/spec.file, stamp dim names, check I/O against `spec`."""
    onnx = require("onnx", "ONNX export")
    require("onnxscript", "ONNX export")
    path = out_dir / spec.file
    external = _parameter_bytes(module) > EXTERNAL_DATA_BYTES
    module = module.eval()
    existing = set(out_dir.iterdir())
    quiet = io.StringIO()
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(quiet), _quiet_torch_logs():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, examples, str(path), dynamo=True, opset_version=spec.opset,
            input_names=list(spec.input_names), output_names=list(spec.output_names),
            dynamic_shapes=_dynamic_shapes(spec), external_data=external, optimize=True, verbose=False,
        )
    data = out_dir / f"{spec.file}.data"  # what the exporter names its weights file (onnxscript's ir.save)
    external = external or data.exists()  # it externalises a > 2 GB graph by itself, asked or not
    if not external:
        model = onnx.load(str(path))
        _stamp_and_check(model, spec)
        onnx.save_model(model, str(path))
        return spec
    # Large weights: the exporter has streamed every tensor into `<graph>.onnx.data` (one file,
    # tensor by tensor, from the module's own storage). Read back the graph alone, never the data
    # (that would be a second copy of the weights), stamp it, and rewrite only the graph proto,
    # whose initializers keep pointing into the data file. Stray files the exporter wrote besides
    # these two are removed, so the manifest names and hashes exactly one data file.
    gc.collect()  # the exporter's program and traced state, before anything else is allocated
    if not data.is_file():  # pragma: no cover - an exporter that names its data otherwise
        raise AssertionError(f"{spec.name}: the exporter wrote no {data.name}")
    for written in set(out_dir.iterdir()) - existing - {path, data}:
        written.unlink()
    model = onnx.load(str(path), load_external_data=False)
    _stamp_and_check(model, spec)
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL and \
                {e.key: e.value for e in tensor.external_data}.get("location") != data.name:
            raise AssertionError(f"{spec.name}: initializer {tensor.name} points outside {data.name}")
    onnx.save_model(model, str(path))  # the proto only: the external references are left as they are
    return GraphSpec(**{**spec.__dict__, "external_data": data.name})


@contextlib.contextmanager
def _quiet_torch_logs():
    """torch.onnx logs every stage at WARNING/INFO; our progress lines say the same in one line."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


_ONNX_DTYPES = {"float32": 1, "int32": 6, "int64": 7, "bool": 9, "float16": 10, "float64": 11, "bfloat16": 16}


def _stamp_and_check(model, spec: GraphSpec) -> None:
    """Write our symbolic names onto the graph's I/O dims; raise if the traced graph's I/O
    differs from the contract in names, order, dtype, rank or a static dim, or its opset
    is not the one the manifest will record."""
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset != spec.opset:
        raise AssertionError(f"{spec.name}: exporter wrote opset {opset}, asked for {spec.opset}")
    for kind, values, specs in (("input", model.graph.input, spec.inputs), ("output", model.graph.output, spec.outputs)):
        names = [v.name for v in values]
        if names != [s.name for s in specs]:
            raise AssertionError(f"{spec.name}: traced {kind}s {names} != contract {[s.name for s in specs]}")
        for value, tspec in zip(values, specs):
            ttype = value.type.tensor_type
            if ttype.elem_type != _ONNX_DTYPES[tspec.dtype]:
                raise AssertionError(f"{spec.name}.{value.name}: ONNX elem_type {ttype.elem_type}, contract {tspec.dtype}")
            dims = ttype.shape.dim
            if len(dims) != len(tspec.shape):
                raise AssertionError(f"{spec.name}.{value.name}: rank {len(dims)}, contract {tspec.shape}")
            for dim, want in zip(dims, tspec.shape):
                if isinstance(want, str):
                    dim.Clear()
                    dim.dim_param = want
                elif dim.HasField("dim_value") and dim.dim_value != want:
                    raise AssertionError(f"{spec.name}.{value.name}: static dim {dim.dim_value}, contract {want}")
                else:
                    dim.Clear()
                    dim.dim_value = want


def export_prefill(gpt: nn.Module, role: str, limits: GraphLimits, out_dir: Path, opset: int = DEFAULT_OPSET,
                   with_hidden: bool = True) -> GraphSpec:
    """Export `<role>_prefill`: the condition (class_ids, or captions + caption_mask + uncond),
    mix, uniforms -> logits/hidden of the last condition token, the condition's KV, and the
    head's probs/draws for image token 0."""
    spec = prefill_spec(f"{role}_prefill", role, gpt.config, limits, opset, with_hidden)
    kind = _PromptPrefillGraph if is_prompt_model(gpt.config) else \
        _PrefillGraph if gpt.config.model_type == "c2i" else _CaptionPrefillGraph
    graph = kind(gpt, with_hidden)
    return _export(graph, spec, _example_inputs(spec, gpt.config), out_dir)


def export_step(gpt: nn.Module, role: str, limits: GraphLimits, out_dir: Path, opset: int = DEFAULT_OPSET,
                with_hidden: bool = True, kv_inputs: str = STACKED_FORM) -> GraphSpec:
    """Export `<role>_step`: a window of W tokens against the caller-owned KV buffer, then the head
    (kv_inputs: the buffer as one stacked input, or per layer: specrt.runtime.kv_inputs)."""
    spec = step_spec(f"{role}_step", role, gpt.config, limits, opset, with_hidden, kv_inputs)
    graph = _StepGraph(gpt, with_hidden) if kv_inputs == STACKED_FORM else _LayerInputsStepGraph(gpt, with_hidden)
    return _export(graph, spec, _example_inputs(spec, gpt.config), out_dir)


def export_chain(gpt: nn.Module, role: str, limits: GraphLimits, out_dir: Path, opset: int = DEFAULT_OPSET,
                 steps: int = DEFAULT_CHAIN_STEPS) -> GraphSpec:
    """Export `<role>_chain`: a catch-up window, then `steps` drafts drawn inside the graph."""
    spec = chain_spec(f"{role}_chain", role, gpt.config, limits, opset, steps)
    return _export(DraftChain(gpt, steps), spec, _example_inputs(spec, gpt.config), out_dir)  # its own signature


def export_tree(gpt: nn.Module, role: str, limits: GraphLimits, out_dir: Path, paths: Sequence[Sequence[int]],
                opset: int = DEFAULT_OPSET) -> GraphSpec:
    """Export `<role>_tree`: a catch-up window, then the static tree `paths` drafted inside the graph."""
    spec = tree_spec(f"{role}_tree", role, gpt.config, limits, opset, paths)
    return _export(DraftTree(gpt, TreeLayout(StaticShape(paths))), spec, _example_inputs(spec, gpt.config), out_dir)


def export_growth(gpt: nn.Module, role: str, limits: GraphLimits, out_dir: Path, depth: int, top_k: int,
                  opset: int = DEFAULT_OPSET) -> GraphSpec:
    """Export `<role>_growth`: a catch-up window, then a dynamic tree of `depth` passes with `top_k`
    children per expanded node grown inside the graph."""
    spec = growth_spec(f"{role}_growth", role, gpt.config, limits, opset, depth, top_k)
    return _export(DraftGrowth(gpt, depth, top_k), spec, _example_inputs(spec, gpt.config), out_dir)


def export_vq_decode(vq: nn.Module, grid: int, limits: GraphLimits, out_dir: Path, opset: int = DEFAULT_OPSET,
                     cols: int | None = None) -> GraphSpec:
    """Export `vq_decode`: codes int32 [B, grid, cols (= grid)] -> image [B, 3, H, W]."""
    image_size = grid * vq.config.downsample
    spec = vq_decode_spec(grid, image_size, limits, opset, cols)
    return _export(_VQDecodeGraph(vq), spec, _example_inputs(spec, vq.config), out_dir)
