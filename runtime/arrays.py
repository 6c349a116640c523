"""Which array library a block of rows lives in, so that each verification formula is written once.

The host verifies numpy rows; the PyTorch backend's device round (runtime/rounds) verifies on
torch tensors where they live, with the same formulas. `namespace` gives the array namespace of an
array — numpy's or torch's own functions under the Python array API's names: the formulas in
runtime/verification/ and runtime/sampling.py call `xp.where`, `xp.cumulative_sum`, ... on it,
and numpy-only shortcuts stay confined to the one-row fast paths. Both namespaces are thin tables
of the libraries' own functions: a wrapper that asks torch for a result type (array-api-compat's
does, for a Python number) breaks a torch.compile graph, and the round must compile whole.
torch is never imported here: its namespace is made from the module of a tensor already made.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np


class _Numpy:
    """numpy's own functions under the array API names the formulas call. numpy 1.x lacks some of
    them, and array-api-compat's numpy wrappers cost several µs a call: on the host's per-round
    path, between two graph runs, that doubled a batch's chain verification. So host arrays get
    numpy directly, as torch tensors get torch (_Torch)."""

    float64, int64, int8, bool = np.float64, np.int64, np.int8, np.bool_
    where, maximum, minimum = staticmethod(np.where), np.maximum, np.minimum
    argmin, argmax, log = staticmethod(np.argmin), staticmethod(np.argmax), staticmethod(np.log)
    sum, max, reshape, stack = staticmethod(np.sum), staticmethod(np.max), staticmethod(np.reshape), staticmethod(np.stack)

    @staticmethod
    def astype(array: np.ndarray, dtype: Any, copy: bool = False) -> np.ndarray:
        return array.astype(dtype, copy=copy)

    @staticmethod
    def cumulative_sum(array: np.ndarray, axis: int) -> np.ndarray:
        return np.cumsum(array, axis=axis)

    @staticmethod
    def concat(arrays: Any, axis: int = 0) -> np.ndarray:
        return np.concatenate(arrays, axis=axis)

    @staticmethod
    def asarray(array: Any, device: Any = None) -> np.ndarray:
        return np.asarray(array)

    @staticmethod
    def arange(count: int, device: Any = None) -> np.ndarray:
        return np.arange(count)

    @staticmethod
    def zeros(shape: Any, dtype: Any = np.float64, device: Any = None) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)


NUMPY = _Numpy()


def namespace(array: Any) -> Any:
    """The array namespace of `array`: numpy's own functions (_Numpy) for host arrays and numbers,
    torch's (_Torch) for a torch tensor."""
    if is_host(array):
        return NUMPY
    global _TORCH
    if _TORCH is None:
        _TORCH = _Torch(sys.modules["torch"])
    return _TORCH


class _Torch:
    """torch's own functions under the array API names the formulas call (see the module's
    docstring for why not array-api-compat). A Python number as the second operand of maximum or
    minimum is a clamp, which torch.compile traces without asking for a result type."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.float64, self.int64, self.int8, self.bool = torch.float64, torch.int64, torch.int8, torch.bool
        self.where, self.reshape, self.argmin, self.argmax = torch.where, torch.reshape, torch.argmin, torch.argmax
        self.log = torch.log

    def astype(self, array: Any, dtype: Any, copy: bool = False) -> Any:
        return array.to(dtype, copy=copy)

    def cumulative_sum(self, array: Any, axis: int) -> Any:
        return self.torch.cumsum(array, dim=axis)

    def concat(self, arrays: Any, axis: int = 0) -> Any:
        return self.torch.cat(list(arrays), dim=axis)

    def stack(self, arrays: Any, axis: int = 0) -> Any:
        return self.torch.stack(list(arrays), dim=axis)

    def asarray(self, array: Any, device: Any = None) -> Any:
        return self.torch.as_tensor(array, device=device)

    def arange(self, count: int, device: Any = None) -> Any:
        return self.torch.arange(count, device=device)

    def zeros(self, shape: Any, dtype: Any = None, device: Any = None) -> Any:
        return self.torch.zeros(shape, dtype=dtype or self.float64, device=device)

    def sum(self, array: Any, axis: Any = None, keepdims: bool = False) -> Any:
        return array.sum() if axis is None else array.sum(dim=axis, keepdim=keepdims)

    def max(self, array: Any, axis: Any = None, keepdims: bool = False) -> Any:
        return array.max() if axis is None else array.amax(dim=axis, keepdim=keepdims)

    def maximum(self, a: Any, b: Any) -> Any:
        return self._pair(a, b, self.torch.maximum, "min")

    def minimum(self, a: Any, b: Any) -> Any:
        return self._pair(a, b, self.torch.minimum, "max")

    def _pair(self, a: Any, b: Any, both: Any, bound: str) -> Any:
        if not _is_tensor(b):
            return self.torch.clamp(a, **{bound: b})
        if not _is_tensor(a):
            return self.torch.clamp(b, **{bound: a})
        return both(a, b)


_TORCH: Any = None


def kth_largest(array: Any, k: int) -> Any:
    """The k-th largest entry of each row [..., V] as [..., 1]: an entry of the row itself, so
    every library gives the same number (numpy partitions, torch takes its top k)."""
    if is_host(array):
        return np.partition(array, -k, axis=-1)[..., -k, None]
    return array.topk(k, dim=-1).values[..., -1:]


def descending(array: Any) -> tuple[Any, Any]:
    """(each row [..., V] sorted largest first, the order it was taken in): a stable sort, equal
    entries in index order, in numpy (argsort of the negated rows) and torch alike."""
    if is_host(array):
        order = descending_order(array)
        return np.take_along_axis(array, order, axis=-1), order
    values, order = array.sort(dim=-1, descending=True, stable=True)
    return values, order


def descending_order(array: Any) -> Any:
    """descending's order alone (where the sorted values are not needed, numpy skips gathering them)."""
    if is_host(array):
        return np.argsort(-array, axis=-1, kind="stable")
    return array.sort(dim=-1, descending=True, stable=True)[1]


def unsorted(values: Any, order: Any) -> Any:
    """`values` [..., V], given in the order `descending` returned, put back in the rows' own order."""
    if is_host(values):
        out = np.empty_like(values)
        np.put_along_axis(out, order, values, axis=-1)
        return out
    return values.new_empty(values.shape).scatter_(-1, order, values)


def _is_tensor(array: Any) -> bool:
    tensor = _tensor_type()
    return tensor is not None and isinstance(array, tensor)


def _tensor_type() -> Any:
    """torch.Tensor once torch is imported (by whoever made a tensor), else None: an isinstance
    test torch.compile traces, where a test of the type's module name breaks its graph."""
    global _TENSOR
    if _TENSOR is None and "torch" in sys.modules:
        _TENSOR = sys.modules["torch"].Tensor
    return _TENSOR


_TENSOR: Any = None


def as_array(array: Any) -> Any:
    """A torch tensor as it is; anything else (lists, numbers, device views that read themselves
    through __array__) as a numpy array."""
    return array if _is_tensor(array) else np.asarray(array)


def is_host(array: Any) -> bool:
    """True for numpy arrays and plain numbers: the host's own, no transfer involved."""
    return type(array) is np.ndarray or not _is_tensor(array)


def like(host: np.ndarray, array: Any) -> Any:
    """The host array `host` (a rule's constant table: ω, LANTERN's neighbours) in `array`'s
    library and on its device: `host` itself for a host array. Rules cache the result per device
    (`Constants`), so a table crosses once per generate call, not once per round."""
    if is_host(array):
        return host
    return namespace(array).asarray(host, device=array.device)


class Constants:
    """Per-device copies of a rule's host tables: `get(name, table, array)` is like(table(), array),
    made once for each device it is asked for. `table` is a function, called on the first request
    only: a round traced by torch.compile finds the copy and never touches the numpy table (traced,
    it would become a host tensor inside the graph)."""

    def __init__(self) -> None:
        self._copies: dict[tuple[str, str], Any] = {}

    def get(self, name: str, table: Any, array: Any) -> Any:
        if is_host(array):
            return table()
        key = name, str(array.device)
        if key not in self._copies:
            self._copies[key] = like(table(), array)
        return self._copies[key]
