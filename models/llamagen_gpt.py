"""LlamaGen's GPT (class- and text-conditional) as an export-friendly PyTorch module.

Same parameter names and numerics as FoundationVision/LlamaGen `autoregressive/models/gpt.py`
(so its checkpoints load strictly), but the inference entry points are pure functions of
their tensor inputs: the KV cache is owned by the caller (docs/contracts.md), RoPE is a real
cos/sin table gathered by absolute position, and attention takes an explicit boolean mask.
That is what lets `prefill` / `step` be exported to ONNX as they are, and lets the torch
backend, the exporter and the runtime share one definition.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from specrt.models.fused_linears import fuse_linears, runs_fused
from specrt.models.kv_cache import Cache, LayerCall, LayerPast, attend, run_layers
from specrt.models.rope import apply_rope, rope_2d_tables
from specrt.models.skinny_matmul import block_linear

# name -> (dim, n_layer, n_head), as LlamaGen's GPT_models.
GPT_ARCHS: dict[str, tuple[int, int, int]] = {
    "GPT-B": (768, 12, 12),
    "GPT-L": (1024, 24, 16),
    "GPT-XL": (1280, 36, 20),
    "GPT-XXL": (1536, 48, 24),
    "GPT-XXXL": (2560, 48, 40),
    "GPT-1B": (2048, 22, 32),
    "GPT-3B": (3200, 24, 32),
    "GPT-7B": (4096, 32, 32),
}

T2I_COND_LEN = 120  # LlamaGen's t2i models see 120 T5 caption tokens


def find_multiple(n: int, k: int) -> int:
    """Smallest multiple of k that is >= n (LlamaGen's FFN rounding)."""
    return n if n % k == 0 else n + k - (n % k)


@dataclass
class GPTConfig:
    """LlamaGen's ModelArgs in specrt's names (cond_len = LlamaGen's cls_token_num)."""

    dim: int
    n_layer: int
    n_head: int
    n_kv_head: Optional[int] = None
    vocab_size: int = 16384
    num_classes: int = 1000
    cond_len: int = 1
    model_type: str = "c2i"
    caption_dim: int = 2048
    grid_size: int = 16
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    multiple_of: int = 256
    ffn_dim_multiplier: Optional[float] = None
    dropout: float = 0.0  # token/residual/FFN dropout while training (LlamaGen trains with 0.1)
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"model_type must be 'c2i' or 't2i', got {self.model_type!r}")
        if self.dim % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"dim {self.dim}, n_head {self.n_head}, n_kv_head {self.n_kv_head} do not divide")
        if self.head_dim % 4:
            raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {self.head_dim}")
        if self.model_type == "c2i" and self.cond_len != 1:
            raise ValueError(f"c2i models have one condition token, got cond_len={self.cond_len}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return find_multiple(hidden, self.multiple_of)

    @property
    def num_image_tokens(self) -> int:
        return self.grid_size**2

    @property
    def seq_len(self) -> int:
        return self.cond_len + self.num_image_tokens


def gpt_config(arch: str, model_type: str = "c2i", image_size: int = 256, downsample: int = 16, **overrides) -> GPTConfig:
    """Config of a named LlamaGen size, e.g. gpt_config("GPT-XL", image_size=384) -> grid 24."""
    if arch not in GPT_ARCHS:
        raise ValueError(f"unknown GPT arch {arch!r}; known: {', '.join(GPT_ARCHS)}")
    dim, n_layer, n_head = GPT_ARCHS[arch]
    fields = dict(
        dim=dim, n_layer=n_layer, n_head=n_head, model_type=model_type,
        cond_len=1 if model_type == "c2i" else T2I_COND_LEN, grid_size=image_size // downsample,
    )
    fields.update(overrides)
    return GPTConfig(**fields)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 (LlamaGen), weight applied in the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), no biases.

    `fuse_projections()` makes w1 and w3 one matrix product (models.fused_linears: their weights
    become two halves of one [2·hidden, dim] buffer, the checkpoint keys stay as LlamaGen's). Why:
    w1 alone is 54 tiles of 64 columns on an H100's 132 multiprocessors (GPT-XL), and the step
    read its weights at half the bandwidth; one product over both halves is one launch with twice
    the tiles."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.dim, bias=False)
        self.dropout = nn.Dropout(config.dropout)
        self.register_buffer("gate_up", None, persistent=False)  # [w1; w3] once fused
        self.skinny_matmuls = False  # step_setup.use_skinny_matmuls

    def fuse_projections(self, on: bool = True) -> None:
        """w1 and w3 as one product over one buffer (models.fused_linears), or apart again (`on`)."""
        if not on:
            self.gate_up = None
        elif self.gate_up is None:
            self.gate_up = fuse_linears([self.w1, self.w3])[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if runs_fused(self.gate_up, self.w1.weight):
            gate, up = block_linear(x, self.gate_up, None, self.skinny_matmuls).chunk(2, dim=-1)
        else:
            gate, up = (block_linear(x, self.w1.weight, None, self.skinny_matmuls),
                        block_linear(x, self.w3.weight, None, self.skinny_matmuls))
        return self.dropout(block_linear(F.silu(gate) * up, self.w2.weight, None, self.skinny_matmuls))


class Attention(nn.Module):
    """Multi-head attention with GQA; keys/values of earlier positions come in from outside."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.wqkv = nn.Linear(config.dim, (config.n_head + 2 * config.n_kv_head) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.dropout = nn.Dropout(config.dropout)
        self.skinny_matmuls = False  # step_setup.use_skinny_matmuls
        self.triton_attention = False  # step_setup.set_step_attention

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        past_k: LayerPast, past_v: LayerPast, mask: Optional[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,W,dim]; past_k/v [B,Hkv,C,D], segments, a kv_cache.CacheWrite or None; mask bool [B,1,W,C+W] or None (= causal).

        Returns (output [B,W,dim], new k [B,Hkv,W,D], new v [B,Hkv,W,D]).
        """
        bsz, width, _ = x.shape
        q_size, kv_size = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        q, k, v = block_linear(x, self.wqkv.weight, None, self.skinny_matmuls).split([q_size, kv_size, kv_size], dim=-1)
        q = apply_rope(q.view(bsz, width, self.n_head, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rope(k.view(bsz, width, self.n_kv_head, self.head_dim), cos, sin).transpose(1, 2)
        v = v.view(bsz, width, self.n_kv_head, self.head_dim).transpose(1, 2)

        out = attend(q, k, v, past_k, past_v, mask, self.triton_attention).transpose(1, 2).reshape(bsz, width, q_size)
        return self.dropout(block_linear(out, self.wo.weight, None, self.skinny_matmuls)), k, v


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + ffn(norm(h))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, cos, sin, past_k, past_v, mask):
        attn, k, v = self.attention(self.attention_norm(x), cos, sin, past_k, past_v, mask)
        h = x + attn
        return h + self.feed_forward(self.ffn_norm(h)), k, v


class LabelEmbedder(nn.Module):
    """c2i condition: one embedding row per class, plus row num_classes = the null class (CFG)."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, class_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding_table(class_ids).unsqueeze(1)


class CaptionMLP(nn.Module):
    """fc1 -> GELU(tanh) -> fc2, no biases (LlamaGen's cap_proj)."""

    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """t2i condition: projected T5 caption embeddings; `uncond_embedding` is the CFG null caption."""

    def __init__(self, caption_dim: int, dim: int, cond_len: int):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(cond_len, caption_dim) / caption_dim**0.5)

    def forward(self, captions: torch.Tensor) -> torch.Tensor:
        return self.cap_proj(captions)


class GPT(nn.Module):
    """LlamaGen Transformer. state_dict keys are exactly LlamaGen's."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        if config.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim)
        else:
            self.cls_embedding = CaptionEmbedder(config.caption_dim, config.dim, config.cond_len)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = rope_2d_tables(config.grid_size, config.head_dim, config.cond_len, config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)  # [seq_len, head_dim//2], always float32
        self.register_buffer("rope_sin", sin, persistent=False)
        # the last RoPE row as a device tensor: a host constant would be copied to the device on
        # every step, which CUDA-graph capture forbids (and costs a copy per step without one)
        self.register_buffer("last_position", torch.tensor(config.seq_len - 1, dtype=torch.int32), persistent=False)
        self.apply(self._init_weights)

    def _apply(self, fn, recurse=True):
        # .half() / .to(dtype) would coarsen the rotary tables; LlamaGen keeps them in fp32.
        super()._apply(fn, recurse)
        if self.rope_cos.dtype != torch.float32:
            c = self.config
            cos, sin = rope_2d_tables(c.grid_size, c.head_dim, c.cond_len, c.rope_base)
            self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)
        return self

    def _init_weights(self, module: nn.Module) -> None:
        # LlamaGen's init, except that the output head is not zeroed: a freshly built model
        # should give non-degenerate distributions for tests and draft training.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)

    # ---- conditions -------------------------------------------------------------------

    @property
    def null_class(self) -> int:
        return self.config.num_classes

    def null_condition(self, batch: int) -> torch.Tensor:
        """The CFG unconditional input for `batch` rows: null class ids, or the uncond caption."""
        if self.config.model_type == "c2i":
            return torch.full((batch,), self.null_class, dtype=torch.long, device=self.output.weight.device)
        return self.cls_embedding.uncond_embedding[None].expand(batch, -1, -1)

    def condition_embeddings(self, cond: torch.Tensor) -> torch.Tensor:
        """c2i: class ids [B] -> [B,1,dim]; t2i: caption embeddings [B,cond_len,caption_dim] -> [B,cond_len,dim]."""
        return self.cls_embedding(cond)[:, : self.config.cond_len]

    def drop_conditions(self, cond: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
        """Replace the rows where bool `drop` [B] is true by the null condition (CFG training)."""
        null = self.null_condition(cond.shape[0]).to(cond.dtype)
        if self.config.model_type == "c2i":
            return torch.where(drop, null, cond)
        return torch.where(drop[:, None, None], null, cond)

    # ---- shared trunk -----------------------------------------------------------------

    def _trunk(self, h: torch.Tensor, positions: torch.Tensor, mask: Optional[torch.Tensor],
               past_kv: Cache, run_layer: Optional[LayerCall] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run all layers on h [B,W,dim] at `positions` [B,W]; returns (logits, hidden, present_kv)."""
        # Padding slots past the end of the image reuse the last row (ONNX Min, TensorRT-friendly).
        positions = torch.minimum(positions, self.last_position.to(positions.dtype))
        cos, sin = F.embedding(positions, self.rope_cos), F.embedding(positions, self.rope_sin)  # Gather, int32-safe
        h, present = run_layers(self.layers, self.tok_dropout(h), cos, sin, mask, past_kv, run_layer)
        hidden = self.norm(h)
        return self.output(hidden).float(), hidden, present

    def _condition_mask(self, cond_mask: Optional[torch.Tensor], batch: int, length: int, device) -> Optional[torch.Tensor]:
        """LlamaGen's t2i mask: causal, padded caption columns hidden, every token sees itself.

        Returns bool [B,1,length,length], or None (plain causal) when there is no cond_mask.
        """
        if cond_mask is None:
            return None
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        cond_len = cond_mask.shape[1]
        columns = torch.cat([cond_mask.bool(), torch.ones(batch, length - cond_len, dtype=torch.bool, device=device)], dim=1)
        eye = torch.eye(length, dtype=torch.bool, device=device)
        return ((causal[None] & columns[:, None, :]) | eye[None])[:, None]

    # ---- inference entry points (mirrored by the ONNX graphs) -------------------------

    def caption_rows(self, captions: torch.Tensor, cond_mask: Optional[torch.Tensor],
                     uncond: Optional[torch.Tensor]) -> torch.Tensor:
        """The caption embeddings LlamaGen's t2i sampling feeds the model (sample_t2i.py + generate()).

        Padded positions (cond_mask False) are zeroed, as sample_t2i.py does before generate();
        rows where bool `uncond` [B] is true become the checkpoint's own `uncond_embedding`,
        unzeroed, as generate() builds its CFG half (the padding mask still applies to them).
        """
        if cond_mask is not None:
            captions = captions * cond_mask[..., None].to(captions.dtype)
        if uncond is not None:
            null = self.cls_embedding.uncond_embedding[: self.config.cond_len].to(captions.dtype)
            captions = torch.where(uncond[:, None, None], null[None], captions)
        return captions

    def prefill(self, cond: torch.Tensor, cond_mask: Optional[torch.Tensor] = None,
                uncond: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the condition tokens.

        cond: class ids [B] (c2i) or caption embeddings [B,cond_len,caption_dim] (t2i);
        cond_mask: optional bool [B,cond_len], False = padded caption token (hidden from every
        later token, LlamaGen's emb_masks); uncond: optional bool [B] (t2i), true = a CFG row
        that takes `uncond_embedding` instead of its caption (c2i rows carry the null class id).
        Returns logits [B,1,V] and hidden [B,1,dim] of the last condition token (they predict
        image token 0) and present_kv [L,2,B,Hkv,cond_len,D].
        """
        if self.config.model_type == "t2i":
            cond = self.caption_rows(cond, cond_mask, uncond)
        h = self.condition_embeddings(cond)
        bsz, length, _ = h.shape
        positions = torch.arange(length, device=h.device)[None].expand(bsz, length)
        mask = self._condition_mask(cond_mask, bsz, length, h.device)
        if mask is None:
            mask = torch.ones(length, length, dtype=torch.bool, device=h.device).tril()[None, None]
        logits, hidden, present_kv = self._trunk(h, positions, mask, None)
        return logits[:, -1:], hidden[:, -1:], present_kv

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
             past_kv: Cache, run_layer: Optional[LayerCall] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run a window of W image tokens against a caller-owned cache.

        input_ids, positions: int [B,W] (positions are absolute sequence positions);
        attention_mask: bool [B,W,C+W] (columns < C: cache slots, then window slots);
        past_kv: [L,2,B,Hkv,C,D], or a kv_cache.StaticCache the step writes in place (the PyTorch
        backend's decode step); `run_layer`: how each layer is run (a compiled function), default eager.
        Every window slot must be allowed at least one column; positions past seq_len - 1
        (padding slots) use the last RoPE row.
        Returns logits [B,W,V], hidden [B,W,dim] (final-norm output) and present_kv
        [L,2,B,Hkv,W,D] holding only the window's new keys/values.
        """
        h = self.tok_embeddings(input_ids)
        return self._trunk(h, positions, attention_mask[:, None], past_kv, run_layer)

    # ---- training -----------------------------------------------------------------------

    def forward_with_hidden(self, cond: torch.Tensor, image_tokens: torch.Tensor,
                            cond_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing: (logits [B,N,V], hidden [B,N,dim]); position k predicts image token k."""
        cond_h = self.condition_embeddings(cond)
        h = torch.cat([cond_h, self.tok_embeddings(image_tokens[:, :-1])], dim=1)
        bsz, length, _ = h.shape
        positions = torch.arange(length, device=h.device)[None].expand(bsz, length)
        mask = self._condition_mask(cond_mask, bsz, length, h.device)
        logits, hidden, _ = self._trunk(h, positions, mask, None)
        start = self.config.cond_len - 1
        return logits[:, start:], hidden[:, start:]

    def forward(self, cond: torch.Tensor, image_tokens: torch.Tensor, cond_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Teacher-forcing logits [B,N,V]: logits[:, k] predicts image_tokens[:, k]."""
        return self.forward_with_hidden(cond, image_tokens, cond_mask)[0]


def num_parameters(model: nn.Module) -> int:
    """Parameter count (for logs and reports)."""
    return sum(p.numel() for p in model.parameters())

