"""The continuous tokenizer: a KL autoencoder whose latent grid is the MAR model's token sequence.

Same layout as MAR's own tokenizer (LTH14/mar models/vae.py, LDM's AutoencoderKL): `encoder`
-> `quant_conv` (2C channels: mean and log-variance) -> a Gaussian posterior; `post_quant_conv`
-> `decoder`. The convolutional encoder/decoder are LlamaGen's (models/llamagen_vq.py), which
are the same taming/LDM blocks, so one implementation serves both tokenizers.

Tokens are the posterior's latents in raster order, multiplied by `scale_factor` (MAR's
`vae_embed_dim`/0.2325 convention: latents scaled to about unit variance, which is what the
diffusion head is trained on). The bundle ships only the decoder half (`TokenDecoder`):
tokens [N, seq_len, C] -> images [N, 3, H, W] in about [-1, 1].
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn as nn

from specrt.models.llamagen_vq import Decoder, Encoder, VQConfig


@dataclass
class AEConfig:
    """The conv trunk's widths (LlamaGen VQ's names) and the latent: `latent_channels` per token."""

    latent_channels: int = 4
    ch: int = 16
    ch_mult: tuple[int, ...] = (1, 2, 2)
    z_channels: int = 32
    num_res_blocks: int = 1
    norm_groups: int = 8
    image_size: int = 32
    scale_factor: float = 1.0   # tokens = latents · scale_factor (set after training)

    def __post_init__(self) -> None:
        self.ch_mult = tuple(self.ch_mult)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def grid(self) -> int:
        return self.image_size // self.downsample

    def trunk(self) -> VQConfig:
        return VQConfig(ch=self.ch, ch_mult=self.ch_mult, z_channels=self.z_channels,
                        num_res_blocks=self.num_res_blocks, norm_groups=self.norm_groups, codebook_embed_dim=1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AEConfig":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def to_tokens(latents: torch.Tensor) -> torch.Tensor:
    """[N, C, h, w] -> [N, h·w, C] (raster order)."""
    return latents.flatten(2).transpose(1, 2)


def from_tokens(tokens: torch.Tensor, grid: int) -> torch.Tensor:
    """[N, h·w, C] -> [N, C, h, w]."""
    return tokens.transpose(1, 2).reshape(-1, tokens.shape[2], grid, grid)


class KLAutoencoder(nn.Module):
    """Encoder -> Gaussian posterior over C-channel latents -> decoder."""

    def __init__(self, cfg: AEConfig):
        super().__init__()
        self.cfg = cfg
        trunk = cfg.trunk()
        self.encoder = Encoder(trunk)
        self.decoder = Decoder(trunk)
        self.quant_conv = nn.Conv2d(cfg.z_channels, 2 * cfg.latent_channels, 1)
        self.post_quant_conv = nn.Conv2d(cfg.latent_channels, cfg.z_channels, 1)

    def posterior(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [N,3,H,W] -> (mean, std) of the latents [N,C,h,w] (log-variance clamped as LDM)."""
        mean, logvar = self.quant_conv(self.encoder(images)).chunk(2, dim=1)
        return mean, torch.exp(0.5 * logvar.clamp(-30.0, 20.0))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(latents))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training pass: (reconstruction of a posterior sample, KL to N(0, I) per latent element)."""
        mean, std = self.posterior(images)
        latents = mean + std * torch.randn_like(std)
        kl = 0.5 * (mean.pow(2) + std.pow(2) - 1.0 - 2.0 * torch.log(std)).mean()
        return self.decode(latents), kl

    def decoder_only(self) -> "TokenDecoder":
        return TokenDecoder(self.cfg, self.post_quant_conv, self.decoder)


class TokenDecoder(nn.Module):
    """The bundle's tokenizer decoder: tokens [N, seq_len, C] (scaled) -> images [N,3,H,W].

    Attribute names match KLAutoencoder's, so its `post_quant_conv.*` / `decoder.*` keys load."""

    def __init__(self, cfg: AEConfig, post_quant_conv: nn.Module | None = None, decoder: nn.Module | None = None):
        super().__init__()
        self.cfg = cfg
        self.post_quant_conv = post_quant_conv or nn.Conv2d(cfg.latent_channels, cfg.z_channels, 1)
        self.decoder = decoder or Decoder(cfg.trunk())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        latents = from_tokens(tokens, self.cfg.grid) / self.cfg.scale_factor
        return self.decoder(self.post_quant_conv(latents))
