"""What a method's measured accepted length buys on a real architecture, on this machine.

The demo models are tiny, so on a CPU their forward cost barely grows with the window W
and per-call overhead dominates; a LlamaGen-size target behaves differently. This module
measures the target step latency t(W) for a LlamaGen architecture with random weights (no
checkpoint needed) and turns each method's accepted length τ into a predicted speed-up:

    speed-up = τ · t(1) / (t(W_method) + n_draft · t_draft(1))

where W_method is the target window a method verifies per forward and n_draft the draft
forwards per iteration. The draft is an EAGLE-style head, costed as one decoder layer of
the target's width (that is what LANTERN and Cool-SD draft with).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from specrt.errors import SpecrtError
from specrt.lazy import require

PROFILE_ARCHS = {
    "llamagen-c2i-B": ("GPT-B", 256),
    "llamagen-c2i-L": ("GPT-L", 256),
    "llamagen-c2i-XL": ("GPT-XL", 384),
    "llamagen-c2i-XXL": ("GPT-XXL", 384),
}
DEFAULT_WINDOWS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class StepLatency:
    """Median latency of one target step per window size (seconds)."""

    arch: str
    device: str
    windows: list[int]
    target_s: list[float]
    draft_s: float

    def target(self, window: int) -> float:
        """t(W), linearly interpolated between measured windows (clamped to the range)."""
        import numpy as np

        return float(np.interp(window, self.windows, self.target_s))


def _time(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    fn()
    sync()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_step_latency(arch: str, windows: tuple[int, ...] = DEFAULT_WINDOWS, repeats: int = 5,
                         device: str = "cpu", progress: Callable[[str], None] | None = None) -> StepLatency:
    """Time target steps at each window (past half full) and one draft-head step, random weights."""
    if arch not in PROFILE_ARCHS:
        raise SpecrtError(f"unknown --profile-arch {arch!r}; choose from {', '.join(PROFILE_ARCHS)}")
    torch = require("torch", "specrt bench --profile-arch")
    from specrt.export.llamagen_gpt import GPT, gpt_config

    name, image_size = PROFILE_ARCHS[arch]
    torch.manual_seed(0)
    config = gpt_config(name, image_size=image_size)
    draft_config = gpt_config(name, image_size=image_size, n_layer=1)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step_fn(model, cfg, window: int) -> Callable[[], Any]:
        capacity = cfg.seq_len + max(windows)
        past_len = cfg.cond_len + cfg.num_image_tokens // 2
        kv = torch.zeros(cfg.n_layer, 2, 2, cfg.n_kv_head, capacity, cfg.head_dim, device=device)
        ids = torch.zeros(2, window, dtype=torch.long, device=device)
        positions = (past_len + torch.arange(window, device=device))[None].expand(2, window)
        mask = torch.zeros(2, window, capacity + window, dtype=torch.bool, device=device)
        mask[:, :, :past_len] = True
        mask[:, :, capacity:] = torch.ones(window, window, dtype=torch.bool, device=device).tril()

        def run() -> Any:
            with torch.inference_mode():
                return model.step(ids, positions, mask, kv)
        return run

    target = GPT(config).to(device).eval()
    target_s = []
    for window in windows:
        if progress:
            progress(f"{arch}: target step, W={window}")
        target_s.append(_time(step_fn(target, config, window), repeats, sync))
    del target
    draft = GPT(draft_config).to(device).eval()
    draft_s = _time(step_fn(draft, draft_config, 1), repeats, sync)
    return StepLatency(arch, device, list(windows), target_s, draft_s)


def window_cost(method: str, params: dict[str, Any]) -> tuple[int, int]:
    """(target window per forward, draft forwards per iteration) of a method's setting."""
    draft_len = int(params.get("draft_len", 4))
    if method == "ar":
        return 1, 0
    if method in ("sd", "cool-sd", "lantern"):
        return draft_len + 1, draft_len
    if method in ("sjd", "sjd-pac"):
        return int(params.get("window", 16 if method == "sjd" else 64)), 0
    raise SpecrtError(f"no cost model for method {method!r}")


def predicted_speedup(latency: StepLatency, method: str, params: dict[str, Any], accepted_length: float) -> float:
    """τ · t(1) / (t(W) + n_draft · t_draft): the speed-up the accepted length would give."""
    window, drafts = window_cost(method, params)
    per_iteration = latency.target(window) + drafts * latency.draft_s
    return accepted_length * latency.target(1) / per_iteration
