"""The language model of Janus / Emu3 / Lumina-mGPT (Chameleon) as one export-friendly module.

All three are Llama-style decoders (GQA, SwiGLU, rotate-half RoPE, RMSNorm); Chameleon adds a
per-head layer norm on q and k and optionally "swin" norm placement. They differ in where image
tokens come from and go to: Emu3 and Chameleon embed a VQ code as its text-vocabulary token and
score it with that token's lm_head row; Janus embeds codes with `generation_embeddings` +
`generation_aligner` and scores them with `generation_head`. UnifiedLM hides that behind *head
indices* (codes 0..image_vocab-1, then the row end), so the graphs and the runtime see one
discrete model with a small vocabulary, exactly as docs/contracts.md "Unified-vocabulary
models" says.

Like models/llamagen_gpt.py, prefill and step are pure functions of tensors (caller-owned KV
cache, explicit positions and boolean masks, no data-dependent Python control flow) so they
trace with torch.onnx.export(dynamo=True). The image grammar is applied inside the logits:
a forced position is a point mass (FORCED_LOGIT elsewhere), a sampled one never gives a
structural token mass — every method then stays exact without knowing the grammar.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from specrt.export.unified.config import CHAMELEON_QK_NORM_EPS, UnifiedConfig
from specrt.models.fused_linears import fuse_linears, runs_fused
from specrt.models.skinny_matmul import block_linear
from specrt.models.kv_cache import Cache, LayerCall, attend, run_layers
from specrt.models.llamagen_gpt import RMSNorm
from specrt.runtime.grammar import FORCED_LOGIT


def activation(name: str):
    """transformers' ACT2FN for the activations these checkpoints use."""
    table = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
             "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
             "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}
    if name not in table:
        raise ValueError(f"unsupported activation {name!r}; known: {', '.join(table)}")
    return table[name]


class HeadNorm(nn.Module):
    """Chameleon's qk-norm: layer norm over each head's D features, then that head's own
    gain and bias (weight/bias [heads, D], one per model-parallel shard in Meta's training)."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, W, H, D]
        return F.layer_norm(x, x.shape[-1:], None, None, eps=CHAMELEON_QK_NORM_EPS) * self.weight + self.bias


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    """GQA attention (q/k/v/o projections, optional qk-norm) over a caller-owned cache."""

    def __init__(self, c: UnifiedConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = c.n_head, c.n_kv_head, c.head_dim
        self.q_proj = nn.Linear(c.dim, c.n_head * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.dim, c.n_kv_head * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.dim, c.n_kv_head * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.n_head * c.head_dim, c.dim, bias=c.attention_bias)
        if c.qk_norm:
            self.q_norm = HeadNorm(c.n_head, c.head_dim)
            self.k_norm = HeadNorm(c.n_kv_head, c.head_dim)
        self.qk_norm = c.qk_norm
        self.register_buffer("qkv_weight", None, persistent=False)  # [q; k; v] once fused
        self.register_buffer("qkv_bias", None, persistent=False)
        self.triton_attention = False  # models.step_setup.set_step_attention
        self.skinny_matmuls = False  # models.step_setup.use_skinny_matmuls

    def fuse_projections(self, on: bool = True) -> None:
        """q, k and v as one product over one buffer (models.fused_linears), or apart again (`on`)."""
        if not on:
            self.qkv_weight = self.qkv_bias = None
        elif self.qkv_weight is None:
            self.qkv_weight, self.qkv_bias = fuse_linears([self.q_proj, self.k_proj, self.v_proj])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_k: Optional[torch.Tensor],
                past_v: Optional[torch.Tensor], mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,W,dim]; cos/sin [B,1,W,D]; past_k/v [B,Hkv,C,D] or None; mask bool [B,1,W,C+W].
        Returns (output [B,W,dim], rotated k [B,Hkv,W,D], v [B,Hkv,W,D])."""
        bsz, width, _ = x.shape
        skinny = self.skinny_matmuls
        if runs_fused(self.qkv_weight, self.q_proj.weight):
            sizes = [self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features]
            q, k, v = block_linear(x, self.qkv_weight, self.qkv_bias, skinny).split(sizes, dim=-1)
        else:
            q, k, v = (block_linear(x, layer.weight, layer.bias, skinny)
                       for layer in (self.q_proj, self.k_proj, self.v_proj))
        q = q.view(bsz, width, self.n_head, self.head_dim)
        k = k.view(bsz, width, self.n_kv_head, self.head_dim)
        v = v.view(bsz, width, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = attend(q, k, v, past_k, past_v, mask, self.triton_attention).transpose(1, 2).reshape(bsz, width, -1)
        return block_linear(out, self.o_proj.weight, self.o_proj.bias, skinny), k, v


class MLP(nn.Module):
    """SwiGLU: down(act(gate x) * up x)."""

    def __init__(self, c: UnifiedConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.dim, c.ffn_hidden, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.dim, c.ffn_hidden, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.ffn_hidden, c.dim, bias=c.mlp_bias)
        self.act = activation(c.hidden_act)
        self.register_buffer("gate_up_weight", None, persistent=False)  # [gate; up] once fused
        self.register_buffer("gate_up_bias", None, persistent=False)
        self.skinny_matmuls = False  # models.step_setup.use_skinny_matmuls

    def fuse_projections(self, on: bool = True) -> None:
        """gate and up as one product over one buffer (models.fused_linears), or apart again (`on`)."""
        if not on:
            self.gate_up_weight = self.gate_up_bias = None
        elif self.gate_up_weight is None:
            self.gate_up_weight, self.gate_up_bias = fuse_linears([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skinny = self.skinny_matmuls
        if runs_fused(self.gate_up_weight, self.gate_proj.weight):
            gate, up = block_linear(x, self.gate_up_weight, self.gate_up_bias, skinny).chunk(2, dim=-1)
        else:
            gate, up = (block_linear(x, layer.weight, layer.bias, skinny) for layer in (self.gate_proj, self.up_proj))
        return block_linear(self.act(gate) * up, self.down_proj.weight, self.down_proj.bias, skinny)


class DecoderLayer(nn.Module):
    """Pre-norm block, or Chameleon's swin_norm block (norms after attention / MLP, inside the residual)."""

    def __init__(self, c: UnifiedConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.dim, c.norm_eps)
        self.post_attention_layernorm = RMSNorm(c.dim, c.norm_eps)
        self.swin_norm = c.swin_norm

    def forward(self, x, cos, sin, past_k, past_v, mask):
        if self.swin_norm:
            attn, k, v = self.self_attn(x, cos, sin, past_k, past_v, mask)
            h = x + self.input_layernorm(attn)
            return h + self.post_attention_layernorm(self.mlp(h)), k, v
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v, mask)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class GenerationAligner(nn.Module):
    """Janus's generation_aligner: fc1, then (act, linear) for each further layer."""

    def __init__(self, c: UnifiedConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.gen_embed_dim, c.gen_projection_dim)
        self.hidden_layers = nn.ModuleList(
            nn.Linear(c.gen_projection_dim, c.gen_projection_dim) for _ in range(1, c.gen_aligner_layers))
        self.act = activation(c.gen_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        for layer in self.hidden_layers:
            x = layer(self.act(x))
        return x


class GenerationHead(nn.Module):
    """Janus's generation_head: vision_head(act(proj_out(h))) over the VQ codebook."""

    def __init__(self, c: UnifiedConfig):
        super().__init__()
        self.proj_out = nn.Linear(c.gen_head_dim, c.gen_projection_dim)
        self.vision_head = nn.Linear(c.gen_projection_dim, c.gen_codebook)
        self.act = activation(c.gen_act)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.vision_head(self.act(self.proj_out(h)))


class UnifiedLM(nn.Module):
    """A unified-vocabulary language model with specrt's prefill / step contract.

    Parameter names are transformers' with the language-model prefix stripped
    (`layers.0.self_attn.q_proj.weight`, `lm_head.weight`, Janus's `generation_head.…`);
    export/unified/weights.py maps a checkpoint's keys onto them.
    """

    def __init__(self, config: UnifiedConfig):
        super().__init__()
        c = self.config = config
        self.janus = c.architecture == "janus"
        self.embed_tokens = nn.Embedding(c.text_vocab_size, c.dim)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.lm_head = nn.Linear(c.dim, c.text_vocab_size, bias=False)
        if self.janus:
            self.generation_embeddings = nn.Embedding(c.gen_codebook, c.gen_embed_dim)
            self.generation_aligner = GenerationAligner(c)
            self.generation_head = GenerationHead(c)
        self._make_buffers()

    # ---- constants --------------------------------------------------------------------

    def _make_buffers(self) -> None:
        """Non-weight tables, always on the weights' device but never cast: rope frequencies stay
        float32 (as transformers keeps them) and the index tables stay int64."""
        c, device = self.config, self.embed_tokens.weight.device
        device = torch.device("cpu") if device.type == "meta" else device
        grammar = c.grammar
        head_ids = list(c.image_token_ids or ()) + ([c.row_end_id] if grammar.row_end else [])
        self.register_buffer("inv_freq", torch.tensor(c.inv_freq, dtype=torch.float32, device=device), persistent=False)
        self.register_buffer("head_ids", torch.tensor(head_ids, dtype=torch.int64, device=device), persistent=False)
        self.register_buffer("forced", torch.tensor(grammar.forced(), dtype=torch.int64, device=device), persistent=False)
        self.register_buffer("head_range", torch.arange(grammar.vocab_size, device=device), persistent=False)

    def _apply(self, fn, recurse=True):
        # .half() / .to(dtype) must not coarsen the rope frequencies (transformers keeps them float32)
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = torch.tensor(self.config.inv_freq, dtype=torch.float32, device=self.inv_freq.device)
        return self

    def restrict_head(self) -> None:
        """Give the head vocabulary's rows of lm_head and embed_tokens tables of their own.

        Why: the step graph reads and writes only head indices, so it needs V_head rows, not the
        text vocabulary's tens of thousands; gathering them from the full tables inside the graph
        at every step would move V_head·dim numbers per call and keep both full tables in the step
        graph (and unquantizable by int4's MatMul rewrite). Called once the weights are loaded;
        Janus has separate generation tables already."""
        if self.janus:
            return
        with torch.no_grad():
            self.head_weight = nn.Parameter(self.lm_head.weight[self.head_ids].clone(), requires_grad=False)
            self.stream_embed = nn.Parameter(self.embed_tokens.weight[self.head_ids].clone(), requires_grad=False)

    def tie_weights(self) -> None:
        """Share lm_head with embed_tokens (checkpoints with tie_word_embeddings)."""
        self.lm_head.weight = self.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    # ---- pieces -----------------------------------------------------------------------

    def _rope(self, rope_positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B,1,W,D] at rotary positions [B,W] (transformers' LlamaRotaryEmbedding numerics)."""
        freqs = rope_positions.to(torch.float32)[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.config.rope_scaling != 1.0:
            cos, sin = cos * self.config.rope_scaling, sin * self.config.rope_scaling
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]

    def _trunk(self, h: torch.Tensor, rope_positions: torch.Tensor, mask: torch.Tensor,
               past_kv: Cache, run_layer: Optional[LayerCall] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """All layers on h [B,W,dim]; mask bool [B,1,W,C+W]. Returns (final-norm hidden, present_kv)."""
        cos, sin = self._rope(rope_positions, h.dtype)
        h, present = run_layers(self.layers, h, cos, sin, mask, past_kv, run_layer)
        return self.norm(h), present

    def embed_stream(self, head_indices: torch.Tensor) -> torch.Tensor:
        """Head indices [B,W] -> input embeddings: Janus's generation embedding + aligner, else the
        text embedding of each index's vocabulary id."""
        if self.janus:
            return self.generation_aligner(self.generation_embeddings(head_indices))
        if hasattr(self, "stream_embed"):  # restrict_head: the head vocabulary's own rows
            return F.embedding(head_indices, self.stream_embed)
        return self.embed_tokens(self.head_ids[head_indices])

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits over the head vocabulary (no grammar): Janus's generation_head, else the
        lm_head rows of the image tokens in code order, then the row end's."""
        if self.janus:
            return self.generation_head(hidden).float()
        if hasattr(self, "head_weight"):  # restrict_head: the head vocabulary's own rows
            return F.linear(hidden, self.head_weight).float()
        return F.linear(hidden, self.lm_head.weight[self.head_ids]).float()

    def apply_grammar(self, logits: torch.Tensor, stream_index: torch.Tensor) -> torch.Tensor:
        """logits [B,W,Vh] for stream indices [B,W] (clamped into the stream): a forced position
        becomes 0 at its token and FORCED_LOGIT elsewhere; a sampled one FORCED_LOGIT at the
        structural tokens. Janus's stream has no structural tokens: unchanged."""
        grammar = self.config.grammar
        if not grammar.row_end:
            return logits
        k = stream_index.clamp(0, grammar.stream_len - 1)
        forced = self.forced[k][..., None]  # [B,W,1], -1 where sampled
        floor = torch.full_like(logits, FORCED_LOGIT)
        point = torch.where(self.head_range == forced, torch.zeros_like(logits), floor)
        free = torch.where(self.head_range >= grammar.image_vocab, floor, logits)
        return torch.where(forced >= 0, point, free)

    @staticmethod
    def _left_padded_mask(mask: torch.Tensor) -> torch.Tensor:
        """bool [B,T] (False = padding) -> [B,1,T,T]: causal, padded columns hidden, every row sees
        itself (a padded row must not be all-masked, its output is never used)."""
        length = mask.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
        eye = torch.eye(length, dtype=torch.bool, device=mask.device)
        return ((causal[None] & mask[:, None, :]) | eye[None])[:, None]

    @staticmethod
    def _left_padded_positions(mask: torch.Tensor) -> torch.Tensor:
        """Rotary positions of a left-padded row, as transformers' generate builds them (cumsum − 1)."""
        return (torch.cumsum(mask.to(torch.int64), dim=-1) - 1).clamp(min=0)

    # ---- the contract's entry points --------------------------------------------------

    def prefill(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run left-padded prompts: input_ids [B,P] (the model's vocabulary ids), prompt_mask bool
        [B,P] (False = padding). Returns logits [B,1,Vh] (float32, grammar applied for stream
        index 0), hidden [B,1,dim] (float32) of the last prompt token, present_kv [L,2,B,Hkv,P,D]."""
        mask = prompt_mask.to(torch.bool)
        h = self.embed_tokens(input_ids.to(torch.int64))
        hidden, present = self._trunk(h, self._left_padded_positions(mask), self._left_padded_mask(mask), None)
        last = hidden[:, -1:]
        logits = self.head_logits(last)
        stream_index = torch.zeros(logits.shape[:2], dtype=torch.int64, device=logits.device)
        return self.apply_grammar(logits, stream_index), last.float(), present

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
             past_kv: Cache, run_layer: Optional[LayerCall] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run a window of stream tokens against a caller-owned cache.

        input_ids [B,W]: head indices; positions [B,W]: cache slots (cond_len + stream index);
        attention_mask bool [B,W,C+W] (cache columns, then window columns; columns below cond_len
        carry the prompt mask); past_kv [L,2,B,Hkv,C,D] or a kv_cache.StaticCache written in place
        (run_layer: how each layer runs, as GPT.step). Row w's logits predict stream index
        positions[w] − cond_len + 1. Returns logits [B,W,Vh] (float32), hidden [B,W,dim]
        (float32), present_kv [L,2,B,Hkv,W,D] (the window's rows only).
        """
        cond_len = self.config.cond_len
        mask = attention_mask.to(torch.bool)
        positions = positions.to(torch.int64)
        # the row's left padding: prompt slots its (widest-seeing) window row may not attend to
        real = mask[:, :, :cond_len].to(torch.int64).sum(-1).amax(-1)
        rope_positions = positions - (cond_len - real)[:, None]
        h = self.embed_stream(input_ids.to(torch.int64))
        hidden, present = self._trunk(h, rope_positions, mask[:, None], past_kv, run_layer)
        logits = self.apply_grammar(self.head_logits(hidden), positions - cond_len + 1)
        return logits, hidden.float(), present

    # ---- teacher forcing (comparison with transformers, training, tests) ----------------

    def logits_of(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Teacher-forced float32 logits [B,T,text_vocab] of plain token sequences input_ids [B,T]
        (optionally left-padded, attention_mask [B,T]) over the FULL vocabulary through lm_head —
        what transformers' forward gives (Chameleon: its trunk + lm_head, unmasked)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        mask = attention_mask.to(torch.bool)
        h = self.embed_tokens(input_ids.to(torch.int64))
        hidden, _ = self._trunk(h, self._left_padded_positions(mask), self._left_padded_mask(mask), None)
        return self.lm_head(hidden).float()

    def image_logits_of(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        stream: torch.Tensor) -> torch.Tensor:
        """Teacher-forced head logits [B,S,Vh] (grammar applied) of a whole stream [B,S] of head
        indices after left-padded prompts [B,cond_len]: row k predicts stream token k. Janus's
        generation head over its generation embeddings; Emu3 / Chameleon the image rows of lm_head."""
        first, _, past = self.prefill(input_ids, prompt_mask)
        bsz, length = stream.shape
        if length == 1:
            return first
        cond_len = self.config.cond_len
        if prompt_mask.shape[1] != cond_len:
            raise ValueError(f"prompts are left-padded to cond_len {cond_len}, got {prompt_mask.shape[1]} columns")
        window = length - 1
        positions = (cond_len + torch.arange(window, device=stream.device))[None].expand(bsz, window)
        causal = torch.ones(window, window, dtype=torch.bool, device=stream.device).tril()
        mask = torch.cat([prompt_mask.to(torch.bool)[:, None].expand(bsz, window, cond_len),
                          causal[None].expand(bsz, window, window)], dim=-1)
        rest, _, _ = self.step(stream[:, :-1], positions, mask, past)
        return torch.cat([first, rest], dim=1)
