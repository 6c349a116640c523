"""The KV cache forms a transformer layer attends over, and the loop that runs the layers over them.

Why two forms: an exported graph (ONNX, TensorRT) takes the cache as an explicit input and hands
the window's new keys/values back as an output ("present"), so the caller can commit only the
accepted ones (docs/contracts.md); attention then joins the cache and the window's rows in one
concatenation. On the PyTorch backend that concatenation copied each layer's whole cache every
step (0.9 ms of a 5 ms GPT-XL step on an H100). A decode step there writes the window's rows in
place instead, into scratch columns of the one preallocated buffer (`StaticCache`), and attends
over the buffer's columns as they lie, under the same mask: what the step hands back as
"present" is a view of those scratch columns, and a commit copies the accepted ones down, as it
did from the concatenated output. The mask, positions and commit rules do not change.

The device round (runtime/rounds) needs one more form: each image sits at its own length, and the
round cannot ask the host where, so a step there writes each row's window keys/values straight to
the columns of their positions (`ColumnCache`, an index_put_ by a device index; rejected rows are simply
overwritten by a later round), and attends over the whole buffer under a mask made on the device.

Every model with this trunk (LlamaGen's GPT, the unified-vocabulary LM, an EAGLE head, the
continuous family's MAR transformer) runs its layers through `run_layers`, so one design serves
all of them.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F

from specrt.models import window_attention


class CacheWrite(NamedTuple):
    """One layer's keys (or values) [B, Hkv, S, D] of a static cache that the step writes in place:
    the window's W rows go to columns [start, start + W), and attention reads columns [0, width),
    width being the mask's last dimension (C + W, with start = C)."""

    cache: torch.Tensor
    start: int

    def written(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """Write the window's rows [B, Hkv, W, D] in place; the columns attention reads, as a view."""
        self.cache[:, :, self.start:self.start + rows.shape[2]].copy_(rows)
        return self.cache[:, :, :width]


class StaticCache(NamedTuple):
    """A whole model's static KV buffer [L, 2, B, Hkv, S, D] with its scratch columns from `start`
    (the runner's capacity C; S ≥ C + the widest window): the step writes each layer's window rows
    there and attends over columns [0, C + W) under the step's mask [B, W, C + W]."""

    buffer: torch.Tensor
    start: int

    def layer(self, index: int) -> tuple[CacheWrite, CacheWrite]:
        return CacheWrite(self.buffer[index, 0], self.start), CacheWrite(self.buffer[index, 1], self.start)

    def window(self, width: int) -> torch.Tensor:
        """The window's rows as written, [L, 2, B, Hkv, W, D]: a view, valid until the next step."""
        return self.buffer[:, :, :, :, self.start:self.start + width]


class ColumnWrite(NamedTuple):
    """One layer's keys (or values) [B, Hkv, S, D] written at per-row columns: `columns` [B, W] says
    where each row's W window rows go; attention reads all S columns, under the step's mask [B, W, S]."""

    cache: torch.Tensor
    columns: torch.Tensor

    def written(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """Put the window's rows [B, Hkv, W, D] at their columns in place; the columns attention reads.
        An index_put_, not a scatter_: compiled, inductor writes an index_put_ into the cache where it
        lies, where a scatter_ into a graph input became a copy of the whole cache every layer."""
        batch, heads = rows.shape[:2]
        row = torch.arange(batch, device=rows.device)[:, None, None]
        head = torch.arange(heads, device=rows.device)[None, :, None]
        self.cache.index_put_((row, head, self.columns[:, None, :]), rows)
        return self.cache[:, :, :width]


class ColumnCache(NamedTuple):
    """A whole model's KV buffer [L, 2, B, Hkv, S, D] written at per-row columns [B, W] (ColumnWrite).
    Nothing is handed back as "present": the rows already sit where a commit would put them."""

    buffer: torch.Tensor
    columns: torch.Tensor

    def layer(self, index: int) -> tuple[ColumnWrite, ColumnWrite]:
        return ColumnWrite(self.buffer[index, 0], self.columns), ColumnWrite(self.buffer[index, 1], self.columns)

    def window(self, width: int) -> None:
        return None


class SplitCache(NamedTuple):
    """A whole model's past keys and values as two tensors [L, B, Hkv, C, D], the form the continuous
    family's step graphs take and hand back (past_k / past_v, present_k / present_v): layer i's
    are keys[i] and values[i], joined with the window's rows like a [L, 2, ...] tensor's."""

    keys: torch.Tensor
    values: torch.Tensor

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]


class ApartPast(NamedTuple):
    """One layer's past keys (or values) [B, Hkv, C, D] that attention reads beside the window's
    rows instead of joining them (`attend_apart`)."""

    rows: torch.Tensor


class LayerInputs(NamedTuple):
    """A whole model's past as one keys and one values tensor [B, Hkv, C, D] per layer, each a
    graph input of its own (an onnxruntime step graph with per-layer KV inputs: specrt.runtime.kv_inputs).

    Why: a graph that takes the cache as one [L, 2, ...] input splits it into layers, and
    onnxruntime's CPU Split, Transpose and Concat copy what they touch: the whole cache three
    times a step (12 ms of a 27 ms int8 GPT-B step). Per-layer inputs bound over views of the
    runtime's one buffer, read only by the attention's two matrix products, copy nothing."""

    keys: tuple
    values: tuple

    def layer(self, index: int) -> tuple[ApartPast, ApartPast]:
        return ApartPast(self.keys[index]), ApartPast(self.values[index])


# What attention reads as a layer's past: nothing, a tensor [B, Hkv, C, D], a tuple of such
# segments (a draft chain's cache and the rows it drafted so far: runtime/chain.py KVSegments),
# or a static cache written in place.
LayerPast = Union[None, torch.Tensor, tuple, CacheWrite, ColumnWrite, ApartPast]
Cache = Any  # None, a [L, 2, B, Hkv, C, D] tensor, a SplitCache, KVSegments, a StaticCache, a ColumnCache or LayerInputs
LayerCall = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def call_layer(layer: torch.nn.Module, *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """layer(*args): the eager way to run a layer (a runner passes a compiled one instead)."""
    return layer(*args)


def run_layers(layers: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Optional[torch.Tensor],
               cache: Cache, run_layer: Optional[LayerCall] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer over h [B, W, dim] against `cache`: (h, present [L, 2, B, Hkv, W, D]).

    `run_layer(layer, h, cos, sin, past_k, past_v, mask)` runs one layer (default: eagerly);
    the PyTorch backend passes one compiled function that every layer of a model shares.
    present is stacked from the layers' outputs, or, over a StaticCache, the view of the
    scratch columns they were written to (no copy)."""
    run_layer = run_layer or call_layer
    in_place = isinstance(cache, (StaticCache, ColumnCache))
    if (in_place or isinstance(cache, LayerInputs)) and mask is not None and mask.dtype == torch.bool:
        mask = additive_mask(mask, h.dtype)  # once a step, not once a layer inside attention
    present = []
    for index, layer in enumerate(layers):
        past_k, past_v = layer_past(cache, index)
        h, k, v = run_layer(layer, h, cos, sin, past_k, past_v, mask)
        if not in_place:
            present.append(torch.stack([k, v]))
    return h, cache.window(h.shape[1]) if in_place else torch.stack(present)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive one attention builds from it (0 where allowed, −inf
    elsewhere): the same numbers, made once for every layer (on a GPU, once a layer was one more
    kernel a layer)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def layer_past(cache: Cache, index: int) -> tuple[LayerPast, LayerPast]:
    """Layer `index`'s keys and values in whatever form `cache` holds them."""
    if cache is None:
        return None, None
    if isinstance(cache, (StaticCache, ColumnCache, SplitCache, LayerInputs)):
        return cache.layer(index)
    return cache[index, 0], cache[index, 1]


def _repeat_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    """[B,Hkv,T,D] -> [B,H,T,D], each kv head repeated consecutively (repeat_interleave)."""
    if rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, rep, t, d).reshape(b, h * rep, t, d)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: LayerPast, past_v: LayerPast,
           mask: Optional[torch.Tensor], triton_kernel: bool = False) -> torch.Tensor:
    """Attention of q [B,H,W,D] over the cache and the window's k/v [B,Hkv,W,D] (GQA heads
    repeated), mask bool [B,1,W,C+W] or None (causal): [B,H,W,D].

    A static cache (CacheWrite, ColumnWrite) takes the window's rows in place and is read as it lies
    (with `triton_kernel`, through models.window_attention where the step's rows fit it); a tensor
    or a tuple of segments is joined with the window's rows in one concatenation."""
    if isinstance(past_k, ApartPast):
        return attend_apart(q, k, v, past_k.rows, past_v.rows, mask)
    if isinstance(past_k, (CacheWrite, ColumnWrite)):
        width = mask.shape[-1]
        keys, values = past_k.written(k, width), past_v.written(v, width)
        if triton_kernel and window_attention.fits(q, keys, mask):
            return window_attention.window_attention(q, keys, values, mask)
    else:
        keys = k if past_k is None else torch.cat([*_segments(past_k), k], dim=2)
        values = v if past_v is None else torch.cat([*_segments(past_v), v], dim=2)
    rep = q.shape[1] // k.shape[1]
    keys, values = _repeat_kv(keys, rep), _repeat_kv(values, rep)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None)


def attend_apart(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
    """attend()'s result over past keys/values [B,Hkv,C,D] and the window's [B,Hkv,W,D] without
    joining them: the scores of both ([B,H,W,C] and [B,H,W,W], small) are joined instead, and the
    probabilities multiply each part's values. mask: additive [B,1,W,C+W] (or bool, True = seen).

    Why: the past is read only by two matrix products, so an exported graph copies none of it
    (no Concat, no Transpose the exporter's decomposition of scaled_dot_product_attention writes
    for the keys, no repeat of GQA heads: the query heads of one key head are stacked as rows)."""
    batch, heads, width, dim = q.shape
    kv_heads, cache = k.shape[1], past_k.shape[2]
    rep = heads // kv_heads
    grouped = (q * dim ** -0.5).reshape(batch, kv_heads, rep * width, dim)  # head kv·rep + r: _repeat_kv's order
    scores = torch.cat([grouped @ past_k.transpose(-1, -2), grouped @ k.transpose(-1, -2)], dim=-1)
    scores = scores.reshape(batch, heads, width, cache + width)
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = scores.softmax(-1).reshape(batch, kv_heads, rep * width, cache + width)
    out = probs[..., :cache] @ past_v + probs[..., cache:] @ v
    return out.reshape(batch, heads, width, dim)


def _segments(past: Union[torch.Tensor, tuple]) -> tuple:
    return past if isinstance(past, tuple) else (past,)
