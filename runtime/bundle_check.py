"""Cross-checks a bundle before anything runs: manifest vs itself, vs its graphs, vs neighbours.npy.

Why: read_manifest proves the files are the ones the manifest lists (sizes, sha256) and that
its structure parses; it does not prove the numbers agree. A manifest whose n_layer, vocab or
head_dim disagrees with its graphs would otherwise fail deep inside onnxruntime with a
traceback, or worse, run and produce a wrong image. Every mismatch here is one SpecrtError
line naming both values. numpy only (the runtime imports without torch or onnx): the graphs'
own I/O comes from the onnxruntime sessions the runtime creates anyway (`check_session`).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.manifest import GraphSpec, Manifest, TensorSpec, rows_for_images
from specrt.runtime.kv_inputs import layer_names, past_names, takes_layers

MODEL_INTS = ("vocab_size", "grid_size", "n_layer", "n_kv_head", "head_dim", "capacity")
CONDITION_INT = {"c2i": "num_classes", "t2i": "caption_dim", "prompt": "image_vocab"}  # what a model is conditioned on
# (a token-prompt model's: its head's image codes; unified-vocabulary models, docs/contracts.md)
VQ_INTS = ("codebook_size", "downsample", "grid_size")
# onnxruntime's type strings -> the manifest's numpy dtype names
ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
              "tensor(double)": "float64",
              "tensor(int32)": "int32", "tensor(int64)": "int64", "tensor(bool)": "bool"}


def _entry(manifest: Manifest, role: str) -> dict[str, Any]:
    entry = manifest.models.get(role)
    if not isinstance(entry, dict):
        raise SpecrtError(f"manifest: models.{role} is missing or not an object (got {entry!r:.60})")
    return entry


def model_numbers(manifest: Manifest, role: str) -> dict[str, int]:
    """The integer facts of models.<role>, each checked to be a positive integer."""
    entry = _entry(manifest, role)
    model_type = "c2i"
    if role != "vq" and "model_type" in entry:
        model_type = validation.choice(f"manifest models.{role}.model_type", entry["model_type"],
                                       ("c2i", "t2i", "prompt"))
    keys = VQ_INTS if role == "vq" else (*MODEL_INTS, CONDITION_INT[model_type])
    numbers = {key: validation.integer(f"manifest models.{role}.{key}", entry.get(key), low=1, strings=False) for key in keys}
    if role == "vq":  # a non-square grid names its columns (unified-vocabulary models)
        numbers["grid_cols"] = validation.integer("manifest models.vq.grid_cols", entry.get("grid_cols", numbers["grid_size"]),
                                                  low=1, strings=False)
    if role != "vq":
        numbers["cond_len"] = validation.integer(f"manifest models.{role}.cond_len", entry.get("cond_len", 1), low=1,
                                                strings=False)
        for key in ("dim", "n_head", "stream_len", "grid_cols"):  # optional: checked where present
            if key in entry:
                numbers[key] = validation.integer(f"manifest models.{role}.{key}", entry[key], low=1, strings=False)
        if "null_class" in entry and entry["null_class"] != numbers.get("num_classes"):
            raise SpecrtError(f"manifest: models.{role}.null_class is {entry['null_class']!r} but the contract's "
                              f"null class is num_classes = {numbers['num_classes']}")
    return numbers


def _expect(graph: GraphSpec, tensor: TensorSpec, axis: int, want: Any, source: str) -> None:
    """Axis `axis` of `tensor` must be `want` (an int fact of the manifest, or a symbolic dim name)."""
    if len(tensor.shape) <= axis:
        raise SpecrtError(f"bundle: graph {graph.name} {tensor.name} has rank {len(tensor.shape)}, "
                          f"the contract needs axis {axis} ({source})")
    have = tensor.shape[axis]
    if have != want:
        raise SpecrtError(f"bundle: graph {graph.name} {tensor.name} axis {axis} is {have!r} but {source} is {want!r}")


def _check_model_graphs(manifest: Manifest, role: str, facts: dict[str, int], limits: dict[str, int],
                        kinds: tuple[str, ...] = ("prefill", "step")) -> None:
    vocab, layers, heads, head_dim = facts["vocab_size"], facts["n_layer"], facts["n_kv_head"], facts["head_dim"]
    for kind in kinds:
        graph = manifest.graphs.get(f"{role}_{kind}")
        if graph is None:
            raise SpecrtError(f"bundle: models.{role} has no graph {role}_{kind}")
        src = f"models.{role}"
        window = "window" if kind == "step" else 1
        for name in ("logits", "probs"):
            _expect(graph, graph.output(name), 2, vocab, f"{src}.vocab_size")
        _expect(graph, graph.output("probs"), 1, window, "the contract's window")
        if "hidden" in graph.output_names and "dim" in facts:
            _expect(graph, graph.output("hidden"), 2, facts["dim"], f"{src}.dim")
        present = graph.output("present_kv")
        kv_axes = [(0, layers, f"{src}.n_layer"), (1, 2, "the contract's key/value axis"),
                   (3, heads, f"{src}.n_kv_head"), (5, head_dim, f"{src}.head_dim")]
        for axis, want, source in kv_axes:
            _expect(graph, present, axis, want, source)
        if kind == "prefill":
            _expect(graph, present, 4, facts["cond_len"], f"{src}.cond_len")
            if "caption_dim" in facts:
                _expect(graph, graph.input("captions"), 1, facts["cond_len"], f"{src}.cond_len")
                _expect(graph, graph.input("captions"), 2, facts["caption_dim"], f"{src}.caption_dim")
            continue
        if takes_layers(graph):  # per-layer keys and values [batch, Hkv, cache_len, D] (runtime.kv_inputs)
            names = past_names(graph)
            if set(names) != set(layer_names(layers)):
                raise SpecrtError(f"bundle: graph {graph.name} has {len(names)} per-layer KV inputs but {src}.n_layer "
                                  f"is {layers} (past_key_<i> and past_value_<i> for each)")
            for name in names:
                for axis, want, source in ((1, heads, f"{src}.n_kv_head"), (2, "cache_len", "the contract's cache axis"),
                                           (3, head_dim, f"{src}.head_dim")):
                    _expect(graph, graph.input(name), axis, want, source)
        else:
            for axis, want, source in kv_axes + [(4, "cache_len", "the contract's cache axis")]:
                _expect(graph, graph.input("past_kv"), axis, want, source)
        profile = graph.profile
        if profile.get("cache_len", {}).get("max") != facts["capacity"]:
            raise SpecrtError(f"bundle: graph {graph.name} profile cache_len max is "
                              f"{profile.get('cache_len', {}).get('max')!r} but {src}.capacity is {facts['capacity']}")
        if profile.get("window", {}).get("max", 0) < limits["max_window"]:
            raise SpecrtError(f"bundle: graph {graph.name} profile window max is {profile.get('window', {}).get('max')!r} "
                              f"but limits.max_window is {limits['max_window']}")
    stream = facts.get("stream_len", facts["grid_size"] ** 2)
    needed = facts["cond_len"] + stream + limits["max_window"]
    if facts["capacity"] < needed:
        raise SpecrtError(f"bundle: models.{role}.capacity is {facts['capacity']} but cond_len + image tokens "
                          f"({stream}) + max_window is {needed}")
    for kind in kinds:
        batch = manifest.graphs[f"{role}_{kind}"].profile.get("batch", {}).get("max", 0)
        if batch < limits["max_batch"]:
            raise SpecrtError(f"bundle: graph {role}_{kind} profile batch max is {batch!r} "
                              f"but limits.max_batch is {limits['max_batch']}")


def _check_eagle(manifest: Manifest, target: dict[str, int], head: dict[str, int]) -> None:
    """An EAGLE head (models.draft.kind `eagle`, docs/contracts.md) reads the target's features:
    the target's graphs must output `hidden`, and the head's `hidden` input and `features`
    output must be the target's dim."""
    if head.get("dim") != target.get("dim"):
        raise SpecrtError(f"bundle: models.draft.dim is {head.get('dim')} but an EAGLE head needs the target's dim "
                          f"{target.get('dim')}")
    for name in ("target_prefill", "target_step"):
        if "hidden" not in manifest.graph(name).output_names:
            raise SpecrtError(f"bundle: graph {name} has no hidden output, which the EAGLE draft reads "
                              "(re-export without --no-hidden)")
    step = manifest.graph("draft_step")
    for tensor in (step.input("hidden"), step.output("features")):
        _expect(step, tensor, 2, target["dim"], "models.target.dim")


def _check_decoder(manifest: Manifest, target: dict[str, int], limits: dict[str, int]) -> None:
    """models.vq and vq_decode against the target (its codes and grid) and the limits."""
    vq = model_numbers(manifest, "vq")
    codes = target.get("image_vocab", target["vocab_size"])  # a unified model's head adds structural tokens
    if vq["codebook_size"] != codes:
        key = "image_vocab" if "image_vocab" in target else "vocab_size"
        raise SpecrtError(f"bundle: models.vq.codebook_size is {vq['codebook_size']} "
                          f"but models.target.{key} is {codes}")
    for key in ("grid_size", "grid_cols"):
        want = target.get(key, target["grid_size"])
        if vq[key] != want:
            raise SpecrtError(f"bundle: models.vq.{key} is {vq[key]} but models.target.{key} is {want}")
    decode = manifest.graph("vq_decode")
    _expect(decode, decode.input("codes"), 1, vq["grid_size"], "models.vq.grid_size")
    _expect(decode, decode.input("codes"), 2, vq["grid_cols"], "models.vq.grid_cols")
    image = decode.output("image")
    _expect(decode, image, 1, 3, "the contract's RGB axis")
    _expect(decode, image, 2, vq["grid_size"] * vq["downsample"], "models.vq.grid_size × downsample")
    _expect(decode, image, 3, vq["grid_cols"] * vq["downsample"], "models.vq.grid_cols × downsample")
    if decode.profile.get("batch", {}).get("max", 0) < limits["max_batch"]:
        raise SpecrtError(f"bundle: graph vq_decode profile batch max is {decode.profile.get('batch', {}).get('max')!r} "
                          f"but limits.max_batch is {limits['max_batch']}")


def check_manifest(manifest: Manifest) -> dict[str, int]:
    """The manifest against itself: positive integer facts, graphs' fixed dims equal to them,
    draft and VQ agreeing with the target, profiles covering the limits, valid sampling defaults.
    Returns the limits (max_window, max_batch, max_images) as checked ints."""
    from specrt.runtime.sampling import SamplingParams

    limits = {key: validation.integer(f"manifest limits.{key}", manifest.limits.get(key), low=1, strings=False)
              for key in ("max_window", "max_batch")}
    # images per pass (`export --max-batch`); bundles written before it existed: max_batch rows hold
    # that many CFG pairs
    images = manifest.limits.get("max_images", max(1, limits["max_batch"] // rows_for_images(1)))
    limits["max_images"] = validation.integer("manifest limits.max_images", images, low=1,
                                              high=limits["max_batch"], strings=False)
    target = model_numbers(manifest, "target")
    _check_model_graphs(manifest, "target", target, limits)
    if "draft_step" in manifest.graphs or "draft_prefill" in manifest.graphs:
        draft = model_numbers(manifest, "draft")
        for key in ("vocab_size", "grid_size", "num_classes", "caption_dim", "cond_len", "image_vocab", "stream_len"):
            if draft.get(key) != target.get(key):
                raise SpecrtError(f"bundle: models.draft.{key} is {draft.get(key)} but models.target.{key} is "
                                  f"{target.get(key)}")
        eagle = manifest.models["draft"].get("kind") == "eagle"
        _check_model_graphs(manifest, "draft", draft, limits, ("step",) if eagle else ("prefill", "step"))
        if eagle:
            _check_eagle(manifest, target, draft)
    tokens_only = manifest.models["target"].get("family") == "unified" and "vq" not in manifest.models \
        and "vq_decode" not in manifest.graphs  # a unified bundle exported without its decoder
    if not tokens_only:
        _check_decoder(manifest, target, limits)
    defaults = manifest.sampling_defaults
    unknown = sorted(set(defaults) - {"cfg_scale", "temperature", "top_k", "top_p"})
    if unknown:
        raise SpecrtError(f"manifest: sampling_defaults has unknown key {unknown[0]!r}")
    try:
        SamplingParams(**defaults)
    except SpecrtError as exc:
        raise SpecrtError(f"manifest sampling_defaults: {exc}") from None
    return limits


def check_session(spec: GraphSpec, session: Any, file_name: Optional[str] = None) -> None:
    """The manifest's entry for a graph against the graph itself, as onnxruntime loaded it:
    the same input and output names, dtypes and ranks, and equal dims wherever both are fixed
    (a dim the manifest names while the graph fixes it is a mismatch too)."""
    where = file_name or spec.file
    for what, declared, actual in (("input", spec.inputs, session.get_inputs()),
                                   ("output", spec.outputs, session.get_outputs())):
        graph = {arg.name: arg for arg in actual}
        names = [t.name for t in declared]
        if what == "input" and sorted(graph) != sorted(names):
            raise SpecrtError(f"bundle: graph {spec.name} manifest inputs are {names} but {where} has {list(graph)}")
        for tensor in declared:
            arg = graph.get(tensor.name)
            if arg is None:
                raise SpecrtError(f"bundle: graph {spec.name} manifest output {tensor.name!r} is not an output of "
                                  f"{where} (it has {list(graph)})")
            dtype = ORT_DTYPES.get(arg.type, arg.type)
            if dtype != tensor.dtype:
                raise SpecrtError(f"bundle: graph {spec.name} {what} {tensor.name} is {tensor.dtype} in the manifest "
                                  f"but {dtype} in {where}")
            shape = list(arg.shape)
            if len(shape) != len(tensor.shape):
                raise SpecrtError(f"bundle: graph {spec.name} {what} {tensor.name} has shape {list(tensor.shape)} in the "
                                  f"manifest but {shape} in {where}")
            for axis, (declared_dim, graph_dim) in enumerate(zip(tensor.shape, shape)):
                # onnxruntime reports a fixed dim as an int, a named one as its name, an unnamed one as None
                if graph_dim is not None and graph_dim != declared_dim:
                    raise SpecrtError(f"bundle: graph {spec.name} {what} {tensor.name} axis {axis} is {declared_dim!r} "
                                      f"in the manifest but {graph_dim} in {where}")


def load_neighbours(manifest: Manifest, vocab_size: int) -> Optional[np.ndarray]:
    """LANTERN's neighbour table, checked: int32 [vocab, k] with k as the manifest says, every
    entry a token id other than its row's own. None when the bundle has none."""
    info = manifest.neighbours
    if info is None:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("file"), str):
        raise SpecrtError(f"manifest: neighbours must be an object with a file name, got {info!r:.60}")
    path = manifest.root / info["file"]
    try:
        table = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise SpecrtError(f"bundle: cannot read {info['file']} as a .npy array ({type(exc).__name__})") from None
    k = validation.integer("manifest neighbours.k", info.get("k", table.shape[-1] if table.ndim else 0), low=1,
                           strings=False)
    if table.dtype != np.int32 or table.ndim != 2 or table.shape != (vocab_size, k):
        raise SpecrtError(f"bundle: {info['file']} is {table.dtype} {list(table.shape)} but the manifest needs int32 "
                          f"[{vocab_size}, {k}] (vocab_size, neighbours.k)")
    if table.size and (table.min() < 0 or table.max() >= vocab_size):
        raise SpecrtError(f"bundle: {info['file']} holds token ids in [{table.min()}, {table.max()}] "
                          f"but the vocabulary is [0, {vocab_size - 1}]")
    if (table == np.arange(vocab_size, dtype=np.int32)[:, None]).any():
        raise SpecrtError(f"bundle: {info['file']} lists a token as its own neighbour (the contract excludes it)")
    return table
