"""`specrt inspect BUNDLE`: print a bundle's manifest readably and lint its graphs for TensorRT.

Exit code 0 when the lint finds no errors (warnings allowed), 1 when it finds errors, 2 for
a bundle that cannot be read (SpecrtError: missing files, bad hashes, wrong version). A bundle
made for onnxruntime on purpose (its int4 MatMulNBits graphs) runs here: its TensorRT findings
are notes, it is reported as onnxruntime-only and exits 0, unless --require-trt makes them errors.
"""
from __future__ import annotations

from pathlib import Path

import click

from specrt.manifest import GraphSpec, Manifest, read_manifest


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _model_line(role: str, entry: dict) -> str:
    e = {key: entry.get(key, "?") for key in ("codebook_size", "codebook_embed_dim", "downsample", "image_size",
                                              "grid_size", "family", "model_type", "dim", "n_layer", "n_head",
                                              "n_kv_head", "head_dim", "vocab_size", "cond_len", "num_classes",
                                              "capacity")}
    if role == "vq":
        return (f"  vq      codebook {e['codebook_size']}x{e['codebook_embed_dim']}, downsample "
                f"{e['downsample']}, image {e['image_size']}px, grid {e['grid_size']}")
    kind = f" ({entry['kind']})" if "kind" in entry else ""
    condition = f"classes {e['num_classes']}" if "num_classes" in e else f"caption_dim {e.get('caption_dim')}"
    return (f"  {role:<7} {e['family']} {e['model_type']}{kind}: dim {e['dim']}, {e['n_layer']} layers, "
            f"{e['n_head']} heads ({e['n_kv_head']} kv) x {e['head_dim']}, vocab {e['vocab_size']}, "
            f"grid {e['grid_size']}, cond_len {e['cond_len']}, {condition}, "
            f"KV capacity {e['capacity']}")


def _graph_lines(manifest: Manifest, spec: GraphSpec) -> list[str]:
    size = sum(manifest.files[f]["bytes"] for f in (spec.file, spec.external_data) if f)
    external = f" + {spec.external_data}" if spec.external_data else ""
    lines = [f"  {spec.name}  ({spec.file}{external}, {size / 1e6:.1f} MB, opset {spec.opset})"]
    width = max(len(t.name) for t in spec.inputs + spec.outputs)
    lines += [f"    in   {t.name:<{width}}  {t.dtype:<8} {_dims(t.shape)}" for t in spec.inputs]
    lines += [f"    out  {t.name:<{width}}  {t.dtype:<8} {_dims(t.shape)}" for t in spec.outputs]
    profile = "  ".join(f"{d} {p['min']}/{p['opt']}/{p['max']}" for d, p in spec.profile.items())
    lines.append(f"    profile (min/opt/max)  {profile}")
    if spec.quantization:
        lines.append(f"    precision  {_quantization(spec.quantization)}")
    return lines


def _quantization(record: dict) -> str:
    """One line for a graph's `quantization` record (written by `specrt quantize`)."""
    settings = ", ".join(f"{key.replace('_', ' ')} {record[key]}" for key in ("block_size", "accuracy_level")
                         if key in record)
    return (f"{record.get('precision', '?')} by {record.get('tool', '?')} {record.get('tool_version', '')}"
            f" ({record.get('algorithm', '?')}{', ' + settings if settings else ''}); "
            f"calibration: {record.get('calibration_feeds', 0)} feeds")


def format_manifest(manifest: Manifest) -> str:
    """The manifest as a human reads it: models, sampling defaults, limits, graphs with I/O and profiles."""
    raw = manifest.raw
    lines = [f"bundle {manifest.root}  ({raw['format']} v{raw['version']}, {raw.get('created_by', '?')})", "models:"]
    lines += [_model_line(role, entry) for role, entry in manifest.models.items()]
    sources = {role: e.get("source") for role, e in manifest.models.items() if e.get("source")}
    if sources:
        lines.append("  sources: " + ", ".join(f"{r} = {s}" for r, s in sources.items()))
    if manifest.sampling_defaults:
        lines.append("sampling defaults (generate's flags override them): "
                     + ", ".join(f"{k} {v}" for k, v in manifest.sampling_defaults.items()))
    if manifest.limits:
        notes = {"max_images": " (images per pass: export --max-batch)", "max_batch": " (model rows: 2 per image for CFG)"}
        lines.append("limits: " + ", ".join(f"{k} {v}{notes.get(k, '')}" for k, v in manifest.limits.items()))
    if manifest.neighbours:
        n = manifest.neighbours
        lines.append(f"neighbours: {n['file']} (k = {n.get('k', '?')}, {n.get('metric', '?')})")
    lines.append("graphs:")
    for spec in manifest.graphs.values():
        lines += _graph_lines(manifest, spec)
    return "\n".join(lines)


@click.command(name="inspect")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--lint/--no-lint", default=True, show_default=True, help="Check the graphs against TensorRT 10.3's ONNX parser.")
@click.option("--max-opset", type=int, default=20, show_default=True,
              help="Newest opset the target TensorRT parses (20 for TensorRT 10.3; raise it for newer stacks).")
@click.option("--require-trt", is_flag=True,
              help="The bundle must build on TensorRT: onnxruntime-only graphs (int4 MatMulNBits) are errors too.")
@click.pass_context
def command(ctx: click.Context, bundle: Path, lint: bool, max_opset: int, require_trt: bool) -> None:
    """Print a bundle's manifest and lint its graphs for TensorRT (exit 1 on lint errors; an
    onnxruntime-only bundle, e.g. int4 MatMulNBits, is a note unless --require-trt)."""
    from specrt.runtime.bundle_check import check_manifest

    manifest = read_manifest(bundle)
    check_manifest(manifest)  # the numbers agree with each other (runtime/bundle_check.py), or one line
    click.echo(format_manifest(manifest))
    if not lint:
        return
    from specrt.export.lint import ERROR, NOTE, WARNING, lint_bundle
    from specrt.export.trt_ops import TRT_VERSION

    findings = lint_bundle(manifest, max_opset=max_opset)
    count = {severity: sum(f.severity == severity for f in findings) for severity in (ERROR, WARNING, NOTE)}
    notes = f", {count[NOTE]} note(s)" if count[NOTE] else ""
    click.echo(f"lint (TensorRT {TRT_VERSION}, opset <= {max_opset}): {count[ERROR]} error(s), "
               f"{count[WARNING]} warning(s){notes}")
    for finding in findings:
        click.echo(f"  {finding}")
    ort_only = list(dict.fromkeys(f.graph for f in findings if f.severity == NOTE))
    if ort_only:
        click.echo(f"runs on: onnxruntime only (ort, ort-cuda); TensorRT {TRT_VERSION} cannot build "
                   f"{', '.join(ort_only)}{' (--require-trt: an error)' if require_trt else ''}")
    if count[ERROR] or (require_trt and ort_only):
        ctx.exit(1)
