"""Static checks of a bundle's graphs against what TensorRT 10.3 (JetPack 6) can build.

An error is something that makes the TensorRT build fail or breaks the runtime's contract
(an unsupported op, opset > 20, a graph I/O that disagrees with the manifest, a dynamic dim
without a profile, int64 where the runtime binds int32). A warning is legal but against our
deployment policy or likely slow (If/Loop control flow is an error by policy: the default
export promises none). A note marks a graph made for onnxruntime on purpose: its own ops
(domain com.microsoft, e.g. MatMulNBits from `specrt quantize --mode int4` or `--mode int8
--backend onnxruntime`) run on onnxruntime, not TensorRT; `specrt inspect` says the bundle is onnxruntime-only and fails only with
--require-trt. Only the graph structure is read, never the weights, so linting a multi-GB
bundle is fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from specrt.export import trt_ops
from specrt.lazy import require
from specrt.manifest import UNBUILT_KINDS, GraphSpec, Manifest

ERROR, WARNING, NOTE = "error", "warning", "note"
ONNXRUNTIME_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops
_ONNX_DTYPE_NAMES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64", 16: "bfloat16"}


@dataclass(frozen=True)
class Finding:
    severity: str  # ERROR | WARNING | NOTE (onnxruntime-only, see the module docstring)
    graph: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.graph}: {self.message}"


def _walk_nodes(graph) -> Iterator:
    """Every node, including those inside If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _walk_nodes(attr.g)
            for sub in attr.graphs:
                yield from _walk_nodes(sub)


def _opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _check_ops(model, name: str, max_opset: int) -> list[Finding]:
    findings = []
    opset = _opset(model)
    if opset > max_opset:
        findings.append(Finding(ERROR, name, f"opset {opset} > {max_opset}, the newest TensorRT {trt_ops.TRT_VERSION} parses"))
    local_functions = {(f.domain, f.name) for f in model.functions}
    counts: dict[tuple[str, str], int] = {}
    for node in _walk_nodes(model.graph):
        key = (node.domain or "", node.op_type)
        counts[key] = counts.get(key, 0) + 1
        if node.op_type in trt_ops.RESTRICTED_AXES_INPUT:
            findings += _check_constant_input(model, node, name)
        if node.op_type == "ScatterND" and any(a.name == "reduction" and a.s not in (b"", b"none") for a in node.attribute):
            findings.append(Finding(ERROR, name, f"ScatterND node {node.name!r} uses a reduction, which TensorRT does not support"))
    for (domain, op), count in sorted(counts.items()):
        where = f"{op} ({count} node{'s' * (count > 1)})"
        if (domain, op) in local_functions:
            findings.append(Finding(WARNING, name, f"{where} is a local ONNX function; TensorRT inlines it, check its body ops"))
        elif domain == ONNXRUNTIME_DOMAIN:
            how = ("for TensorRT quantize the fp32 bundle with `specrt quantize --backend modelopt` (QDQ)"
                   if op == "MatMulNBits" else "TensorRT would need a plugin for it")
            findings.append(Finding(NOTE, name, f"{where} is onnxruntime's own op ({domain}): this graph runs on "
                                                f"onnxruntime (ort, ort-cuda), not TensorRT; {how}"))
        elif domain not in ("", "ai.onnx"):
            findings.append(Finding(ERROR, name, f"{where} is in custom domain {domain!r}; TensorRT needs a plugin for it"))
        elif op in trt_ops.CONTROL_FLOW_OPS:
            findings.append(Finding(ERROR, name, f"{where}: control flow; the default export must have no If/Loop/Scan"))
        elif op in trt_ops.NEWER_STACK_OPS:
            # Linting for a newer stack (max_opset >= 23) downgrades these to a reminder.
            severity = WARNING if max_opset >= 23 else ERROR
            findings.append(Finding(severity, name, f"{where} is not in TensorRT {trt_ops.TRT_VERSION}'s ONNX parser; "
                                                    f"needs {trt_ops.NEWER_STACK_OPS[op]}"))
        elif op not in trt_ops.SUPPORTED_OPS:
            findings.append(Finding(ERROR, name, f"{where} is not supported by TensorRT {trt_ops.TRT_VERSION}'s ONNX parser"))
    return findings


def _check_constant_input(model, node, name: str) -> list[Finding]:
    """TensorRT wants e.g. Squeeze/Unsqueeze/Reduce* axes and Slice's axes as build-time constants."""
    index = trt_ops.RESTRICTED_AXES_INPUT[node.op_type]
    if len(node.input) <= index or not node.input[index]:
        return []
    tensor = node.input[index]
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    if tensor in constants:
        return []
    return [Finding(WARNING, name, f"{node.op_type} node {node.name!r}: input {index} ({tensor}) is computed at run "
                                   "time; TensorRT needs it as an initializer (fold constants first)")]


def _value_signature(value) -> tuple[str, tuple]:
    ttype = value.type.tensor_type
    dims = tuple(d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else None) for d in ttype.shape.dim)
    return _ONNX_DTYPE_NAMES.get(ttype.elem_type, f"onnx-type-{ttype.elem_type}"), dims


def _check_io(model, spec: GraphSpec) -> list[Finding]:
    """Graph I/O must match the manifest; int64 inputs and dims without a profile are errors."""
    findings = []
    initializers = {i.name for i in model.graph.initializer}
    for kind, values, specs in (("input", [v for v in model.graph.input if v.name not in initializers], spec.inputs),
                                ("output", list(model.graph.output), spec.outputs)):
        by_name = {s.name: s for s in specs}
        listed = [v.name for v in values]
        for missing in [s.name for s in specs if s.name not in listed]:
            findings.append(Finding(ERROR, spec.name, f"manifest {kind} {missing!r} is not in the graph"))
        for value in values:
            dtype, dims = _value_signature(value)
            if kind == "input" and dtype == "int64":
                findings.append(Finding(ERROR, spec.name, f"input {value.name} is int64; TensorRT and the runtime bind int32"))
            if value.name not in by_name:
                findings.append(Finding(ERROR, spec.name, f"graph {kind} {value.name!r} is not in the manifest"))
                continue
            want = by_name[value.name]
            if dtype != want.dtype:
                findings.append(Finding(ERROR, spec.name, f"{kind} {value.name} is {dtype}, manifest says {want.dtype}"))
            if len(dims) != len(want.shape) or any(isinstance(w, int) and d != w for d, w in zip(dims, want.shape)):
                findings.append(Finding(ERROR, spec.name, f"{kind} {value.name} has dims {list(dims)}, manifest says {list(want.shape)}"))
            for d in dims:
                if d is None:
                    findings.append(Finding(ERROR, spec.name, f"{kind} {value.name} has an unnamed dynamic dim"))
                elif isinstance(d, str) and d not in spec.profile:
                    findings.append(Finding(ERROR, spec.name, f"{kind} {value.name}: dynamic dim {d!r} has no optimization profile"))
    return findings


def lint_graph(path: Path, spec: GraphSpec, max_opset: int = trt_ops.MAX_OPSET) -> list[Finding]:
    """All findings for one ONNX file described by `spec` (structure only; weights not loaded);
    for a kind TensorRT never builds (manifest.UNBUILT_KINDS), its agreement with the manifest only."""
    onnx = require("onnx", "graph linting")
    model = onnx.load(str(path), load_external_data=False)
    ops = _check_ops(model, spec.name, max_opset) if spec.kind not in UNBUILT_KINDS else []
    return ops + _check_io(model, spec)


def lint_neighbours(manifest: Manifest) -> list[Finding]:
    """LANTERN's table must be int32 [vocab, k], in range, and never list a token as its own neighbour."""
    import numpy as np

    if manifest.neighbours is None:
        return [Finding(WARNING, "neighbours", "bundle has no neighbour table; LANTERN cannot run on it")]
    vocab, k = manifest.models["target"]["vocab_size"], manifest.neighbours["k"]
    try:
        table = np.load(manifest.neighbours_path, allow_pickle=False)
    except ValueError as exc:
        return [Finding(ERROR, "neighbours", f"{manifest.neighbours['file']} is not a plain .npy array: {exc}")]
    if table.dtype != np.int32 or table.shape != (vocab, k):
        return [Finding(ERROR, "neighbours", f"table is {table.dtype} {list(table.shape)}, expected int32 [{vocab}, {k}]")]
    findings = []
    if table.size and (table.min() < 0 or table.max() >= vocab):
        findings.append(Finding(ERROR, "neighbours", f"token ids outside 0..{vocab - 1}"))
    if (table == np.arange(vocab)[:, None]).any():
        findings.append(Finding(ERROR, "neighbours", "some tokens are listed as their own neighbour"))
    return findings


def lint_bundle(manifest: Manifest, max_opset: int = trt_ops.MAX_OPSET) -> list[Finding]:
    """Findings for every graph of a (read, verified) bundle, in manifest order, then the neighbour table."""
    findings = []
    for name, spec in manifest.graphs.items():
        findings += lint_graph(manifest.root / spec.file, spec, max_opset)
    return findings + lint_neighbours(manifest)
