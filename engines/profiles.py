"""TensorRT optimization profiles derived from a bundle manifest, validated before any build.

A TensorRT build with a bad profile fails minutes in with a message about a layer; a graph
whose `total_len` is not `cache_len + window` builds fine and then refuses every real step.
So the manifest's symbolic dims are turned into per-input min/opt/max shapes here and
checked against the ONNX graph's own dims first, with every finding in one clear error.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from specrt.errors import SpecrtError

LEVELS = ("min", "opt", "max")


@dataclass(frozen=True)
class DimRange:
    """The min/opt/max values one symbolic dim takes across the engine's optimization profile."""

    min: int
    opt: int
    max: int

    def at(self, level: str) -> int:
        return getattr(self, level)


@dataclass(frozen=True)
class InputProfile:
    """min/opt/max shapes of one graph input; `dynamic` is False when every dim is a fixed number."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]
    dynamic: bool

    def shape(self, level: str) -> tuple[int, ...]:
        return getattr(self, level)


@dataclass(frozen=True)
class GraphProfile:
    """One optimization profile of one graph: the dim ranges and the input shapes they give."""

    graph: str
    dims: dict[str, DimRange]
    inputs: tuple[InputProfile, ...]

    @property
    def dynamic_inputs(self) -> tuple[InputProfile, ...]:
        """Inputs TensorRT needs a profile for (static ones need none)."""
        return tuple(i for i in self.inputs if i.dynamic)

    def to_json(self) -> dict[str, Any]:
        """Canonical, JSON-ready form (used in engine cache keys)."""
        return {i.name: {level: list(i.shape(level)) for level in LEVELS} for i in self.inputs}


def dim_ranges(graph: str, spec: dict[str, Any], max_window: int | None = None) -> dict[str, DimRange]:
    """Parse the manifest's `profile` for `graph` and apply a `--max-window` override.

    The override lowers window's max (and its opt when needed) and moves total_len with it
    at every level, so the engine is built for smaller windows and needs less memory.
    """
    raw = spec.get("profile")
    if not isinstance(raw, dict):
        raise SpecrtError(f"graph {graph!r}: manifest has no 'profile' for its symbolic dims")
    findings = []
    ranges: dict[str, DimRange] = {}
    for dim, levels in raw.items():
        try:
            values = [levels[level] for level in LEVELS]
        except (KeyError, TypeError):
            findings.append(f"profile of {dim!r} needs min, opt and max")
            continue
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            findings.append(f"profile of {dim!r} must be positive integers, got {values}")
        elif not values[0] <= values[1] <= values[2]:
            findings.append(f"profile of {dim!r} must have min <= opt <= max, got {values}")
        else:
            ranges[dim] = DimRange(*values)
    _raise_findings(graph, findings)
    _check_total_len(graph, ranges)
    if max_window is not None:
        ranges = _shrink_window(graph, ranges, max_window)
    return ranges


def _shrink_window(graph: str, ranges: dict[str, DimRange], max_window: int) -> dict[str, DimRange]:
    if "window" not in ranges:
        return ranges  # prefill and vq_decode graphs have no window: nothing to shrink
    window = ranges["window"]
    if not window.min <= max_window <= window.max:
        raise SpecrtError(
            f"graph {graph!r}: --max-window {max_window} is outside the exported window range "
            f"{window.min}..{window.max} (re-export for larger windows)")
    out = dict(ranges)
    out["window"] = DimRange(window.min, min(window.opt, max_window), max_window)
    if "total_len" in ranges and "cache_len" in ranges:
        cache = ranges["cache_len"]
        out["total_len"] = DimRange(*(cache.at(level) + out["window"].at(level) for level in LEVELS))
    return out


def _check_total_len(graph: str, ranges: dict[str, DimRange]) -> None:
    if not {"total_len", "cache_len", "window"} <= set(ranges):
        return
    bad = [f"{level}: {ranges['total_len'].at(level)} != {ranges['cache_len'].at(level)} + {ranges['window'].at(level)}"
           for level in LEVELS
           if ranges["total_len"].at(level) != ranges["cache_len"].at(level) + ranges["window"].at(level)]
    if bad:
        _raise_findings(graph, [f"profile must have total_len = cache_len + window ({'; '.join(bad)})"])


def derive_profile(graph: str, spec: dict[str, Any], max_window: int | None = None) -> GraphProfile:
    """Per-input min/opt/max shapes for `graph` from its manifest entry (inputs + profile)."""
    ranges = dim_ranges(graph, spec, max_window)
    findings = []
    inputs = []
    for item in spec.get("inputs", []):
        name, shape = item.get("name"), item.get("shape")
        if not isinstance(name, str) or not isinstance(shape, list):
            findings.append(f"manifest input {item!r} needs a name and a shape list")
            continue
        missing = [d for d in shape if isinstance(d, str) and d not in ranges]
        if missing:
            findings.append(f"input {name!r} uses dim(s) {', '.join(missing)} that have no profile")
            continue
        per_level = {level: tuple(d if isinstance(d, int) else ranges[d].at(level) for d in shape) for level in LEVELS}
        dynamic = any(isinstance(d, str) for d in shape)
        inputs.append(InputProfile(name, per_level["min"], per_level["opt"], per_level["max"], dynamic))
    if not inputs and not findings:
        findings.append("manifest lists no inputs")
    _raise_findings(graph, findings)
    return GraphProfile(graph=graph, dims=ranges, inputs=tuple(inputs))


def onnx_input_dims(onnx_path: str | Path) -> dict[str, list[int | str | None]]:
    """Graph inputs of an ONNX file as {name: [int | dim_param | None]}, without loading weights."""
    from specrt.lazy import require

    onnx = require("onnx", "checking a graph's dims before building")
    model = onnx.load(str(onnx_path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    dims = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue  # old-style graphs list weights as inputs; they are not fed
        shape = value.type.tensor_type.shape
        dims[value.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]
    return dims


def validate_against_onnx(profile: GraphProfile, spec: dict[str, Any], onnx_dims: dict[str, list[int | str | None]]) -> None:
    """Check the manifest's inputs and profile against the ONNX graph's declared dims.

    Every dynamic ONNX dim must be a profiled symbol in the manifest (one ONNX dim_param
    always mapping to the same manifest symbol), every static dim must match, and each
    input must exist on both sides. Raises one SpecrtError listing every finding.
    """
    findings = []
    declared = {item["name"]: item["shape"] for item in spec.get("inputs", [])}
    for name in onnx_dims:
        if name not in declared:
            findings.append(f"ONNX input {name!r} is not in the manifest (it would have no profile)")
    for name in declared:
        if name not in onnx_dims:
            findings.append(f"manifest input {name!r} is not an input of the ONNX graph")
    symbol_of: dict[str, str] = {}
    for name, onnx_shape in onnx_dims.items():
        shape = declared.get(name)
        if shape is None:
            continue
        if len(shape) != len(onnx_shape):
            findings.append(f"input {name!r} has rank {len(onnx_shape)} in ONNX but {len(shape)} in the manifest")
            continue
        for axis, (onnx_dim, dim) in enumerate(zip(onnx_shape, shape)):
            where = f"input {name!r} axis {axis}"
            if isinstance(onnx_dim, int):
                if isinstance(dim, int) and dim != onnx_dim:
                    findings.append(f"{where} is {onnx_dim} in ONNX but {dim} in the manifest")
                elif isinstance(dim, str):
                    r = profile.dims[dim]
                    if not r.min == r.max == onnx_dim:
                        findings.append(f"{where} is static {onnx_dim} in ONNX but {dim!r} ranges {r.min}..{r.max}")
            elif isinstance(dim, int):
                findings.append(f"{where} is dynamic ({onnx_dim or '?'}) in ONNX but has no profile (manifest says {dim})")
            elif onnx_dim is not None:
                if symbol_of.setdefault(onnx_dim, dim) != dim:
                    findings.append(f"{where}: ONNX dim {onnx_dim!r} is {symbol_of[onnx_dim]!r} elsewhere but {dim!r} here")
    _raise_findings(profile.graph, findings)


def _raise_findings(graph: str, findings: Iterable[str]) -> None:
    findings = list(findings)
    if findings:
        raise SpecrtError(f"graph {graph!r}: " + "; ".join(findings))
