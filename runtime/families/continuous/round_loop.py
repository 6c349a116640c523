"""Which loop decodes a continuous call, and the loop that runs the device rounds (rounds.py).

The same choice as the discrete family's (runtime.rounds.LOOPS): "auto" runs the round where the
target is a PyTorch module on an accelerator, "round" wherever both models are PyTorch modules
(eagerly on a CPU), "host" the host loop (methods.py). Both loops draw the same counter uniforms,
keyed by the same coordinates (draws.py), so for a seed they give the same tokens, up to float
rounding (a batched chain sums in another order; an acceptance test at its edge); an image is the
same alone or in any batch.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.runtime.rounds import LOOPS, method_key, run_until_finished, runs_rounds
from specrt.runtime.families.continuous.methods import ContinuousMethod, ContinuousStats

MAX_ROUNDS_PER_TOKEN = 64  # an open residual draw may take a round without a token; far more means a bug


def wants_round(loop: str, target: Any, method: str) -> bool:
    """Whether this call decodes with a device round: by `loop` (LOOPS), the target's backend and
    the method (SpecrtError where `loop` is "round" and none can run)."""
    loop = validation.choice("loop", loop, LOOPS)
    if loop == "host" or (loop == "auto" and not (runs_rounds(target) and target.on_accelerator)):
        return False
    if not runs_rounds(target):
        raise SpecrtError("loop 'round' runs on the PyTorch backend only (the demo, or a bundle with backend "
                          "torch); onnxruntime runs the host loop")
    return True


def plan_round(method: ContinuousMethod, target: Any, draft: Any, sampling: dict[str, Any],
               class_ids: np.ndarray) -> Any:
    """The device round of `method` (ar or cspd) over these PyTorch runners, for a batch of as many
    images as class_ids, with its own KV buffers."""
    import torch

    from specrt.runtime.families.continuous.device_model import ContinuousDeviceModel
    from specrt.runtime.families.continuous.rounds import ContinuousArRound, ContinuousSampling, CSpDRound

    settings = ContinuousSampling(**{k: sampling[k] for k in ("temperature", "cfg_scale", "cfg_schedule")})
    window = 1 if method.name == "ar" else method.draft_len + 1
    columns = target.spec.seq_len + window + 1

    def model(runner: Any) -> ContinuousDeviceModel:  # with the runner's compiled block, where it has one
        return ContinuousDeviceModel(torch, runner.model, class_ids, settings.cfg_scale, columns, runner.run_layer)

    if method.name == "ar":
        return ContinuousArRound(model(target), settings)
    if not runs_rounds(draft):
        raise SpecrtError("cspd's round needs the draft on the PyTorch backend too")
    return CSpDRound(model(target), model(draft), settings, method.draft_len, method.prefill_ratio)


def decode_rounds(round_: Any, class_ids: np.ndarray, seeds: Sequence[int], stats: ContinuousStats,
                  graphs: bool = False) -> np.ndarray:
    """Tokens [I, seq_len, C] from rounds until every image has finished: the round's first run
    eager, then (graphs) one CUDA graph of it replayed, kept on the round for later calls. One read
    a round (the finished flags), two at the end (tokens, counters): stats.host_syncs."""
    import torch

    start = time.perf_counter()
    with torch.inference_mode():
        state = round_.start(class_ids, seeds)
        total = state.total
        runs = run_until_finished(torch, round_, state, graphs, max_runs=MAX_ROUNDS_PER_TOKEN * total)
        tokens = state.tokens[:, :total].cpu().numpy().copy()  # on a CPU a view of buffers the next call reuses
        counters = torch.stack([state.rounds, state.drafted, state.accepted, state.proposals]).sum(dim=1).tolist()
    image_rounds, drafted, accepted, proposals = counters
    stats.tokens += int(tokens.shape[0] * tokens.shape[1])
    stats.target_passes += runs
    stats.target_forwards += int(image_rounds)
    stats.drafted += int(drafted)
    stats.accepted += int(accepted)
    stats.residual_proposals += int(proposals)
    stats.host_syncs = (stats.host_syncs or 0) + runs + 2
    stats.round_seconds += time.perf_counter() - start
    return tokens


def round_key(method: ContinuousMethod, images: int, sampling: dict[str, Any]) -> tuple:
    """What shapes a round: the method and its parameters, the batch, the sampling."""
    return method_key(method), images, tuple(sorted(sampling.items()))

