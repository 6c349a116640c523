"""trtexec command lines equivalent to `specrt build`, for building on a Jetson.

JetPack ships TensorRT and its own trtexec but often not TensorRT's Python bindings for the
Python you want, and engines must be built on the device that runs them. So the bundle
(ONNX + manifest) is shipped, and these lines build the engines there. Generating them
needs no TensorRT: only the manifest (and onnx, for converted graphs on TensorRT 11).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from specrt.errors import SpecrtError

from .profiles import LEVELS, GraphProfile

TRTEXEC_ENGINE_DIR = "engines/trtexec"  # relative to the bundle; engines built by trtexec land here
_UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from '4G', '512M', '1.5G', '4096' (a plain number is MiB, as in trtexec)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), flags=re.IGNORECASE)
    if not match:
        raise SpecrtError(f"cannot read size {text!r}: use a number with K, M or G (e.g. 4G); a plain number is MiB")
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size <= 0:
        raise SpecrtError(f"size {text!r} must be positive")
    return size


def shapes_arg(profile: GraphProfile, level: str) -> str:
    """'name:1x4,other:2x3x5' for the dynamic inputs at one profile level (trtexec and onnxruntime's TensorRT EP syntax)."""
    return ",".join(f"{i.name}:{'x'.join(str(d) for d in i.shape(level))}" for i in profile.dynamic_inputs)


@dataclass(frozen=True)
class TrtexecLine:
    """One graph's trtexec invocation, paths relative to the bundle directory."""

    graph: str
    argv: tuple[str, ...]
    note: str = ""

    def __str__(self) -> str:
        return shlex.join(self.argv)


def trtexec_line(graph: str, onnx_file: str, profile: GraphProfile, precision: str, strongly_typed: bool,
                 workspace_bytes: int, engine_file: str, timing_cache_file: str) -> TrtexecLine:
    """The trtexec argv that builds `graph` like `specrt build` would.

    On TensorRT 10 fp16/bf16 is the --fp16/--bf16 flag over the fp32 graph; on strongly
    typed TensorRT 11 `onnx_file` must already be the converted graph and precision comes
    from its types (--stronglyTyped, no precision flag).
    """
    argv = ["trtexec", f"--onnx={onnx_file}"]
    if profile.dynamic_inputs:
        argv += [f"--{level}Shapes={shapes_arg(profile, level)}" for level in LEVELS]
    note = ""
    if strongly_typed:
        argv.append("--stronglyTyped")
        if precision != "fp32":
            note = f"{onnx_file} is the {precision} conversion (norms and softmax kept fp32)"
    elif precision != "fp32":
        argv.append(f"--{precision}")
    argv += [f"--memPoolSize=workspace:{max(1, workspace_bytes >> 20)}",  # MiB: the unit every trtexec reads
             f"--timingCacheFile={timing_cache_file}", f"--saveEngine={engine_file}", "--skipInference"]
    return TrtexecLine(graph, tuple(argv), note)


def format_script(bundle: str | Path, lines: list[TrtexecLine], header: list[str] | None = None) -> str:
    """A shell script: cd into the bundle, make the engine folder, one trtexec line per graph."""
    out = [f"# {h}" for h in header or []]
    out += [f"cd {shlex.quote(str(bundle))}", f"mkdir -p {TRTEXEC_ENGINE_DIR}"]
    for line in lines:
        out.append(f"# {line.graph}" + (f": {line.note}" if line.note else ""))
        out.append(" \\\n    ".join(shlex.quote(a) for a in line.argv))
    return "\n".join(out)


def trtexec_script(bundle: str | Path, precision: str = "fp32", workspace_bytes: int = 4 << 30,
                   max_window: int | None = None, trt_major: int = 10, graphs: list[str] | None = None) -> str:
    """The shell script that builds every graph of `bundle` with trtexec (see `format_script`).

    Profiles are validated exactly as for `specrt build` (against the ONNX dims when onnx is
    installed). For TensorRT 11 with fp16/bf16 the converted graphs are written into the
    bundle (engines/converted/) and the lines point at them — ship the bundle after this.
    """
    from specrt.lazy import available

    from .build import CONVERTED_DIR
    from .bundle import graph_entries
    from .precision import validate_precision, write_converted
    from .profiles import derive_profile, onnx_input_dims, validate_against_onnx

    validate_precision(precision)
    strongly_typed = trt_major >= 11
    checked = available("onnx")
    lines = []
    for entry in graph_entries(bundle, graphs):
        profile = derive_profile(entry.name, entry.spec, max_window)
        if checked:
            validate_against_onnx(profile, entry.spec, onnx_input_dims(entry.onnx_path))
        onnx_file = entry.spec["file"]
        if strongly_typed and precision != "fp32":
            converted = write_converted(entry.onnx_path, entry.onnx_sha256, precision, Path(bundle) / CONVERTED_DIR)
            onnx_file = converted.relative_to(bundle).as_posix()
        lines.append(trtexec_line(entry.name, onnx_file, profile, precision, strongly_typed, workspace_bytes,
                                  f"{TRTEXEC_ENGINE_DIR}/{entry.name}.{precision}.engine",
                                  f"{TRTEXEC_ENGINE_DIR}/timing.cache"))
    header = [f"trtexec lines for TensorRT {trt_major}.x, {precision}: run them on the GPU that will run the engines",
              "profiles checked against the ONNX graphs" if checked else "ONNX dims not checked (onnx not installed)"]
    return format_script(bundle, lines, header)
