"""`specrt inspect` for a LlamaGen-family bundle: its manifest as a human reads it (models,
sampling defaults, limits, graphs with their I/O and profiles)."""
from __future__ import annotations

from specrt.manifest import GraphSpec, Manifest


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _model_line(role: str, entry: dict) -> str:
    e = {key: entry.get(key, "?") for key in ("codebook_size", "codebook_embed_dim", "downsample", "image_size",
                                              "grid_size", "family", "model_type", "dim", "n_layer", "n_head",
                                              "n_kv_head", "head_dim", "vocab_size", "cond_len", "num_classes",
                                              "capacity")}
    if role == "vq":
        width = f"x{entry['codebook_embed_dim']}" if "codebook_embed_dim" in entry else ""
        return (f"  vq      codebook {e['codebook_size']}{width}, downsample "
                f"{e['downsample']}, image {e['image_size']}px, grid {e['grid_size']}")
    kind = f" ({entry['kind']})" if "kind" in entry else ""
    if entry.get("model_type") == "prompt":  # a unified-vocabulary model (its own lines follow the graphs)
        condition = f"{entry.get('architecture', '?')}, {entry.get('image_vocab', '?')} image codes"
    elif "num_classes" in entry:
        condition = f"classes {entry['num_classes']}"
    else:
        condition = f"caption_dim {entry.get('caption_dim', '?')}"
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
