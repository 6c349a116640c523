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
    """A ContinuousRunner over an models.mar.model.MAR module (float32), on the CPU or on `device`
    (the module is moved there). Its module is what a device round (rounds.py) runs: the host
    loop's steps here copy every input in and every output back; a round's stay on the device."""

    device_rounds = True

    def __init__(self, model: Any, device: Any = None):
        super().__init__(spec_of(model.cfg))
        self.torch = require("torch", "the torch backend")
        self.model = model.eval() if device is None else model.eval().to(device)
        self.device = next(self.model.parameters()).device
        self.on_accelerator = self.device.type != "cpu"
        self.cuda_graphs = self.device.type == "cuda"  # a round there is captured once and replayed

    def _transformer(self, tokens, class_ids, positions, mask, past_k, past_v):
        with self.torch.inference_mode():
            z, k, v = self.model.transformer.step(*(self._in(a) for a in (tokens, class_ids, positions, past_k, past_v,
                                                                          mask)))
        return self._out(z), self._out(k), self._out(v)

    def _head(self, x, t, z):
        with self.torch.inference_mode():
            return self._out(self.model.head(self._in(x), self._in(t), self._in(z)))

    def _in(self, array: Any) -> Any:
        return self.torch.from_numpy(array).to(self.device)

    @staticmethod
    def _out(tensor: Any) -> Any:
        return tensor.cpu().numpy()


def torch_runners(target: Any, draft: Any | None = None,
                  device: Any = None) -> tuple[TorchContinuousRunner, TorchContinuousRunner | None]:
    """Runners for a target and (optionally) a draft MAR module, on the CPU or on `device`."""
    return TorchContinuousRunner(target, device), (TorchContinuousRunner(draft, device) if draft is not None else None)


