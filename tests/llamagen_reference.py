"""An independent, deliberately plain re-implementation of LlamaGen's GPT forward pass.

Written from LlamaGen's published behaviour, not from specrt's module: it works straight
from a LlamaGen-layout state_dict, builds RoPE with complex numbers from explicit loops,
keeps its own per-layer KV cache indexed by `input_pos` with one full causal mask (as
LlamaGen's `setup_caches` / `generate` do), and writes attention as explicit softmax. The
tests compare specrt's export-friendly model against it.
"""
import math

import torch
import torch.nn.functional as F


def llamagen_gpt_shapes(dim: int, n_layer: int, n_head: int, n_kv_head: int, vocab_size: int,
                        model_type: str = "c2i", num_classes: int = 1000, caption_dim: int = 2048,
                        cond_len: int = 120) -> dict[str, tuple[int, ...]]:
    """Every key and shape of a LlamaGen GPT state_dict (LlamaGen's FFN sizing rule)."""
    head_dim = dim // n_head
    hidden = int(2 * 4 * dim / 3)
    hidden = hidden if hidden % 256 == 0 else hidden + 256 - hidden % 256
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (vocab_size, dim)}
    if model_type == "c2i":
        shapes["cls_embedding.embedding_table.weight"] = (num_classes + 1, dim)
    else:
        shapes["cls_embedding.uncond_embedding"] = (cond_len, caption_dim)
        shapes["cls_embedding.cap_proj.fc1.weight"] = (dim, caption_dim)
        shapes["cls_embedding.cap_proj.fc2.weight"] = (dim, dim)
    for i in range(n_layer):
        p = f"layers.{i}."
        shapes[p + "attention.wqkv.weight"] = ((n_head + 2 * n_kv_head) * head_dim, dim)
        shapes[p + "attention.wo.weight"] = (dim, dim)
        shapes[p + "feed_forward.w1.weight"] = (hidden, dim)
        shapes[p + "feed_forward.w3.weight"] = (hidden, dim)
        shapes[p + "feed_forward.w2.weight"] = (dim, hidden)
        shapes[p + "attention_norm.weight"] = (dim,)
        shapes[p + "ffn_norm.weight"] = (dim,)
    shapes["norm.weight"] = (dim,)
    shapes["output.weight"] = (vocab_size, dim)
    return shapes


def random_state_dict(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights scaled so activations stay O(1) through every layer (not LlamaGen's
    tiny init, which would make every distribution nearly uniform and the test weak)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in shapes.items():
        if len(shape) == 1:  # norm weights
            state[key] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif "embedding" in key:
            state[key] = torch.randn(shape, generator=gen)
        else:
            state[key] = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
    return state


def rope_2d_complex(grid: int, head_dim: int, cond_len: int, base: float = 10000.0) -> torch.Tensor:
    """complex64 [cond_len + grid*grid, head_dim//2]; condition rows are 0 (not 1!) as in LlamaGen."""
    quarter = head_dim // 4
    table = torch.zeros(cond_len + grid * grid, head_dim // 2, dtype=torch.complex64)
    for i in range(grid):
        for j in range(grid):
            for m in range(quarter):
                freq = 1.0 / (base ** (2 * m / (head_dim // 2)))
                for slot, coord in ((m, i), (quarter + m, j)):
                    angle = coord * freq
                    table[cond_len + i * grid + j, slot] = complex(math.cos(angle), math.sin(angle))
    return table


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x [B,T,H,D] real, freqs [T,D/2] complex: multiply interleaved pairs as complex numbers."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * freqs[None, :, None, :]).flatten(-2)


class ReferenceLlamaGen:
    """LlamaGen's Transformer.forward in inference mode, cache and mask handled as in generate()."""

    def __init__(self, state: dict[str, torch.Tensor], n_head: int, n_kv_head: int, grid: int, cond_len: int,
                 eps: float = 1e-5, base: float = 10000.0):
        self.w = {k: v.float() for k, v in state.items()}
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.dim = self.w["tok_embeddings.weight"].shape[1]
        self.head_dim = self.dim // n_head
        self.n_layer = len({k.split(".")[1] for k in self.w if k.startswith("layers.")})
        self.cond_len, self.eps = cond_len, eps
        self.freqs = rope_2d_complex(grid, self.head_dim, cond_len, base)
        self.t2i = "cls_embedding.cap_proj.fc1.weight" in self.w

    def setup_caches(self, batch: int, max_len: int, emb_masks: torch.Tensor = None) -> None:
        """Zeroed caches and the full causal mask, with caption padding hidden as in generate()."""
        self.k_cache = [torch.zeros(batch, self.n_kv_head, max_len, self.head_dim) for _ in range(self.n_layer)]
        self.v_cache = [torch.zeros(batch, self.n_kv_head, max_len, self.head_dim) for _ in range(self.n_layer)]
        mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))[None].repeat(batch, 1, 1)
        if emb_masks is not None:
            mask[:, :, : self.cond_len] &= emb_masks.bool()[:, None, :]
            mask |= torch.eye(max_len, dtype=torch.bool)[None]
        self.causal_mask = mask

    def embed_condition(self, cond: torch.Tensor) -> torch.Tensor:
        if self.t2i:
            h = F.gelu(cond @ self.w["cls_embedding.cap_proj.fc1.weight"].T, approximate="tanh")
            return (h @ self.w["cls_embedding.cap_proj.fc2.weight"].T)[:, : self.cond_len]
        return self.w["cls_embedding.embedding_table.weight"][cond][:, None, :]

    def forward(self, idx: torch.Tensor = None, cond: torch.Tensor = None, input_pos: torch.Tensor = None) -> torch.Tensor:
        """Prefill (cond given) or decode (idx given) with the cache; logits [B,T,V] at input_pos."""
        h = self.embed_condition(cond) if cond is not None else self.w["tok_embeddings.weight"][idx]
        mask = self.causal_mask[: h.shape[0], None][:, :, input_pos]  # [B,1,T,max_len]
        return self._layers(h, self.freqs[input_pos], mask, input_pos)

    def teacher_forcing(self, cond: torch.Tensor, image_tokens: torch.Tensor, emb_masks: torch.Tensor = None) -> torch.Tensor:
        """LlamaGen's training forward: logits[:, cond_len-1:] over cond + tokens[:, :-1]."""
        h = torch.cat([self.embed_condition(cond), self.w["tok_embeddings.weight"][image_tokens[:, :-1]]], dim=1)
        length = h.shape[1]
        mask = torch.tril(torch.ones(length, length, dtype=torch.bool))[None].repeat(h.shape[0], 1, 1)
        if emb_masks is not None:
            mask[:, :, : self.cond_len] &= emb_masks.bool()[:, None, :]
            mask |= torch.eye(length, dtype=torch.bool)[None]
        return self._layers(h, self.freqs[:length], mask[:, None], None)[:, self.cond_len - 1:]

    def _layers(self, h, freqs, mask, input_pos):
        w, hd = self.w, self.head_dim
        bsz, length, _ = h.shape
        for i in range(self.n_layer):
            p = f"layers.{i}."
            x = _rms_norm(h, w[p + "attention_norm.weight"], self.eps)
            qkv = x @ w[p + "attention.wqkv.weight"].T
            q = qkv[..., : self.dim].reshape(bsz, length, self.n_head, hd)
            k = qkv[..., self.dim: self.dim + self.n_kv_head * hd].reshape(bsz, length, self.n_kv_head, hd)
            v = qkv[..., self.dim + self.n_kv_head * hd:].reshape(bsz, length, self.n_kv_head, hd)
            q, k = _rotate(q, freqs), _rotate(k, freqs)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if input_pos is not None:
                self.k_cache[i][:bsz, :, input_pos] = k
                self.v_cache[i][:bsz, :, input_pos] = v
                k, v = self.k_cache[i][:bsz], self.v_cache[i][:bsz]
            rep = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            scores = scores.masked_fill(~mask, float("-inf"))
            attn = torch.softmax(scores, dim=-1) @ v
            h = h + attn.transpose(1, 2).reshape(bsz, length, self.dim) @ w[p + "attention.wo.weight"].T
            x = _rms_norm(h, w[p + "ffn_norm.weight"], self.eps)
            ffn = (F.silu(x @ w[p + "feed_forward.w1.weight"].T) * (x @ w[p + "feed_forward.w3.weight"].T))
            h = h + ffn @ w[p + "feed_forward.w2.weight"].T
        h = _rms_norm(h, w["norm.weight"], self.eps)
        return h @ w["output.weight"].T


# ---- VQ decoder ---------------------------------------------------------------------------


def reference_vq_decode(state: dict[str, torch.Tensor], codes: torch.Tensor, levels: int, res_per_level: int,
                        groups: int = 32) -> torch.Tensor:
    """LlamaGen's VQ decode_code written as plain functions over the state_dict.

    Codebook rows are L2-normalised at lookup; decoder.conv_blocks.0 is the lowest resolution.
    """
    w = state

    def conv(x, name, padding):
        return F.conv2d(x, w[name + ".weight"], w[name + ".bias"], padding=padding)

    def norm(x, name):
        return F.group_norm(x, groups, w[name + ".weight"], w[name + ".bias"], eps=1e-6)

    def swish(x):
        return x * torch.sigmoid(x)

    def resnet(x, name):
        h = conv(swish(norm(x, name + ".norm1")), name + ".conv1", 1)
        h = conv(swish(norm(h, name + ".norm2")), name + ".conv2", 1)
        if name + ".nin_shortcut.weight" in w:
            x = conv(x, name + ".nin_shortcut", 0)
        return x + h

    def attention(x, name):
        b, c, hh, ww = x.shape
        n = norm(x, name + ".norm")
        q, k, v = (conv(n, f"{name}.{p}", 0).reshape(b, c, hh * ww) for p in "qkv")
        weights = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(c), dim=-1)
        out = torch.einsum("bij,bcj->bci", weights, v).reshape(b, c, hh, ww)
        return x + conv(out, name + ".proj_out", 0)

    codebook = w["quantize.embedding.weight"]
    codebook = codebook / codebook.norm(dim=1, keepdim=True)
    z = codebook[codes.long()].permute(0, 3, 1, 2)
    h = conv(conv(z, "post_quant_conv", 0), "decoder.conv_in", 1)
    h = attention(resnet(h, "decoder.mid.0"), "decoder.mid.1")
    h = resnet(h, "decoder.mid.2")
    for index in range(levels):
        for r in range(res_per_level):
            h = resnet(h, f"decoder.conv_blocks.{index}.res.{r}")
            if index == 0:
                h = attention(h, f"decoder.conv_blocks.{index}.attn.{r}")
        if index != levels - 1:
            h = conv(h.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3), f"decoder.conv_blocks.{index}.upsample.conv", 1)
    return conv(swish(norm(h, "decoder.norm_out")), "decoder.conv_out", 1)
