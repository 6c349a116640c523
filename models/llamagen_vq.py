"""LlamaGen's VQ tokenizer (VQ-16 and scaled-down variants), trainable and exportable.

Module names follow FoundationVision/LlamaGen `tokenizer/tokenizer_image/vq_model.py`, so its
checkpoints load strictly; the numerics are the same (GroupNorm eps 1e-6, swish, nearest x2
upsampling + conv, attention at the lowest resolution, L2-normalised codebook). The
decoder side is also available alone (`VQDecoder`) because that is all a bundle ships:
codes int32 [B,h,w] -> image [B,3,H,W].
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class VQConfig:
    """LlamaGen's VQ ModelArgs; one ch_mult for encoder and decoder (as in VQ-8 / VQ-16)."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True  # keeps LlamaGen's `quantize.codebook_used` buffer
    commit_loss_beta: float = 0.25
    entropy_loss_ratio: float = 0.0
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    num_res_blocks: int = 2  # encoder; the decoder uses num_res_blocks + 1 per level
    dropout: float = 0.0
    norm_groups: int = 32
    in_channels: int = 3

    def __post_init__(self) -> None:
        self.ch_mult = tuple(self.ch_mult)
        for mult in self.ch_mult:
            if (self.ch * mult) % self.norm_groups:
                raise ValueError(f"norm_groups {self.norm_groups} must divide every level's channels (ch*mult = {self.ch * mult})")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


VQ_ARCHS: dict[str, VQConfig] = {
    "VQ-16": VQConfig(ch_mult=(1, 1, 2, 2, 4)),
    "VQ-8": VQConfig(ch_mult=(1, 2, 2, 4)),
}

USAGE_WINDOW = 65536  # LlamaGen's codebook_used buffer length


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, config: VQConfig):
        super().__init__()
        self.norm1 = nn.GroupNorm(config.norm_groups, in_ch, eps=1e-6)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = nn.GroupNorm(config.norm_groups, out_ch, eps=1e-6)
        self.dropout = nn.Dropout(config.dropout)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels, 1x1-conv projections."""

    def __init__(self, channels: int, config: VQConfig):
        super().__init__()
        self.norm = nn.GroupNorm(config.norm_groups, channels, eps=1e-6)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q = self.q(n).reshape(b, c, h * w).transpose(1, 2)  # [b, hw, c]
        k = self.k(n).reshape(b, c, h * w)  # [b, c, hw]
        v = self.v(n).reshape(b, c, h * w).transpose(1, 2)  # [b, hw, c]
        weights = torch.softmax(torch.bmm(q, k) * c**-0.5, dim=-1)
        out = torch.bmm(weights, v).transpose(1, 2).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    """Stride-2 conv with LlamaGen's asymmetric (right/bottom) zero padding."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Encoder(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mults, levels = config.ch, config.ch_mult, len(config.ch_mult)
        self.conv_in = nn.Conv2d(config.in_channels, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        block_in = ch
        for level, mult in enumerate(mults):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(config.num_res_blocks):
                block.res.append(ResnetBlock(block_in, ch * mult, config))
                block_in = ch * mult
                if level == levels - 1:
                    block.attn.append(AttnBlock(block_in, config))
            if level != levels - 1:
                block.downsample = Downsample(block_in)
            self.conv_blocks.append(block)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, config), AttnBlock(block_in, config),
                                  ResnetBlock(block_in, block_in, config)])
        self.norm_out = nn.GroupNorm(config.norm_groups, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, config.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level, block in enumerate(self.conv_blocks):
            for i, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[i](h)
            if level != len(self.conv_blocks) - 1:
                h = block.downsample(h)
        for layer in self.mid:
            h = layer(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    """conv_blocks[0] is the lowest resolution (with attention), as in LlamaGen."""

    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mults, levels = config.ch, config.ch_mult, len(config.ch_mult)
        block_in = ch * mults[-1]
        self.conv_in = nn.Conv2d(config.z_channels, block_in, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, config), AttnBlock(block_in, config),
                                  ResnetBlock(block_in, block_in, config)])
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(levels)):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(config.num_res_blocks + 1):
                block.res.append(ResnetBlock(block_in, ch * mults[level], config))
                block_in = ch * mults[level]
                if level == levels - 1:
                    block.attn.append(AttnBlock(block_in, config))
            if level != 0:
                block.upsample = Upsample(block_in)
            self.conv_blocks.append(block)
        self.norm_out = nn.GroupNorm(config.norm_groups, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, config.in_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for layer in self.mid:
            h = layer(h)
        for index, block in enumerate(self.conv_blocks):
            for i, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[i](h)
            if index != len(self.conv_blocks) - 1:
                h = block.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-codeword quantizer (cosine distance when l2-normalised) with VQGAN losses."""

    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.codebook_size, config.codebook_embed_dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / config.codebook_size, 1.0 / config.codebook_size)
            if config.codebook_l2_norm:
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))
        if config.codebook_show_usage:
            self.register_buffer("codebook_used", torch.zeros(USAGE_WINDOW))

    def codebook(self) -> torch.Tensor:
        """The codewords as used at lookup time [codebook_size, embed_dim]."""
        weight = self.embedding.weight
        return F.normalize(weight, dim=-1) if self.config.codebook_l2_norm else weight

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int [B,h,w] -> quantized latents [B,embed_dim,h,w]."""
        return F.embedding(codes, self.codebook()).permute(0, 3, 1, 2)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """z [B,C,h,w] -> (straight-through quantized [B,C,h,w], codes [B,h,w], losses)."""
        z = z.permute(0, 2, 3, 1)  # [B,h,w,C]
        if self.config.codebook_l2_norm:
            z = F.normalize(z, dim=-1)
        codebook = self.codebook()
        flat = z.reshape(-1, z.shape[-1])
        distances = flat.pow(2).sum(1, keepdim=True) + codebook.pow(2).sum(1)[None] - 2 * flat @ codebook.t()
        codes = distances.argmin(dim=1)
        z_q = codebook[codes].view(z.shape)
        losses = {
            "vq_loss": (z_q - z.detach()).pow(2).mean(),
            "commit_loss": self.config.commit_loss_beta * (z_q.detach() - z).pow(2).mean(),
            "entropy_loss": self.config.entropy_loss_ratio * entropy_loss(-distances)
            if self.config.entropy_loss_ratio > 0 else z.new_zeros(()),
        }
        if self.training and self.config.codebook_show_usage:
            losses["codebook_usage"] = self._track_usage(codes)
        z_q = z + (z_q - z).detach()  # straight-through gradient
        return z_q.permute(0, 3, 1, 2), codes.view(z.shape[:3]), losses

    @torch.no_grad()
    def _track_usage(self, codes: torch.Tensor) -> torch.Tensor:
        """Fraction of the codebook seen in the last USAGE_WINDOW codes (LlamaGen's monitor)."""
        n = min(codes.numel(), USAGE_WINDOW)
        self.codebook_used.copy_(torch.cat([self.codebook_used[n:], codes[-n:].float()]))
        return torch.tensor(torch.unique(self.codebook_used).numel() / self.config.codebook_size)


def entropy_loss(affinity: torch.Tensor, temperature: float = 0.01) -> torch.Tensor:
    """Per-sample entropy minus batch-average entropy: rewards confident, diverse code use."""
    logits = affinity.reshape(-1, affinity.shape[-1]) / temperature
    probs = torch.softmax(logits, dim=-1)
    log_probs = torch.log_softmax(logits + 1e-5, dim=-1)
    avg_probs = probs.mean(0)
    avg_entropy = -(avg_probs * torch.log(avg_probs + 1e-5)).sum()
    sample_entropy = -(probs * log_probs).sum(-1).mean()
    return sample_entropy - avg_entropy


class VQDecoder(nn.Module):
    """The decode half only: codes int [B,h,w] -> image [B,3,h*ds,w*ds] in about [-1,1].

    Attribute names match VQModel's, so a full VQ state_dict's `quantize.embedding`,
    `post_quant_conv.*` and `decoder.*` keys load into it directly.
    """

    def __init__(self, config: VQConfig, modules: Optional[tuple[nn.Module, nn.Module, nn.Module]] = None):
        super().__init__()
        self.config = config
        if modules is None:
            modules = (VectorQuantizer(config), nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1), Decoder(config))
        self.quantize, self.post_quant_conv, self.decoder = modules

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(self.quantize.lookup(codes)))

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """VQModel.decode_codes's name, so either serves the torch backend."""
        return self(codes)


class VQModel(nn.Module):
    """Encoder + quantizer + decoder, LlamaGen key layout."""

    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """images [B,3,H,W] in [-1,1] -> (quantized [B,embed_dim,h,w], codes [B,h,w], losses)."""
        return self.quantize(self.quant_conv(self.encoder(images)))

    def decode(self, quantized: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(quantized))

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int [B,h,w] -> images [B,3,h*downsample,w*downsample]."""
        return self.decode(self.quantize.lookup(codes))

    def decoder_only(self) -> VQDecoder:
        """A VQDecoder sharing this model's modules (for export)."""
        return VQDecoder(self.config, (self.quantize, self.post_quant_conv, self.decoder))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training pass: (reconstruction [B,3,H,W], quantizer losses). The caller adds the
        reconstruction / perceptual / adversarial terms it wants."""
        quantized, _, losses = self.encode(images)
        return self.decode(quantized), losses
