"""How many operations one decode step runs: GPU kernels on CUDA, compute operations on a CPU.

Why count: a decode step of a LlamaGen-size model at batch 1 is bound by memory bandwidth and by
kernel count, not by arithmetic. Every kernel costs a few microseconds whatever it does (2,005
kernels made an eager GPT-XL step 8.9x its bandwidth floor on an H100), so the count tracks the
step's time on a GPU, and a machine without a GPU can still watch it: on a CPU the same step's
compute operations (each a kernel on a GPU) are counted from the profiler.

On CUDA: every kernel the profiler saw on the device. On a CPU: every operator called from
Python (not from inside another operator) that computes something, plus every kernel a
compiled graph generated (inductor's fused C++ kernels, recorded by name where
`profile_generated_kernels()` was called before compiling); view and metadata operators (reshape,
transpose, slice...) move no data and are not counted.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from specrt.lazy import require

# aten operators that only make a view or read metadata: no kernel on any device
_VIEW_OPS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::transpose", "aten::t", "aten::permute",
    "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::as_strided",
    "aten::split", "aten::split_with_sizes", "aten::narrow", "aten::unbind", "aten::flatten", "aten::detach",
    "aten::alias", "aten::lift_fresh", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::resolve_conj", "aten::resolve_neg", "aten::view_as_real", "aten::view_as_complex", "aten::chunk",
    "aten::unflatten", "aten::contiguous", "aten::result_type", "aten::is_nonzero", "aten::item",
    "aten::_local_scalar_dense", "aten::set_", "aten::numpy_T", "aten::movedim",
})
_GENERATED_KERNEL_PREFIXES = ("cpp_fused", "triton_", "cpp_kernel")


def step_ops(run: Callable[[], Any], device: str) -> int:
    """Operations one call of `run` (a warmed-up step) executes: kernels on CUDA, compute
    operations on a CPU (the module docstring)."""
    torch = require("torch", "specrt bench --profile-arch")
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with _native_stderr_silenced(), profile(activities=activities) as prof:
        run()
        if on_gpu:
            torch.cuda.synchronize()
    events = prof.events()
    if on_gpu:
        return sum(1 for event in events if _on_device(event))
    return sum(1 for event in events if _is_compute(event))


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """The process's stderr closed to native code for the block: the profiler's C++ side prints a
    line when it starts and stops (torch 2.13), which would land in the middle of a bench table.
    The step being profiled ran before, so nothing else is expected there."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _on_device(event: Any) -> bool:
    kind = str(getattr(event, "device_type", ""))
    return kind.endswith("CUDA") and not event.name.startswith(("Memcpy", "Memset"))


def _is_compute(event: Any) -> bool:
    if event.name.startswith(_GENERATED_KERNEL_PREFIXES):
        return True
    if not event.name.startswith("aten::") or event.name in _VIEW_OPS:
        return False
    parent = event.cpu_parent
    while parent is not None:  # called by another operator: part of that operator's work
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def profile_generated_kernels() -> None:
    """Make inductor's CPU kernels compiled from now on record themselves in the profiler (a
    name per call), so step_ops counts each fused kernel as one operation."""
    require("torch", "specrt bench --profile-arch")._inductor.config.cpp.enable_kernel_profile = True
