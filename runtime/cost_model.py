"""What a setting's accepted length buys on a device: the one cost-model formula.

    speed-up = τ · t(1) / (s · (t(W) + n_draft · t_draft))

τ is the setting's accepted length (tokens per target forward of an image), t(W) the target step
over a window of W tokens, n_draft · t_draft the draft's work per round, and s ≥ 1 the steps a
batch runs per image round (straggle: a batch waits for its slowest image; 1 at batch 1). Host
work between the model calls can be priced as part of a round (a term added to the round and to
ar's step): where it is left out the formula prices graph time alone, which is what a device with
a fast loop approaches.

Everything that predicts a speed-up goes through `speedup`: the step profile of a LlamaGen
architecture (`specrt bench --profile-arch`, bench/cost_model.py measures the StepLatency) and
`--method auto` (runtime/choosing, which measures the terms on the user's own pipeline).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specrt.errors import SpecrtError


def speedup(accepted_length: float, ar_step_s: float, round_s: float, straggle: float = 1.0) -> float:
    """τ · t(1) / (s · round): ar pays one step of `ar_step_s` per token, the setting one round of
    `round_s` per τ tokens, s rounds per image round. The formula, once."""
    if not (ar_step_s > 0 and round_s > 0 and straggle > 0):
        raise SpecrtError(f"a speed-up needs positive step times and straggle, got t(1) = {ar_step_s!r}, "
                          f"round = {round_s!r}, straggle = {straggle!r}")
    return accepted_length * ar_step_s / (straggle * round_s)


@dataclass
class StepLatency:
    """Latency of one target step per window size (seconds; fastest of the timed repeats).

    `images` is the images per step (each a CFG pair of rows), `dtype` the weights' type;
    `bytes_per_step` what one step must read at least (the target's weights, less the embedding
    tables it only gathers from, plus the KV buffer the attention reads): with a measured memory
    bandwidth it gives the step's memory-bound floor."""

    arch: str
    device: str
    windows: list[int]
    target_s: list[float]
    draft_s: float
    images: int = 1
    dtype: str = "fp32"
    bytes_per_step: int | None = None
    tokens: int | None = None  # image tokens per image (the architecture's grid²)
    ops_per_step: int | None = None  # of a W = 1 step: GPU kernels on CUDA, compute ops on a CPU (bench/step_ops.py)
    layers: int | None = None  # the target's transformer blocks
    compiled: bool = False  # steps run through torch.compile (runtime/backends/compiled_step.py)
    compile_s: float = 0.0  # seconds the first calls spent compiling

    @property
    def ops_per_layer(self) -> float | None:
        """ops_per_step over the blocks (the embedding, final norm and head spread over them)."""
        return self.ops_per_step / self.layers if self.ops_per_step and self.layers else None

    def target(self, window: int) -> float:
        """t(W), linearly interpolated between measured windows (clamped to the range)."""
        import numpy as np

        return float(np.interp(window, self.windows, self.target_s))


def window_cost(method: str, params: dict[str, Any]) -> tuple[int, int]:
    """(target window per forward, draft forwards per iteration) of a method's setting.

    The window is the method's own Method.max_window (sd family: draft_len + 1, or a tree's drafts
    + 1; sjd/sjd-pac: window L + the pending token); parameters a setting leaves out take the
    runtime's defaults. Draft forwards: one per draft position, i.e. draft_len for a chain and one
    pass per tree depth (each pass drafts a whole depth of the tree, costed as one W = 1 draft step).
    """
    from specrt.runtime.methods import METHODS, make_method

    if method not in METHODS:
        raise SpecrtError(f"no cost model for method {method!r}")
    decoder = make_method(method, **params)
    return decoder.max_window, int(decoder.positions) if decoder.needs_draft else 0


def predicted_speedup(latency: StepLatency, method: str, params: dict[str, Any], accepted_length: float,
                      straggle: float = 1.0) -> float:
    """`speedup` at `latency`'s step profile: t(1) = latency.target(1), a round t(W) + n_draft ·
    t_draft (window_cost), at its images per step, s the steps a batch runs per image round."""
    return speedup(accepted_length, latency.target(1), _per_iteration(latency, method, params), straggle)


def predicted_images_per_s(latency: StepLatency, method: str, params: dict[str, Any], accepted_length: float,
                           straggle: float = 1.0) -> float | None:
    """b · τ / (tokens · s · (t(W) + n_draft · t_draft)): images per second at `latency`'s batch b."""
    if not latency.tokens:
        return None
    per_iteration = _per_iteration(latency, method, params)
    return latency.images * accepted_length / (latency.tokens * straggle * per_iteration)


def _per_iteration(latency: StepLatency, method: str, params: dict[str, Any]) -> float:
    window, drafts = window_cost(method, params)
    return latency.target(window) + drafts * latency.draft_s
