"""The PyTorch backend of the continuous family: runs models.mar's modules in place of the graphs.

Used by the tests as the reference for the onnxruntime graphs, and by anyone who wants the
same bundle on torch (load_torch_runner rebuilds the modules from the bundle's weights).
torch is imported lazily so the runtime imports without it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

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
    loop's steps here copy the window's inputs in and z back; a round's stay on the device.

    The cache stays on the module's device in one static buffer [L, 2, rows, H, capacity + W, hd]
    (models.kv_cache.StaticCache): a step writes its window's keys/values into the scratch columns
    after the capacity, in place, and attends over the buffer as it lies under the runner's mask
    spread over those columns, so no layer copies its cache; commit copies the accepted rows
    down. `_transformer`, the hook the exported graphs answer to, keeps the explicit form
    (export.mar.verify_bundle compares the two backends through it). `compile` runs each block
    compiled by torch.compile (runtime.backends.compiled_step), default off."""

    device_rounds = True
    steps_active_only = False  # the static buffer is attended as it lies: every row runs

    def __init__(self, model: Any, device: Any = None, compile: bool = False, compile_mode: str = "default"):
        super().__init__(spec_of(model.cfg))
        self.torch = require("torch", "the torch backend")
        self.model = model.eval() if device is None else model.eval().to(device)
        self.device = next(self.model.parameters()).device
        self.on_accelerator = self.device.type != "cpu"
        self.cuda_graphs = self.device.type == "cuda"  # a round there is captured once and replayed
        self.compiled = None  # compiled_step.CompiledStep where the blocks are compiled
        if compile:
            from specrt.runtime.backends.compiled_step import CompiledStep

            self.compiled = CompiledStep(compile_mode)
        self.run_layer = self.compiled.run_layer if self.compiled else None

    def _unallocated(self) -> None:
        super()._unallocated()
        self._kv: Any = None  # [L, 2, rows, H, capacity + scratch, hd] on the device, made by the first batch
        self._rows = 0

    def _transformer(self, tokens, class_ids, positions, mask, past_k, past_v):
        with self.torch.inference_mode():
            z, k, v = self.model.transformer.step(*(self._in(a) for a in (tokens, class_ids, positions, past_k, past_v,
                                                                          mask)))
        return self._out(z), self._out(k), self._out(v)

    def _head(self, x, t, z):
        with self.torch.inference_mode():
            return self._out(self.model.head(self._in(x), self._in(t), self._in(z)))

    # ---- the cache, kept on the device and written in place ---------------------------------

    def _new_cache(self, rows: int) -> None:
        self._rows = rows
        if self._kv is None or self._kv.shape[2] != rows:
            self._kv = self._buffer(rows, 1)

    def _buffer(self, rows: int, scratch: int) -> Any:
        """A zeroed buffer [L, 2, rows, H, capacity + scratch, hd] in the module's dtype."""
        spec, parameter = self.spec, next(self.model.parameters())
        shape = (spec.n_layer, 2, rows, spec.n_head, self.capacity + scratch, spec.head_dim)
        return self.torch.zeros(shape, dtype=parameter.dtype, device=self.device)

    def _static_cache(self, width: int) -> Any:
        """The buffer as a step of `width` slots writes it, its scratch widened where it is narrower."""
        from specrt.models.kv_cache import StaticCache

        capacity = self.capacity
        if self._kv.shape[4] < capacity + width:
            grown = self._buffer(self._rows, width)
            grown[:, :, :, :, :capacity] = self._kv[:, :, :, :, :capacity]
            self._kv = grown
        return StaticCache(self._kv, capacity)

    def _run_window(self, tokens, positions, mask, past):
        width, capacity = tokens.shape[1], self.capacity
        spread = np.zeros((len(tokens), width, capacity + width), dtype=bool)  # columns as the buffer lies
        spread[:, :, :past] = mask[:, :, :past]
        spread[:, :, capacity:] = mask[:, :, past:]
        with self.torch.inference_mode():
            cache = self._static_cache(width)
            z, self._present = self.model.transformer.decode_step(
                self._in(tokens), self._in(self._class_ids), self._in(positions), self._in(spread), cache,
                self.run_layer)
        return self._out(z)

    def _write_rows(self, rows, columns, slots):
        rows, columns, slots = (a if isinstance(a, slice) else self.torch.as_tensor(a, device=self.device)
                                for a in (rows, columns, slots))
        with self.torch.inference_mode():
            self._kv[:, :, rows, :, columns] = self._present[:, :, rows, :, slots]

    def _keep_rows(self, rows):
        with self.torch.inference_mode():
            self._kv = self._kv[:, :, self.torch.as_tensor(rows, device=self.device)]
        self._rows = len(rows)

    # ---- host arrays in, host arrays out ------------------------------------------------------

    def _in(self, array: Any) -> Any:
        return self.torch.from_numpy(array).to(self.device)

    @staticmethod
    def _out(tensor: Any) -> Any:
        return tensor.cpu().numpy()


def torch_runners(target: Any, draft: Any | None = None, device: Any = None,
                  compile: bool = False) -> tuple[TorchContinuousRunner, TorchContinuousRunner | None]:
    """Runners for a target and (optionally) a draft MAR module, on the CPU or on `device`, their
    blocks compiled where `compile`."""
    def runner(model: Any) -> TorchContinuousRunner:
        return TorchContinuousRunner(model, device, compile)
    return runner(target), (runner(draft) if draft is not None else None)


