"""Quantized bundles: INT8 / FP8 / INT4 weights, and the target's own quantized copy as a draft.

A decode step at small batch reads every weight once, so its time is about weights ÷ memory
bandwidth; INT4 weights cut that 4x against fp16 (8x against our fp32 graphs). Two tools:

- onnxruntime's weight-only quantizer (`MatMulNBits`, int4): what onnxruntime runs fast on
  CPU and CUDA. Round-to-nearest per block of `block_size` input rows, symmetric; no
  calibration. `accuracy_level` picks the kernel's compute type: 4 (int8 activations) was
  1.6x faster than fp32 for a GPT-B step on a 2-core EPYC, the default (fp32) no faster.
- onnxruntime's int8 for its CPU kernels: the same `MatMulNBits` with 8-bit weights (block of
  `block_size`, symmetric, no calibration); at accuracy level 4 each row's activations are
  quantized to int8 by themselves. Its dynamic `MatMulInteger` (quantize_dynamic), as fast,
  quantizes a call's activations with one scale: a row's output then moves with the other rows
  of the call (logits by 0.3 on a GPT-B step when the CFG partner row changed), so an image
  would depend on its batch-mates and a verified position on the drafts after it. ModelOpt's
  int8 QDQ graphs ran 6x slower than fp32 on onnxruntime CPU; MatMulNBits int8 runs faster
  than fp32 there (docs/guides/quantize.md has the numbers).
- NVIDIA Model Optimizer (`modelopt.onnx.quantization.quantize`): QDQ graphs for TensorRT
  (int8, fp8, int4 weight-only). Activation scales come from real feeds recorded on the
  bundle's own generations (engines/calibration.py). Installed by the `quant` extra, which
  leaves out ModelOpt's own `[onnx]` extra: that one pulls onnxruntime-gpu and cupy, and
  onnxruntime-gpu beside onnxruntime overwrites its module.

What stays float in every mode: the sampling head (every node downstream of the `mix` /
`uniforms` inputs: CFG, softmax, CumSum, the draw), the norms and the attention softmax
(neither tool touches them: only MatMul/Gemm/Conv weights are quantized, and ModelOpt's
attention-MatMul QDQ is disabled), and the graphs' I/O types (so the runtime and the
contract do not change). Losslessness is with respect to the graph that verifies: a
quantized draft changes only the speed; a quantized target is a new P
(docs/guides/quantize.md, "Which distribution is sampled").
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from specrt import validation
from specrt.bundle_dir import move_into_place, partial_dir, refuse_existing
from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.manifest import HEAD_INPUTS, MANIFEST_NAME, Manifest, file_record, read_manifest

MODES = ("int8", "fp8", "int4")
TOOLS = ("onnxruntime", "modelopt")
ORT_MODES = ("int4", "int8")  # onnxruntime's MatMulNBits, 4- or 8-bit weights
# weights per quantization block: 8-bit weights keep their precision over wider blocks, and
# MatMulNBits's int8 kernel ran a GPT-B step faster at 128 than at 32 on a 2-core EPYC
DEFAULT_BLOCK_SIZE = {"int4": 32, "int8": 128, "fp8": 32}
# the bundle backends (runtime/backends/bundle_backends.py) each tool's graphs are made for: on
# another backend they run, slower than the fp32 bundle they came from (backend_advice)
MADE_FOR = {("onnxruntime", "int4"): ("ort", "ort-cpu", "ort-cuda"), ("onnxruntime", "int8"): ("ort", "ort-cpu"),
            ("modelopt", "int4"): ("trt", "ort-trt"), ("modelopt", "int8"): ("trt", "ort-trt"),
            ("modelopt", "fp8"): ("trt", "ort-trt")}
ROLES = ("target", "draft")
GRAPH_KINDS = ("prefill", "step")  # what a model needs (a self-draft is made of these)
ROLE_KINDS = (*GRAPH_KINDS, "chain", "tree", "growth")  # what `--graphs target,draft` quantizes of a role: its draft chain and trees too
EXTERNAL_DATA_BYTES = (2 << 30) - (256 << 20)  # protobuf's 2 GB limit, with room for the graph itself
Progress = Callable[[str], None]


@dataclass(frozen=True)
class QuantizeOptions:
    """How graphs are quantized; each field is one `specrt quantize` flag.

    tool None is default_tool(mode). calibration_method None is the tool's default (modelopt:
    max for int8 / fp8, rtn_dq for int4 — awq_lite wrote graphs onnxruntime CPU refused).
    """

    mode: str
    tool: Optional[str] = None
    block_size: Optional[int] = None  # None: DEFAULT_BLOCK_SIZE of the mode
    accuracy_level: int = 4
    calibration_size: int = 32
    calibration_images: int = 4
    calibration_method: Optional[str] = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecrtError(f"unknown quantization mode {self.mode!r}; choose one of {', '.join(MODES)}")
        tool = self.tool or default_tool(self.mode)
        if tool not in TOOLS:
            raise SpecrtError(f"unknown quantization backend {tool!r}; choose one of {', '.join(TOOLS)}")
        if tool == "onnxruntime" and self.mode not in ORT_MODES:
            raise SpecrtError(f"onnxruntime's quantizers do {' and '.join(ORT_MODES)}; {self.mode} needs "
                              "--backend modelopt")
        object.__setattr__(self, "tool", tool)
        block = validation.integer("--block-size", self.block_size or DEFAULT_BLOCK_SIZE[self.mode], 16, 4096)
        if block & (block - 1):
            raise SpecrtError(f"--block-size must be a power of two >= 16, got {self.block_size}")
        object.__setattr__(self, "block_size", block)
        object.__setattr__(self, "accuracy_level", validation.integer("--accuracy-level", self.accuracy_level, 0, 4))
        object.__setattr__(self, "calibration_size", validation.count("--calibration-size", self.calibration_size))
        object.__setattr__(self, "calibration_images", validation.count("--calibration-images", self.calibration_images))
        object.__setattr__(self, "seed", validation.seed(self.seed, "--seed"))

    @property
    def calibrates(self) -> bool:
        """Whether this tool and mode read calibration feeds (onnxruntime's MatMulNBits is RTN
        weight-only, its activations quantized row by row on each call: none)."""
        return self.tool == "modelopt"


def default_tool(mode: str) -> str:
    """The quantizer whose graphs suit the runtime this machine has: onnxruntime for int4
    (MatMulNBits runs on onnxruntime CPU and CUDA) and for int8 on a CPU-only machine (ModelOpt's
    QDQ int8 ran 6x slower than fp32 on onnxruntime CPU); ModelOpt (QDQ for TensorRT) for fp8, and
    for int8 where TensorRT or a GPU provider of onnxruntime is installed."""
    if mode == "int4" or (mode == "int8" and not gpu_runtime_installed()):
        return "onnxruntime"
    return "modelopt"


def gpu_runtime_installed() -> bool:
    """TensorRT, or onnxruntime with its CUDA / TensorRT provider: a machine that runs bundles on a GPU."""
    from specrt.lazy import available

    if available("tensorrt"):
        return True
    if not available("onnxruntime"):
        return False
    import onnxruntime

    return bool({"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(onnxruntime.get_available_providers()))


def made_for(record: dict[str, Any]) -> tuple[str, ...]:
    """The bundle backends a graph's quantization record says it is made for (records written
    before `backends` was kept: from its tool and precision)."""
    return tuple(record.get("backends") or MADE_FOR.get((record.get("tool"), record.get("precision")), ()))


def backend_advice(raw: dict[str, Any], where: str | Path, backend: str) -> Optional[str]:
    """One line when the quantized graphs of a bundle (its manifest JSON `raw`, at `where`) are
    made for other backends than `backend`: they run there, slower than the fp32 bundle they came
    from (ModelOpt's int8 QDQ on onnxruntime CPU: 6x), and what to use instead. None when they
    suit it, when nothing is quantized, or for a backend no quantizer targets (torch)."""
    records = [g["quantization"] for g in raw.get("graphs", {}).values() if g.get("quantization")]
    known = {b for backends in MADE_FOR.values() for b in backends}
    record = next((r for r in records if backend not in made_for(r)), None)
    if record is None or backend not in known:
        return None
    precision, suited = record.get("precision"), made_for(record)
    instead = f"run it with --backend {' or '.join(suited)}" if suited else "run it on the backend it was made for"
    better = next((tool for tool in TOOLS if backend in MADE_FOR.get((tool, precision), ())), None)
    if better:
        instead += (f", or quantize its fp32 bundle for {backend}: specrt quantize FP32_BUNDLE --mode {precision} "
                    f"--backend {better}")
    return (f"warning: {where} holds {precision} graphs made by {record.get('tool', '?')} for "
            f"{', '.join(suited) or 'another backend'}; on --backend {backend} they run slower than the fp32 bundle "
            f"they came from: {instead}")


# ---- one graph ------------------------------------------------------------------------------

WEIGHT_OPS = ("MatMul", "Gemm", "Conv")


def _weight_layer(node: Any, constants: set[str]) -> bool:
    """A linear layer of the model: a MatMul / Gemm / Conv whose second operand is a stored weight."""
    return node.op_type in WEIGHT_OPS and len(node.input) > 1 and node.input[1] in constants


def head_node_names(model: Any) -> list[str]:
    """Names of the sampling head's nodes (downstream of `mix` / `uniforms`): kept in float.

    A chain, tree or growth graph runs the model again on the tokens its head drew, so those
    passes' linear layers are downstream of `mix` too; they are the model's weights, not the
    head (whose only MatMul weighs the CFG rows by `mix`), and are quantized like the first
    pass's. Without this a draft chain kept every later pass in float while its manifest said
    int8."""
    from specrt.engines.precision import downstream_nodes

    graph = model.graph
    sources = {i.name for i in graph.input if i.name in HEAD_INPUTS}
    constants = {t.name for t in graph.initializer}
    return [graph.node[i].name for i in sorted(downstream_nodes(graph, sources))
            if not _weight_layer(graph.node[i], constants)]


def fold_weight_transposes(model: Any) -> int:
    """Replace each Transpose of a stored weight by the transposed weight; returns how many.

    Both quantizers recognise a linear layer by a weight stored as an initializer. The step
    graphs have their weight transposes folded by the exporter; the fused chain, tree and
    growth graphs share one Transpose per weight between their passes and keep it, which
    hid every layer behind it from quantization (a draft chain came out unchanged)."""
    from onnx import numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    folded = []
    for node in graph.node:
        if node.op_type != "Transpose" or len(node.input) != 1 or node.input[0] not in weights:
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        array = numpy_helper.to_array(weights[node.input[0]], base_dir="")
        graph.initializer.append(numpy_helper.from_array(array.transpose(perm).copy(), node.output[0]))
        folded.append(node)
    for node in folded:
        graph.node.remove(node)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for tensor in [t for t in graph.initializer if t.name in {n.input[0] for n in folded} and t.name not in used]:
        graph.initializer.remove(tensor)
    return len(folded)


def _name_nodes(model: Any) -> None:
    """Give every node a unique name: both tools select and exclude nodes by name."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"specrt_node_{i}"
        seen.add(node.name)


def _quiet(*loggers: str) -> None:
    for name in loggers:
        logging.getLogger(name).setLevel(logging.WARNING)


def _matmul_nbits(model: Any, options: QuantizeOptions, exclude: list[str]) -> tuple[Any, dict[str, Any]]:
    """onnxruntime's MatMulNBits: int4 or int8 weights (options.mode), round-to-nearest per block."""
    ort = require("onnxruntime", f"specrt quantize --mode {options.mode}")
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    from onnxruntime.quantization.quant_utils import QuantFormat

    bits = int(options.mode.removeprefix("int"))
    _quiet("onnxruntime.quantization.matmul_nbits_quantizer", "onnxruntime.quantization")
    config = DefaultWeightOnlyQuantConfig(block_size=options.block_size, is_symmetric=True, bits=bits,
                                          accuracy_level=options.accuracy_level, quant_format=QuantFormat.QOperator)
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=options.block_size, is_symmetric=True,
                                     accuracy_level=options.accuracy_level, nodes_to_exclude=exclude,
                                     algo_config=config)
    quantizer.process()
    record = {"tool": "onnxruntime", "tool_version": ort.__version__,
              "algorithm": "MatMulNBits weight-only RTN, symmetric", "bits": bits, "block_size": options.block_size,
              "accuracy_level": options.accuracy_level}
    return quantizer.model.model, record


class _FeedReader:
    """onnxruntime's CalibrationDataReader protocol over recorded feeds (ModelOpt reads it)."""

    def __init__(self, feeds: list[dict]):
        self.feeds = feeds
        self.rewind()

    def get_next(self) -> Optional[dict]:
        return next(self._it, None)

    def get_first(self) -> dict:
        return self.feeds[0]

    def rewind(self) -> None:
        self._it = iter(self.feeds)


def require_modelopt(what: str) -> Any:
    """modelopt.onnx.quantization, or one line saying how to install it."""
    try:
        import modelopt.onnx.quantization as quantization
    except ImportError as exc:
        raise SpecrtError(f"{what} needs NVIDIA Model Optimizer, which is not installed or incomplete "
                          f"({str(exc).splitlines()[0]}): pip install 'specrt[quant]'") from exc
    return quantization


def _modelopt(model: Any, options: QuantizeOptions, exclude: list[str], feeds: list[dict],
              work: Path) -> tuple[Any, dict[str, Any]]:
    quantization = require_modelopt(f"--mode {options.mode} --backend modelopt")
    import re

    import modelopt
    import onnx

    if not feeds:
        raise SpecrtError("ModelOpt calibration recorded no feeds for this graph (raise --calibration-images)")
    method = options.calibration_method or ("rtn_dq" if options.mode == "int4" else "max")
    source, out = work / "source.onnx", work / "quantized.onnx"
    large = model.ByteSize() > EXTERNAL_DATA_BYTES
    onnx.save(model, str(source), save_as_external_data=large)
    kwargs: dict[str, Any] = {}
    if options.mode == "int4":
        kwargs["block_size"] = options.block_size
    try:
        quantization.quantize(
            str(source), quantize_mode=options.mode, calibration_method=method,
            calibration_data_reader=_FeedReader(feeds), calibration_eps=["cpu"],
            op_types_to_quantize=["MatMul", "Gemm", "Conv"], nodes_to_exclude=[re.escape(n) for n in exclude],
            high_precision_dtype="fp32", disable_mha_qdq=True, use_external_data_format=large,
            output_path=str(out), log_level="CRITICAL", **kwargs)  # it logs "no NVML" as an error on CPU
    except ImportError as exc:  # its int4 packing imports cppimport only when it runs
        raise SpecrtError(f"ModelOpt {options.mode} needs a package that is not installed "
                          f"({str(exc).splitlines()[0]}): pip install 'specrt[quant]'") from exc
    record = {"tool": "modelopt", "tool_version": modelopt.__version__, "algorithm": f"QDQ, calibration {method}",
              **({"block_size": options.block_size} if options.mode == "int4" else {})}
    return onnx.load(str(out)), record


def quantize_model(model: Any, options: QuantizeOptions, feeds: Sequence[dict] = (),
                   scratch: Optional[Path] = None) -> tuple[Any, dict[str, Any]]:
    """A quantized copy of an ONNX graph of the bundle and its manifest `quantization` record.

    The sampling head's nodes are excluded by name; `feeds` (input name -> array) calibrate
    ModelOpt's activation scales and are ignored by onnxruntime's MatMulNBits (weight-only RTN).
    """
    onnx = require("onnx", "specrt quantize")
    model = onnx.ModelProto.FromString(model.SerializeToString()) if model.ByteSize() < EXTERNAL_DATA_BYTES else model
    fold_weight_transposes(model)
    _name_nodes(model)
    exclude = head_node_names(model)
    if options.tool == "onnxruntime":
        quantized, record = _matmul_nbits(model, options, exclude)
    else:
        with tempfile.TemporaryDirectory(dir=scratch) as work:
            quantized, record = _modelopt(model, options, exclude, list(feeds), Path(work))
    return quantized, {"precision": options.mode, **record, "backends": list(MADE_FOR[options.tool, options.mode]),
                       "calibration_feeds": len(feeds) if options.calibrates else 0}


def _check_io(original: Any, quantized: Any, name: str) -> None:
    """The quantized graph keeps the original's I/O names and element types (the contract)."""
    def io(model: Any) -> list[tuple[str, int]]:
        return [(v.name, v.type.tensor_type.elem_type) for v in list(model.graph.input) + list(model.graph.output)]
    if io(original) != io(quantized):
        raise SpecrtError(f"quantizing {name} changed its inputs/outputs; this tool's output cannot replace it")


def _check_loads(path: Path) -> None:
    """onnxruntime CPU accepts the graph (ModelOpt's int4 awq_lite wrote graphs it refuses)."""
    ort = require("onnxruntime", "specrt quantize")
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise SpecrtError(f"onnxruntime refuses the quantized {path.name}: {str(exc).splitlines()[0]}") from exc


def _save(model: Any, path: Path) -> Optional[str]:
    """Write a graph; weights past protobuf's limit go to <file>.data beside it (returned)."""
    onnx = require("onnx", "specrt quantize")
    if model.ByteSize() < EXTERNAL_DATA_BYTES:
        path.write_bytes(model.SerializeToString())
        return None
    onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    return f"{path.name}.data"


# ---- a bundle -------------------------------------------------------------------------------

def selected_graphs(manifest: Manifest, names: Sequence[str]) -> list[str]:
    """Graph names for `names` (roles target / draft, or graph names such as target_step)."""
    chosen: list[str] = []
    absent = [name for name in names if name in ROLES
              and not any(f"{name}_{kind}" in manifest.graphs for kind in ROLE_KINDS)]
    for name in names:
        if name in ROLES:
            graphs = [f"{name}_{kind}" for kind in ROLE_KINDS if f"{name}_{kind}" in manifest.graphs]
            if not graphs and len(absent) < len(names):
                continue  # `--graphs target,draft` (the default) on a bundle without a draft: its target
            if not graphs:
                raise SpecrtError(f"bundle {manifest.root} has no {name} graphs (it has: {', '.join(manifest.graphs)})")
        elif name in manifest.graphs and manifest.graphs[name].role in ROLES:
            graphs = [name]
        else:
            raise SpecrtError(f"--graphs: no graph or role {name!r} to quantize in {manifest.root} "
                              f"(roles: {', '.join(ROLES)}; graphs: {', '.join(manifest.graphs)})")
        chosen += [g for g in graphs if g not in chosen]
    return chosen


def refuse_quantized(manifest: Manifest) -> None:
    """Quantizing a quantized bundle again compounds the error silently: start from fp32."""
    done = [name for name, spec in manifest.graphs.items() if spec.quantization]
    if done:
        raise SpecrtError(f"bundle {manifest.root} is already quantized ({', '.join(done)}); "
                          "quantize the fp32 bundle it came from")


def _plan(manifest: Manifest, graphs: Sequence[str], self_draft: bool) -> dict[str, str]:
    """Output graph name -> the source graph it is a quantized copy of."""
    if self_draft:
        missing = [f"target_{k}" for k in GRAPH_KINDS if f"target_{k}" not in manifest.graphs]
        if missing:
            raise SpecrtError(f"--self-draft needs the bundle's {', '.join(missing)}")
        return {f"draft_{k}": f"target_{k}" for k in GRAPH_KINDS}
    return {name: name for name in selected_graphs(manifest, graphs)}


def quantize_bundle(bundle: str | Path, out: str | Path, options: QuantizeOptions, graphs: Sequence[str] = ROLES,
                    self_draft: bool = False, force: bool = False, threads: Optional[int] = None,
                    progress: Optional[Progress] = None) -> Manifest:
    """Write `out`: `bundle` with the chosen graphs quantized, atomically (bundle_dir).

    self_draft: the target keeps its graphs and the output's draft is a quantized copy of the
    target (draft_prefill/draft_step from target_prefill/target_step, models.draft kind
    "self"); the bundle's own draft, if any, is left out. Returns the manifest read back.
    """
    say = progress or (lambda _msg: None)
    manifest = read_manifest(bundle)
    refuse_quantized(manifest)
    plan = _plan(manifest, graphs, self_draft)
    out = Path(out).absolute()
    if out == manifest.root.absolute():
        raise SpecrtError("--out must be a new directory, not the bundle being quantized")
    refuse_existing(out, force)
    if options.tool == "modelopt":
        require_modelopt(f"--mode {options.mode}")  # fail before minutes of calibration
    onnx = require("onnx", "specrt quantize")

    feeds: dict[str, list[dict]] = {}
    if options.calibrates:
        from specrt.engines.calibration import record_feeds

        say(f"recording calibration feeds: {options.calibration_images} generation(s), "
            f"up to {options.calibration_size} feeds per graph")
        feeds = record_feeds(manifest, options.calibration_size, options.calibration_images, options.seed,
                             threads, progress=say)

    replaced = set(plan)
    # a self-draft replaces the bundle's own draft: its other graphs (a draft chain) go with it
    dropped = {g for g, spec in manifest.graphs.items() if self_draft and spec.role == "draft" and g not in plan}
    raw = json.loads(json.dumps(manifest.raw))
    for name in dropped:
        del raw["graphs"][name]
    with partial_dir(out, note=progress) as work:
        for rel in manifest.files:
            owner = next((g for g, spec in manifest.graphs.items() if rel in (spec.file, spec.external_data)), None)
            if owner not in replaced and owner not in dropped:
                shutil.copy2(manifest.root / rel, work / rel)
        for i, (name, source) in enumerate(plan.items(), start=1):
            started = time.monotonic()
            say(f"[{i}/{len(plan)}] {name} <- {options.mode} {options.tool} of {source} ...")
            original = onnx.load(str(manifest.graph_path(source)))
            quantized, record = quantize_model(original, options, feeds.get(source, ()), scratch=work)
            _check_io(original, quantized, source)
            spec = replace(manifest.graph(source), name=name, role=name.split("_")[0], file=f"{name}.onnx",
                           quantization=record)
            external = _save(quantized, work / spec.file)
            spec = replace(spec, external_data=external)
            _check_loads(work / spec.file)
            raw["graphs"][name] = spec.to_json()
            size = sum((work / f).stat().st_size for f in (spec.file, external) if f)
            say(f"[{i}/{len(plan)}] {spec.file}  {size / 1e6:.1f} MB in {time.monotonic() - started:.1f} s")
        if self_draft:
            source_model = raw["models"]["target"]
            raw["models"]["draft"] = {**source_model, "kind": "self", "quantization": options.mode,
                                      "source": f"{source_model.get('source', 'target')} ({options.mode} self-draft)"}
        raw["graphs"] = {name: raw["graphs"][name] for name in _graph_order(manifest, raw["graphs"])}
        names = [f for g in raw["graphs"].values() for f in (g["file"], g.get("external_data")) if f]
        if manifest.neighbours:
            names.append(manifest.neighbours["file"])
        # every other file the bundle lists (a unified bundle's tokenizer.json, a t2i text encoder's
        # files) was copied above and stays listed, hashed, as it was
        graph_files = {f for g in manifest.graphs.values() for f in (g.file, g.external_data) if f}
        names += [rel for rel in manifest.files if rel not in graph_files and rel not in names]
        raw["files"] = {name: file_record(work / name) for name in names}
        raw["quantized_from"] = str(manifest.root)
        (work / MANIFEST_NAME).write_text(json.dumps(raw, indent=2) + "\n")
        read_manifest(work, partial_ok=True)  # never rename something we could not read back
        move_into_place(work, out, force)
    return read_manifest(out, check_hashes=False)


def _graph_order(manifest: Manifest, graphs: dict[str, Any]) -> list[str]:
    """The source bundle's order, then graphs new to it (a self-draft's when it had no draft)."""
    return [g for g in manifest.graphs if g in graphs] + [g for g in graphs if g not in manifest.graphs]
