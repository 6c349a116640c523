"""The PyTorch backend's decode step compiled with torch.compile: one transformer block, shared.

Why: an eager decode step launches a kernel per small operation (RMSNorm in float32, RoPE, the
casts, residual adds: 2,005 kernels a GPT-XL step on an H100, 4.8 ms of GPU time against a
0.59 ms memory-bandwidth floor). Inductor fuses those into a few kernels per layer around the
matrix products, and the runner's CUDA graph (torch_backend.CapturedStep) replays the result
without Python.

Why one block and not the whole model: a LlamaGen-size model is 12-48 identical blocks. Compiled
whole (LlamaGen's own `--compile`), every block is traced and optimised again, 70-80 s per batch
size on an H100. Here the function that runs one block is compiled once and every layer calls
it with its own module (torch.compile lifts the module's weights to inputs), so the block's
kernels are built once per shape and reused by every layer ("regional compilation"). The token
embedding, the final norm, the output projection and the sampling head run eagerly (a handful
of kernels a step; inductor in torch 2.11 / Triton 3.6 failed to generate the head's guided
softmax at W = 16 on an H100, a TypeError in TritonSymbols.get_block_shape).

Shapes: the first step compiles the block for its shapes; when a second window size, batch size
or cache size comes, dynamo compiles once more with that dimension symbolic ("automatic dynamic
shapes") and every later size reuses it. Compiled for every size it met (as `dynamic=False`
would), a Jacobi or tree method's dozens of window sizes each cost a compile inside the timed
decoding (sjd on the demo: 84 s of compiling on a CPU, 14 s with automatic dynamic shapes). A
plain AR decode keeps its one static shape, and size-1 dimensions (W = 1) stay specialised.

Cost a user sees: the first steps compile (seconds for a demo model on a CPU, tens of seconds
for GPT-XL on a GPU); inductor keeps its compiled artefacts in its on-disk cache
(TORCHINDUCTOR_CACHE_DIR, default under /tmp), so a second process with the same shapes loads
them instead of compiling. `compile=False` on the runner (`--no-compile`) keeps
the eager step, the reference the compiled one is tested against.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from specrt.lazy import require

# inductor modes that leave CUDA-graph capture to the runner (one graph per whole step), as SGLang
# compiles inside its own capture; "reduce-overhead" would capture each layer call by itself
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# compiled versions a process may keep of the block (static and symbolic shapes x models x dtypes);
# dynamo's default of 8 would silently fall back to eager past it
RECOMPILE_LIMIT = 256


class CompiledStep:
    """A decode step's compiled block, and what compiling it cost.

    `run_layer(layer, h, cos, sin, past_k, past_v, mask)` runs one block compiled (kv_cache.run_layers'
    layer call); `compile_seconds` and `compiled_shapes` count the calls that compiled."""

    def __init__(self, mode: str = "default"):
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile mode {mode!r}: choose from {', '.join(COMPILE_MODES)}")
        torch = require("torch", "the compiled decode step")
        from specrt.models.kv_cache import call_layer

        _raise_recompile_limit(torch)
        if mode != "default":  # tune each generated kernel's launch configuration too (gpt-fast's setting)
            torch._inductor.config.coordinate_descent_tuning = True
        self.mode = mode
        self.compile_seconds = 0.0
        self.compiled_shapes = 0  # (function, shape) pairs compiled so far
        self.run_layer = self._timed(torch.compile(call_layer, mode=mode, dynamic=None))  # automatic dynamic

    def _timed(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """`compiled`, with the time of calls that compiled something added to compile_seconds
        (a call that compiles takes seconds; a compiled one microseconds, so one clock read each)."""
        counters = require("torch", "the compiled decode step")._dynamo.utils.counters

        def run(*args: Any) -> Any:
            before = counters["stats"]["unique_graphs"]
            start = time.perf_counter()
            out = compiled(*args)
            if counters["stats"]["unique_graphs"] != before:
                self.compile_seconds += time.perf_counter() - start
                self.compiled_shapes += 1
            return out
        return run


def _raise_recompile_limit(torch: Any) -> None:
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
