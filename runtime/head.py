"""The sampling head: raw model logits -> the sampling distribution and one draw per row, on the device.

Why a head: the speculative loop needs, per step, the probabilities of a few drafted tokens, a
draw from a few rows and now and then one whole row (a residual). Turning W·V logits into
probabilities on the host costs more than the tiny models' forwards themselves, and on a GPU
it would move W·V numbers per step. So every step graph ends in this head (specrt.export
exports it; the PyTorch backend runs the very same module), and the host reads O(W + V).

    guided   = mix @ logits            mix [images, batch]: CFG s·cond + (1 − s)·uncond, over T
    probs    = softmax(guided)         [images, window, vocab], float32
    draws    = #{v : cdf_v <= u·cdf_V} [images, window] int32: inverse CDF with one uniform per row

`mix` folds classifier-free guidance (LlamaGen's u + (c − u)·s) and the temperature into one
matrix (specrt.runtime.sampling.guidance_mix builds it), so the graph has no batch-dependent
branches. Top-k, top-p and greedy decoding are applied by the host on the rows it reads
(specrt.runtime.sampling.restrict); the draw is the same formula as sampling.inverse_cdf.
This module needs torch; the runtime imports it only from the PyTorch backend.
"""
from __future__ import annotations

import torch
from torch import nn


class SamplingHead(nn.Module):
    """(logits [B, W, V], mix [I, B], uniforms [I, W]) -> (probs [I, W, V] f32, draws [I, W] int32)."""

    def forward(self, logits: torch.Tensor, mix: torch.Tensor, uniforms: torch.Tensor):
        probs = self.distribution(logits, mix)
        vocab = probs.shape[-1]
        cdf = torch.cumsum(probs, dim=-1)
        threshold = uniforms.float() * cdf[:, :, -1]
        # counted in float32 (exact below 2^24) so TensorRT needs no integer reduction
        below = (cdf <= threshold.unsqueeze(-1)).float().sum(dim=-1)
        draws = torch.clamp(below, max=float(vocab - 1)).to(torch.int32)
        return probs, draws

    @staticmethod
    def distribution(logits: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
        """probs [I, W, V] without the draw: for a graph that ranks rows instead of sampling them
        (runtime/chain.py DraftGrowth, a dynamic tree's top-k children)."""
        batch, window, vocab = logits.shape
        flat = logits.float().reshape(batch, window * vocab)
        guided = torch.matmul(mix.float(), flat).reshape(mix.shape[0], window, vocab)
        return torch.softmax(guided, dim=-1)


def apply_head(logits: torch.Tensor, mix: torch.Tensor, uniforms: torch.Tensor):
    """Run the head once (a module-free call for the backends)."""
    return _HEAD(logits, mix, uniforms)


_HEAD = SamplingHead()
