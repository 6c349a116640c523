"""CPU threads: one meaning on every backend — the intra-op threads of each model call.

Why it matters: a thread count is part of every speed a user measures (the same GPT-B-size
graphs took 9.8 s per image on onnxruntime with 2 threads), and on a busy machine a library's
own default can be over 10x slower than 1 thread. So every command that runs a model takes
`--threads N`, and `Pipeline.from_bundle(threads=)` / `Pipeline.from_torch(threads=)` take it
too, with this meaning everywhere:

- onnxruntime: `intra_op_num_threads = N` per session (inter-op 1, idle workers sleep);
- torch: `torch.set_num_threads(N)` (process-wide: torch has no per-module setting);
- TensorRT engines run on the GPU; N then only matters for the CPU work around them.

Default (None, the CLI without --threads): one thread per CPU this process may use
(`default_threads`), on both libraries. Through the Python API, None leaves each library at
its own default, which is also one thread per core, unless the process has changed it.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from specrt import validation

HELP = ("CPU threads per model call (intra-op, the same for onnxruntime and torch). "
        "Default: one per CPU this process may use")


def default_threads() -> int:
    """The CPUs this process may run on (its affinity mask: taskset / cgroup cpusets count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def resolve(threads: Optional[int], name: str = "--threads") -> int:
    """A checked thread count: the given one (1 to the machine's CPUs, one line if not), else default_threads()."""
    return default_threads() if threads is None else validation.threads(name, threads)


def checked(ctx: Any, param: Any, value: Optional[int]) -> Optional[int]:
    """Click callback for every `--threads N` flag: validation.threads before anything loads
    (one line and exit 2 for 0, a negative count or more threads than the machine has CPUs)."""
    return None if value is None else validation.threads(param.opts[0], value)


def checked_or_zero(ctx: Any, param: Any, value: Optional[int]) -> Optional[int]:
    """checked, for the flags whose 0 means "the library's default" (specrt serve's build step)."""
    return None if value is None else validation.threads(param.opts[0], value, zero_means_default=True)


def set_torch_threads(threads: Optional[int]) -> None:
    """torch's intra-op threads (process-wide); None leaves them alone; no-op without torch."""
    if threads is None:
        return
    threads = validation.threads("threads", threads)
    try:
        import torch
    except ImportError:  # a bundle on onnxruntime needs no torch
        return
    torch.set_num_threads(threads)
