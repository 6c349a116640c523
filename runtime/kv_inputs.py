"""How a graph takes the KV cache: one stacked `past_kv` input, or one keys and one values input per layer.

Why two forms: the contract's `past_kv` [n_layer, 2, batch, n_kv_head, cache_len, head_dim] is one
binding for every engine (TensorRT reads it in place), but onnxruntime's CPU provider copies what
it slices: a step graph over one stacked input splits it into layers and joins each layer's past
with the window's rows, three copies of the whole cache a step (about 12 ms of a GPT-B step on a
2-core CPU, at every precision). A step graph exported with per-layer inputs (`specrt export
--kv-inputs layers`) takes `past_key_<i>` and `past_value_<i>` [batch, n_kv_head, cache_len,
head_dim] instead, in that order where `past_kv` stood; the runtime keeps its one buffer and binds
each input over the view kv[i, 0] / kv[i, 1] of it, which is contiguous, so nothing is copied to
bind it either. The manifest's inputs say which form a graph has: bundles exported before it keep
`past_kv` and run as they did.
"""
from __future__ import annotations

from typing import Any

import numpy as np

STACKED = "past_kv"
LAYERS = "layers"  # `specrt export --kv-inputs` values
STACKED_FORM = "stacked"
FORMS = (LAYERS, STACKED_FORM)


def layer_names(n_layer: int) -> tuple[str, ...]:
    """The per-layer inputs in graph order: past_key_0, past_value_0, past_key_1, ..."""
    return tuple(f"past_{part}_{i}" for i in range(n_layer) for part in ("key", "value"))


def past_names(spec: Any) -> tuple[str, ...]:
    """The inputs through which graph `spec` (a manifest GraphSpec) reads the cache: ("past_kv",) or
    its per-layer inputs (none for a graph that reads no cache, a prefill)."""
    names = spec.input_names
    if STACKED in names:
        return (STACKED,)
    return tuple(n for n in names if is_layer_name(n))


def is_layer_name(name: str) -> bool:
    """`name` is a per-layer past input (past_key_<i> or past_value_<i>)."""
    for prefix in ("past_key_", "past_value_"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return True
    return False


def takes_layers(spec: Any) -> bool:
    """Graph `spec` reads the cache through per-layer inputs."""
    return STACKED not in spec.input_names and any(is_layer_name(n) for n in spec.input_names)


def past_dtype(spec: Any) -> str:
    """The cache's dtype as graph `spec` reads it."""
    return spec.input(past_names(spec)[0]).dtype


def past_feeds(spec: Any, kv: Any) -> dict[str, Any]:
    """The cache inputs of graph `spec` for a stacked cache `kv` [L, 2, B, Hkv, C, D] (numpy or
    torch): {"past_kv": kv}, or each layer's keys kv[i, 0] and values kv[i, 1] (views, no copy)."""
    if not takes_layers(spec):
        return {STACKED: kv}
    return {name: kv[int(name.rsplit("_", 1)[1]), 0 if name.startswith("past_key_") else 1]
            for name in past_names(spec)}


def stacked_shape(spec: Any, level: str, **overrides: int) -> tuple[int, ...]:
    """The stacked cache [L, 2, B, Hkv, C, D] graph `spec` reads, at profile level `level` (its
    past_kv's shape, or its per-layer inputs' with the layer and key/value axes in front)."""
    names = past_names(spec)
    if not takes_layers(spec):
        return spec.shape_at(spec.input(STACKED), level, **overrides)
    return (len(names) // 2, 2, *spec.shape_at(spec.input(names[0]), level, **overrides))


def stacked_feed(feeds: dict[str, Any]) -> Any:
    """The stacked cache [L, 2, ...] (numpy) of a feed dict: its past_kv, or its per-layer keys and
    values stacked (a draft chain's past_kv made from its draft's recorded step feeds)."""
    if STACKED in feeds:
        return feeds[STACKED]
    layers = sum(1 for name in feeds if is_layer_name(name)) // 2
    return np.stack([np.stack([feeds[f"past_key_{i}"], feeds[f"past_value_{i}"]]) for i in range(layers)])
