"""The PyTorch backend of the continuous family: runs export/mar's modules in place of the graphs.

Used by the tests as the reference for the onnxruntime graphs, and by anyone who wants the
same bundle on torch (load_torch_runner rebuilds the modules from the bundle's weights).
torch is imported lazily so the runtime imports without it.
"""
from __future__ import annotations

from typing import Any


from specrt.lazy import require
from specrt.runtime.families.continuous.runner import ContinuousRunner, ContinuousSpec


def spec_of(cfg: Any) -> ContinuousSpec:
    """The runtime spec of an models.mar.model.MARConfig."""
    return ContinuousSpec(token_dim=cfg.token_dim, seq_len=cfg.seq_len, num_classes=cfg.num_classes,
                          n_layer=cfg.n_layer, n_head=cfg.n_head, head_dim=cfg.head_dim, hidden=cfg.dim,
                          diffusion_steps=cfg.diffusion_steps, schedule=cfg.schedule,
                          beta_start=cfg.beta_start, beta_end=cfg.beta_end)


class TorchContinuousRunner(ContinuousRunner):
    """A ContinuousRunner over an models.mar.model.MAR module (CPU, float32)."""

    def __init__(self, model: Any):
        super().__init__(spec_of(model.cfg))
        self.torch = require("torch", "the torch backend")
        self.model = model.eval()

    def _transformer(self, tokens, class_ids, positions, mask, past_k, past_v):
        torch = self.torch
        with torch.inference_mode():
            z, k, v = self.model.transformer.step(torch.from_numpy(tokens), torch.from_numpy(class_ids),
                                                  torch.from_numpy(positions), torch.from_numpy(past_k),
                                                  torch.from_numpy(past_v), torch.from_numpy(mask))
        return z.numpy(), k.numpy(), v.numpy()

    def _head(self, x, t, z):
        torch = self.torch
        with torch.inference_mode():
            return self.model.head(torch.from_numpy(x), torch.from_numpy(t), torch.from_numpy(z)).numpy()


def torch_runners(target: Any, draft: Any | None = None) -> tuple[TorchContinuousRunner, TorchContinuousRunner | None]:
    """Runners for a target and (optionally) a draft MAR module."""
    return TorchContinuousRunner(target), (TorchContinuousRunner(draft) if draft is not None else None)


