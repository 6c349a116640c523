"""The EAGLE draft head for LlamaGen targets, in LANTERN's layout, as an export-friendly module.

EAGLE drafts in feature space: slot p of the head sees the pair (f_{p-1}, x_p), the target's
final-norm hidden state that predicted token x_p and that token's embedding, fuses them with
`fc` (Linear 2H -> H, with bias) over [embedding; feature], runs one Llama decoder layer (no
input norm on the first layer, LANTERN's `index == 0`; no final norm) and reads the next
token's logits through the *target's* lm_head (`output.weight`). Its output feature g_p
stands in for f_p when the head drafts further (EAGLE's recursion).

Parameter names are LANTERN's (`embed_tokens`, `fc`, `layers.0.self_attn.{q,k,v,o}_proj`,
`layers.0.mlp.{gate,up,down}_proj`, `layers.0.post_attention_layernorm`), so its drafters load
strictly; the lm_head is a non-persistent buffer copied from the target. Positions are the
contract's sequence positions of the input token x_p (docs/contracts.md) and gather the
target's own 2D RoPE table: LANTERN's drafter position `cls_token_num + k` (0 for c2i, 119
for t2i) is image token k's, i.e. raster cell k, exactly the row `cond_len + k` here.
Like the target, the head's KV cache is the caller's: `step` reads [1, 2, B, Hkv, C, D] and
returns only the window's rows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from specrt.models.kv_cache import attend, run_layers
from specrt.models.llamagen_gpt import GPT, RMSNorm
from specrt.models.rope import apply_rope, rope_2d_tables


@dataclass
class EagleConfig:
    """One head's sizes; `dim`, `vocab_size`, `grid_size`, `cond_len` are the target's."""

    dim: int
    n_head: int
    ffn_hidden: int
    vocab_size: int
    grid_size: int
    cond_len: int = 1
    n_kv_head: Optional[int] = None
    norm_eps: float = 1e-6      # LANTERN's rms_norm_eps
    rope_base: float = 10000.0
    fc_bias: bool = True        # LANTERN's Model(bias=True) default
    model_type: str = "c2i"

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.dim % self.n_head or self.n_head % self.n_kv_head or (self.dim // self.n_head) % 4:
            raise ValueError(f"eagle head: dim {self.dim}, n_head {self.n_head}, n_kv_head {self.n_kv_head} "
                             "do not divide (2D RoPE needs head_dim divisible by 4)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def n_layer(self) -> int:
        return 1  # LANTERN's drafters, EAGLE-1/2: one decoder layer

    @property
    def seq_len(self) -> int:
        return self.cond_len + self.grid_size**2

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def for_target(cls, target: GPT, n_head: Optional[int] = None, ffn_hidden: Optional[int] = None) -> "EagleConfig":
        """A head for this target: its dim, vocabulary, grid and condition length; the target's
        head count and FFN width unless given (LANTERN's XL drafter: 20 heads, MLP 3584)."""
        c = target.config
        return cls(dim=c.dim, n_head=n_head or c.n_head, ffn_hidden=ffn_hidden or c.ffn_hidden,
                   vocab_size=c.vocab_size, grid_size=c.grid_size, cond_len=c.cond_len,
                   rope_base=c.rope_base, model_type=c.model_type)


class SelfAttention(nn.Module):
    """Llama attention with separate q/k/v projections (LANTERN's names), no biases."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.q_proj = nn.Linear(config.dim, config.n_head * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_head * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_head * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_head * config.head_dim, config.dim, bias=False)

    def forward(self, x, cos, sin, past_k, past_v, mask):
        """x [B,W,H]; past_k/v [B,Hkv,C,D] or None; mask bool [B,1,W,C+W] or None (causal)."""
        bsz, width, _ = x.shape
        q = apply_rope(self.q_proj(x).view(bsz, width, self.n_head, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rope(self.k_proj(x).view(bsz, width, self.n_kv_head, self.head_dim), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(bsz, width, self.n_kv_head, self.head_dim).transpose(1, 2)
        out = attend(q, k, v, past_k, past_v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, width, -1)), k, v


class MLP(nn.Module):
    """down(silu(gate x) * up x)."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(config.ffn_hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """LANTERN's first decoder layer: h = x + attn(x) (no input norm); out = h + mlp(norm(h))."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.self_attn = SelfAttention(config)
        self.mlp = MLP(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, cos, sin, past_k, past_v, mask):
        attn, k, v = self.self_attn(x, cos, sin, past_k, past_v, mask)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class EagleHead(nn.Module):
    """fc([embed(x_p); f_{p-1}]) -> one decoder layer -> target lm_head. state_dict = LANTERN's keys."""

    n_layer = 1
    draft_kind = "eagle"  # manifest models.draft.kind (specrt.runtime.eagle.EAGLE_KIND)

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen (EAGLE)
        self.layers = nn.ModuleList([DecoderLayer(config)])
        self.fc = nn.Linear(2 * config.dim, config.dim, bias=config.fc_bias)
        self.register_buffer("lm_head", torch.zeros(config.vocab_size, config.dim), persistent=False)
        cos, sin = rope_2d_tables(config.grid_size, config.head_dim, config.cond_len, config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("last_position", torch.tensor(config.seq_len - 1, dtype=torch.int32), persistent=False)

    @torch.no_grad()
    def tie_to(self, target: GPT) -> "EagleHead":
        """Take the target's token embedding and lm_head (EAGLE shares both; only fc and the layer train)."""
        self.embed_tokens.weight.copy_(target.tok_embeddings.weight)
        self.lm_head.copy_(target.output.weight)
        return self

    def _layer(self, input_ids, hidden, positions, mask, past_kv):
        positions = torch.minimum(positions, self.last_position.to(positions.dtype))
        cos, sin = F.embedding(positions, self.rope_cos), F.embedding(positions, self.rope_sin)
        x = self.fc(torch.cat([self.embed_tokens(input_ids).to(hidden.dtype), hidden], dim=-1))
        out, present = run_layers(self.layers, x, cos, sin, mask, past_kv)
        logits = F.linear(out, self.lm_head.to(out.dtype)).float()
        return logits, out, present

    def step(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             attention_mask: torch.Tensor, past_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A window of W pairs against a caller-owned cache (the graph's entry point).

        input_ids, positions: int [B,W] (x_p and its sequence position p); hidden [B,W,H]: the
        feature before each token (the target's f_{p-1}, or the head's own g_{p-1} for a drafted
        parent); attention_mask bool [B,W,C+W]; past_kv [1,2,B,Hkv,C,D].
        Returns logits [B,W,V] (of x_{p+1}), the head's features g [B,W,H], present_kv [1,2,B,Hkv,W,D].
        """
        return self._layer(input_ids, hidden, positions, attention_mask[:, None], past_kv)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing over whole sequences of pairs (causal): (logits [B,N,V], features [B,N,H])."""
        logits, out, _ = self._layer(input_ids, hidden, positions, None, None)
        return logits, out
