"""A MAR-style continuous-token generator: a causal transformer whose per-token output z
conditions a small diffusion MLP that samples the next continuous token.

What differs from MAR (LTH14/mar, models/mar.py) and why CSpD still applies: MAR generates
tokens in a random order with bidirectional attention over masked positions, several per step;
this family is MAR's causal "AR, raster order" variant (the MAR paper's own ablation): one
token per position, a causal mask, so a window of drafted tokens is verified in one target
pass exactly as in discrete speculative decoding. CSpD's ingredients live in the diffusion
head and are unchanged: the head is MAR's SimpleMLPAdaLN shape (time and z embeddings summed
into an adaLN condition, residual MLP blocks, adaLN final layer) predicting the noise ε, and
sampling is DDPM with a fixed variance σ_t² = β_t at every step, the last one included, so
every transition p(x_{t−1} | x_t) is a Gaussian with a known density (MAR learns σ and adds
no noise at its last step, which leaves x_0 without a density; a fixed schedule is what the
acceptance ratio of runtime/families/continuous/formulas.py needs).

Parameter names follow MAR where a counterpart exists (`z_proj`, `class_emb`, `blocks.N`,
`norm`, `diffloss.net.*`). Inference entry points are pure functions of tensors: the KV
cache is owned by the caller, as for LlamaGen (docs/contracts.md), and the layers run through
the one decode step every transformer here shares (models/kv_cache.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
import torch.nn as nn

from specrt.models.kv_cache import Cache, LayerCall, LayerPast, SplitCache, attend, run_layers


@dataclass
class MARConfig:
    """One continuous model: transformer width/depth, token size, the diffusion head and schedule."""

    token_dim: int = 4          # C: channels of one continuous token (MAR: 16 for its KL-16 tokenizer)
    seq_len: int = 4            # tokens per image (grid_size²), generated in raster order
    dim: int = 64
    n_layer: int = 2
    n_head: int = 4
    mlp_ratio: float = 4.0
    num_classes: int = 10
    head_width: int = 64        # diffusion MLP width (MAR: 1024 for MAR-B)
    head_depth: int = 2         # residual blocks (MAR: 3 for MAR-B)
    diffusion_steps: int = 8    # T of the fixed DDPM schedule used for sampling
    schedule: str = "cosine"
    beta_start: float = 1e-4    # the linear schedule's endpoints (runtime/families/continuous/formulas.ddpm_schedule)
    beta_end: float = 0.02
    input_norm: bool = False    # MAR's z_proj_ln: LayerNorm after the position embedding (checkpoint.py)
    head_freq_dim: int = 64     # the head's sinusoidal timestep features (MAR: 256)

    def __post_init__(self) -> None:
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Attention(nn.Module):
    def __init__(self, cfg: MARConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, past_k: LayerPast, past_v: LayerPast,
                mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B,W,D]; past_k/v in any kv_cache form (a tensor [B,H,P,hd] joined with the window, or a
        static cache written in place); mask [B,1,W,columns] (True = may attend, or additive).
        Returns (output [B,W,D], the window's k, v [B,H,W,hd])."""
        b, w, _ = x.shape
        q, k, v = self.qkv(x).view(b, w, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        out = attend(q, k, v, past_k, past_v, mask).transpose(1, 2).reshape(b, w, -1)
        return self.proj(out), k, v


class Block(nn.Module):
    """timm's pre-norm ViT block (MAR's encoder/decoder block), causal here."""

    def __init__(self, cfg: MARConfig):
        super().__init__()
        hidden = int(cfg.dim * cfg.mlp_ratio)
        self.norm1 = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, hidden), nn.GELU(), nn.Linear(hidden, cfg.dim))

    def forward(self, x, cos, sin, past_k, past_v, mask):
        """kv_cache.run_layers' layer call; cos and sin are None: MAR has no rotary embedding, its
        positions are added to the input (MARTransformer.inputs)."""
        h, k, v = self.attn(self.norm1(x), past_k, past_v, mask)
        x = x + h
        return x + self.mlp(self.norm2(x)), k, v


class MARTransformer(nn.Module):
    """Position 0 holds the class embedding; position j+1 holds token j; row j predicts token j.

    Two entry points run the same layers (kv_cache.run_layers, kv_cache.attend): `step` takes the
    cache as explicit tensors and hands the window's keys/values back (the exported graphs' form,
    which joins cache and window in every layer); `decode_step` runs over a static cache
    (kv_cache.StaticCache, ColumnCache) the window's keys/values are written into in place, so no
    layer copies its cache (the PyTorch backend's step, the device round's)."""

    def __init__(self, cfg: MARConfig):
        super().__init__()
        self.cfg = cfg
        self.class_emb = nn.Embedding(cfg.num_classes, cfg.dim)
        self.z_proj = nn.Linear(cfg.token_dim, cfg.dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.seq_len + 1, cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.z_proj_ln = nn.LayerNorm(cfg.dim, eps=1e-6) if cfg.input_norm else None
        # MAR's learned unconditional embedding for classifier-free guidance: class id num_classes.
        self.fake_latent = nn.Parameter(torch.zeros(1, cfg.dim))

    def inputs(self, tokens: torch.Tensor, class_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first layer's input [B,W,D]: the class (or fake_latent) at position 0, z_proj(token)
        elsewhere, plus the position embedding; positions [B,W] (or [W]: the same for every row)."""
        b, w = tokens.shape[:2]
        if positions.dim() == 1:
            positions = positions[None].expand(b, w)
        null = (class_ids == self.cfg.num_classes)[:, None]
        labelled = self.class_emb(class_ids.clamp(max=self.cfg.num_classes - 1))
        cond = torch.where(null, self.fake_latent, labelled)[:, None, :]
        x = torch.where((positions == 0)[:, :, None], cond, self.z_proj(tokens))
        x = x + self.pos_embed[0, positions]
        return x if self.z_proj_ln is None else self.z_proj_ln(x)

    def decode_step(self, tokens: torch.Tensor, class_ids: torch.Tensor, positions: torch.Tensor,
                    attention_mask: torch.Tensor, cache: Cache,
                    run_layer: Optional[LayerCall] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """A window over `cache`, any kv_cache form: z [B,W,D] and the window's keys/values
        [L,2,B,H,W,hd] (over a StaticCache a view of its scratch columns; over a ColumnCache None:
        they already sit at their columns).

        attention_mask [B,W,columns] bool, columns as the cache form reads them (StaticCache: its
        C cache columns then the window's W; ColumnCache: the buffer's S columns); `run_layer` runs
        each block (a compiled function), default eagerly."""
        x = self.inputs(tokens, class_ids, positions)
        x, present = run_layers(self.blocks, x, None, None, attention_mask[:, None], cache, run_layer)
        return self.norm(x), present

    def step(self, tokens: torch.Tensor, class_ids: torch.Tensor, positions: torch.Tensor,
             past_k: torch.Tensor, past_v: torch.Tensor,
             attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One window after P cached columns, every row (image, or CFG twin) with its own positions.

        tokens [B,W,C] float (ignored where positions == 0), class_ids [B] int64 (num_classes:
        the unconditional row, MAR's fake_latent), positions [B,W] int64 (each row's absolute
        positions; [W]: the same for every row), past_k/past_v [L,B,H,P,hd],
        attention_mask [B,W,P+W] bool (True = may attend; column j < P is cache column j, column
        P + w window slot w; None: every row sees the whole cache and the window causally, the
        training layout). Returns z [B,W,D] and the window's present_k/present_v [L,B,H,W,hd].
        """
        b, w, p = tokens.shape[0], tokens.shape[1], past_k.shape[3]
        if attention_mask is None:
            key_pos = torch.arange(p + w, device=tokens.device)
            causal = key_pos[None, :] <= (p + torch.arange(w, device=tokens.device))[:, None]
            attention_mask = causal[None].expand(b, w, p + w)
        z, present = self.decode_step(tokens, class_ids, positions, attention_mask, SplitCache(past_k, past_v))
        return z, present[:, 0], present[:, 1]

    def empty_cache(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.cfg.n_layer, batch, self.cfg.n_head, 0, self.cfg.head_dim)
        return torch.zeros(shape), torch.zeros(shape)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    """MAR's sinusoidal timestep embedding followed by an MLP."""

    def __init__(self, width: int, freq_dim: int = 64):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class ResBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x, c):
        shift, scale, gate = self.adaLN_modulation(c).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, width: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    """MAR's diffusion MLP: ε̂(x_t, t, z). Rows are independent (one row = one token)."""

    def __init__(self, cfg: MARConfig):
        super().__init__()
        w = cfg.head_width
        self.time_embed = TimestepEmbedder(w, cfg.head_freq_dim)
        self.cond_embed = nn.Linear(cfg.dim, w)
        self.input_proj = nn.Linear(cfg.token_dim, w)
        self.res_blocks = nn.ModuleList(ResBlock(w) for _ in range(cfg.head_depth))
        self.final_layer = FinalLayer(w, cfg.token_dim)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """x [R,C] noisy token, t [R] int64 step index (0 = the last step), z [R,D] -> ε̂ [R,C]."""
        c = self.time_embed(t) + self.cond_embed(z)
        h = self.input_proj(x)
        for block in self.res_blocks:
            h = block(h, c)
        return self.final_layer(h, c)


class DiffLoss(nn.Module):
    """Holds the head under MAR's name (`diffloss.net`), so the state_dict keys match MAR's."""

    def __init__(self, cfg: MARConfig):
        super().__init__()
        self.net = SimpleMLPAdaLN(cfg)


class MAR(nn.Module):
    """Transformer + diffusion head of one continuous model (target or draft)."""

    def __init__(self, cfg: MARConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = MARTransformer(cfg)
        self.diffloss = DiffLoss(cfg)

    def head(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.diffloss.net(x, t, z)


# The random-weight pair `specrt export --family continuous --random-weights` writes: an 8×8
# grid of 16-channel tokens (MAR's KL-16 token width), a 16-step cosine chain, draft ~4x cheaper.
RANDOM_TARGET = MARConfig(token_dim=16, seq_len=64, dim=128, n_layer=4, n_head=4, head_width=128,
                          head_depth=3, diffusion_steps=16)
RANDOM_DRAFT = MARConfig(token_dim=16, seq_len=64, dim=64, n_layer=2, n_head=4, head_width=64,
                         head_depth=2, diffusion_steps=16)


def random_mar(cfg: MARConfig, seed: int, scale: float = 1.0) -> MAR:
    """A MAR with random weights (tests, tiny bundles): default init, plus random pos/class
    embeddings and non-zero adaLN weights so every input matters (scale multiplies them)."""
    torch.manual_seed(seed)
    model = MAR(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "adaLN_modulation" in name or name.endswith("pos_embed") or "final_layer.linear" in name:
                p.copy_(torch.randn_like(p) * 0.2 * scale)
    return model
