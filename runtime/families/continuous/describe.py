"""`specrt inspect` for a continuous bundle: its manifest as a human reads it, after checks.

The checks are what opening the bundle needs, made without running a model: every model config
parses into a runtime spec, target and draft agree on what they model, every file the manifest
names is there, and each ONNX graph declares the inputs and outputs the manifest's io lists name
(read from the graph itself with onnx, when it is installed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.errors import SpecrtError
from specrt.runtime.families.continuous.bundle import ContinuousManifest, model_spec


def describe_bundle(manifest: ContinuousManifest) -> str:
    """The checked manifest as `specrt inspect` prints it, after the checks above (one line if one fails)."""
    path, raw, models = manifest.root, manifest.raw, manifest.models
    lines = [f"bundle {path}  (continuous v{raw.get('format_version', '?')}, opset {raw.get('opset', '?')}, "
             f"source {raw.get('source', '?')})", "models:"]
    specs = {}
    for role, entry in models.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
            raise SpecrtError(f"{path / 'manifest.json'}: models.{role} needs a 'config' object")
        spec = specs[role] = model_spec(entry["config"])
        config = entry["config"]
        lines.append(f"  {role:<7} continuous: dim {spec.hidden}, {spec.n_layer} layers, {spec.n_head} heads x "
                     f"{spec.head_dim}, {spec.seq_len} tokens of {spec.token_dim} channels, classes "
                     f"{spec.num_classes}, diffusion head {config.get('head_width', '?')}x{config.get('head_depth', '?')}"
                     f" ({spec.diffusion_steps} {spec.schedule} steps)")
        _check_files(path, role, entry, ("step", "head", "weights"))
    if "draft" in specs:
        target, draft = specs["target"], specs["draft"]
        for key in ("token_dim", "seq_len", "num_classes", "diffusion_steps", "schedule"):
            if getattr(target, key) != getattr(draft, key):
                raise SpecrtError(f"{path}: target and draft disagree on {key} "
                                  f"({getattr(target, key)} vs {getattr(draft, key)})")
    decoder = raw.get("decoder")
    if isinstance(decoder, dict):
        _check_files(path, "decoder", decoder, ("graph", "weights"))
        lines.append(f"  decoder tokens -> {decoder.get('image_size', '?')}px images ({decoder.get('graph')})")
    else:
        lines.append("  decoder none: generate gives tokens only")
    if raw.get("sampling_defaults"):
        lines.append("sampling defaults (generate's flags override them): "
                     + ", ".join(f"{k} {v}" for k, v in raw["sampling_defaults"].items()))
    lines.append("methods: ar" + (", cspd (target + draft)" if "draft" in specs else " (no draft: cspd needs one)"))
    lines.append("graphs:")
    lines += _graph_lines(path, raw)
    return "\n".join(lines)


def _check_files(path: Path, role: str, entry: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        name = entry.get(key)
        if not isinstance(name, str) or not (path / name).is_file():
            raise SpecrtError(f"bundle {path} lacks {name or '(unnamed)'} ({role} {key})")


def _graph_lines(path: Path, raw: dict[str, Any]) -> list[str]:
    """Each graph with the I/O the manifest promises, checked against the graph's own."""
    wanted = []
    for role, entry in raw["models"].items():
        wanted.append((entry["step"], raw.get("step_io")))
        wanted.append((entry["head"], raw.get("head_io")))
    if isinstance(raw.get("decoder"), dict):
        wanted.append((raw["decoder"]["graph"], raw["decoder"].get("io")))
    try:
        import onnx
    except ImportError:  # the runtime needs no onnx: list the files, check nothing deeper
        return [f"  {name}  ({(path / name).stat().st_size / 1e6:.1f} MB; I/O not checked: onnx not installed)"
                for name, _ in wanted]
    lines = []
    for name, io in wanted:
        graph = onnx.load(str(path / name), load_external_data=False).graph
        inputs = [t.name for t in graph.input]
        outputs = [t.name for t in graph.output]
        if isinstance(io, list) and len(io) == 2:
            missing = [n for n in io[0] if n not in inputs] + [n for n in io[1] if n not in outputs]
            if missing:
                raise SpecrtError(f"{path / name} lacks {', '.join(missing)}, which the manifest's io names")
        lines.append(f"  {name}  ({(path / name).stat().st_size / 1e6:.1f} MB)  in {', '.join(inputs)}  "
                     f"out {', '.join(outputs)}")
    return lines
