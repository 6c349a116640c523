"""A PyTorch step's outputs left on the device, crossing to the host only as far as they are read.

The sampling head runs on the model's device, so a step's probabilities [images, W, V] and
draws [images, W] are born there; verification reads a few entries of them, or one row at a
rejection. DeviceRows and DeviceDraws wrap those tensors behind the numpy-like surface
verification uses (indexing, np.asarray, gathers, stacking), counting every number and
synchronisation that crosses on the runner that made them (its `host_numbers`, `host_syncs`)
and sending indices through its page-locked staging. They live apart from the runner
(torch_backend.py) because they are what the rest of the runtime holds: verification
(runtime/verification) and the methods read them without knowing a runner.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from specrt.lazy import require


def _torch():
    return require("torch", "the torch backend")


class DeviceRows:
    """Device-resident probabilities [..., V] that cross to the host only as far as they are read.

    Indexing down to rows stays on the device; an entry (`row[token]`) or a gather
    (`row[tokens]`) of a row comes back as numbers; numpy functions see the whole row through
    __array__ (a residual needs it). `copy()` clones on the device, so a kept row survives
    the runner's next steps like a host copy would.
    """

    def __init__(self, tensor: Any, meter: Any = None):
        self.tensor = tensor
        self.meter = meter  # the runner: its `host_numbers` counts every number read here

    def _fetched(self, part: Any) -> np.ndarray:
        if self.meter is not None:
            self.meter.host_numbers += int(part.numel())
            self.meter.host_syncs += 1
        if part.dtype == _torch().float64:  # restricted rows (top-k, greedy): their own numbers
            return part.cpu().numpy()
        return part.float().cpu().numpy().astype(np.float64)  # 4 bytes a number cross, not 8

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def ndim(self) -> int:
        return self.tensor.dim()

    def __len__(self) -> int:
        return int(self.tensor.shape[0])

    def __getitem__(self, index: Any) -> Any:
        index = _send_indices([index if isinstance(index, tuple) else (index,)], self.tensor.device, self.meter)[0]
        part = self.tensor[index if len(index) > 1 else index[0]]
        if part.dim() == 0:
            return float(self._fetched(part))
        if self.tensor.dim() == 1:  # gathered entries of one row: a few numbers, to the host
            return self._fetched(part)
        return DeviceRows(part, self.meter)

    @property
    def array(self) -> Any:
        """The tensor itself: runtime.verification runs a batch's chain tests and draws on it in place."""
        return self.tensor

    def holding(self, tensor: Any) -> "DeviceRows":
        """Other rows on this device read through the same meter (restricted rows)."""
        return DeviceRows(tensor, self.meter)

    def send(self, host: np.ndarray, use: str = "verification") -> Any:
        """A host array on this block's device (what verification sends: tokens, uniforms; host rows
        stacked with device ones): through the runner's page-locked staging for `use` where it has
        one (no wait), else one copy that waits."""
        if hasattr(self.meter, "send_to_device"):
            return self.meter.send_to_device(host, use)
        if self.meter is not None:
            self.meter.host_syncs += 1
        return _torch().from_numpy(np.ascontiguousarray(host)).to(self.tensor.device)

    def receive(self, array: Any) -> np.ndarray:
        """A device array on the host, as it is (verification's outcomes: integers), in one read."""
        if self.meter is not None:
            self.meter.host_numbers += int(array.numel())
            self.meter.host_syncs += 1
        return array.cpu().numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self._fetched(self.tensor)
        return host if dtype is None else host.astype(dtype)

    def copy(self) -> "DeviceRows":
        return DeviceRows(self.tensor.clone(), self.meter)

class DeviceDraws:
    """A step's draws [images, W] left on the device (ModelRunner.draws_to_host cleared: a step whose
    draws a restriction redraws, so they are usually never read); used as numpy (indexing, tolist,
    np.asarray) they are read to the host once, on first use. A copy on the device: valid whatever
    the runner does next."""

    def __init__(self, tensor: Any, meter: Any = None):
        self.tensor = tensor
        self.meter = meter
        self._host: Optional[np.ndarray] = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    def _read(self) -> np.ndarray:
        if self._host is None:
            self._host = self.tensor.cpu().numpy().astype(np.int64)
            if self.meter is not None:
                self.meter.host_numbers += self._host.size
                self.meter.host_syncs += 1
        return self._host

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self._read()
        return host if dtype is None else host.astype(dtype)

    def __getitem__(self, index: Any) -> Any:
        return self._read()[index]

    def tolist(self) -> list:
        return self._read().tolist()


def _send_indices(indices: Sequence[tuple], device: Any, meter: Any) -> list[tuple]:
    """Tuple indices with their integer arrays on `device`, all of them in one copy: each
    tuple's arrays broadcast together (as advanced indexing broadcasts them anyway), everything
    flattened into one int64 buffer, sent, and cut back into views there. On a GPU every copy
    from pageable memory waits, so one copy instead of one per array, and through the runner's
    page-locked staging (torch_backend.TorchRunner._staged) where the meter is a runner: no wait at all."""
    shaped = [np.broadcast_arrays(*[part for part in index if isinstance(part, np.ndarray)])
              if any(isinstance(part, np.ndarray) for part in index) else [] for index in indices]
    if not any(shaped):
        return list(indices)
    host = np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for arrays in shaped for a in arrays])
    if hasattr(meter, "send_to_device"):
        sent = meter.send_to_device(host, "indices")
    else:
        sent = _torch().from_numpy(host).to(device)
        if meter is not None:
            meter.host_syncs += 1
    out, offset = [], 0
    for index, arrays in zip(indices, shaped):
        views = []
        for array in arrays:
            views.append(sent[offset:offset + array.size].view(array.shape))
            offset += array.size
        parts = iter(views)
        out.append(tuple(next(parts) if isinstance(part, np.ndarray) else part for part in index))
    return out
