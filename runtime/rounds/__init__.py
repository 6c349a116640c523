"""The device round: a whole speculative round as one function of device tensors, no host inside.

Why: on a GPU the host loop (runtime/methods) loses to plain AR — between every stage it reads
outcomes back, draws random numbers and builds masks, and each stage pays a launch and a wait.
Here a method family's round — draft, target window, acceptance, next token, commit — is a
function `round(state)` of device tensors only (runtime/rounds/state.py): random numbers from
counters, lengths and masks derived on the device, shapes fixed for the call. On CUDA it is
captured as one CUDA graph after its first (eager) run and replayed; on CPU the same function
runs eagerly; torch.compile(fullgraph=True) traces it whole (tests/runtime/test_rounds.py), which
is how a CPU shows it has no graph break. The host reads one flag a round: are all images done.

Families with a round: ar; sd, cool-sd and lantern drafting chains, static trees
(runtime/rounds/trees.py) or dynamic trees (runtime/rounds/dynamic.py) with an independent draft
model or an EAGLE head (runtime/rounds/drafts.py); sjd and sjd-pac (proactive drafting's spine
and full trees that fit the window, runtime/rounds/proactive.py). Each of them also under a unified
model's image grammar (Janus, Emu3, Lumina-mGPT: runtime/grammar.py), as in the host loop: the grammar
lives in the models' logits, which the round's target and draft passes compute at the stream positions
they derive from the state's lengths, and SJD's fresh window slots follow it through a device table
of the forced tokens (runtime/rounds/jacobi.py FreshDrafts). The continuous family's ar and cspd have
rounds of their own (runtime/families/continuous/rounds.py), run by the same loop choice and
CapturedRound. Everything else (onnxruntime / TensorRT) runs the host loop, the reference these
rounds reproduce in distribution.
Both loops draw the same counter uniforms (runtime/counter_random.py: the round's RoundState.uniforms,
the host's Decoding, one slot formula), so for a seed they give the same tokens, up to float rounding
at a CDF boundary (tests/runtime/test_loops_agree.py); an image is the same alone or in any batch.
In-flight batching refills a round's image slots between rounds (runtime/scheduling/round_slots.py):
chains.admit_images writes new images into free slots' rows and the round's `refill` resets its
own per-image state, in place, so a captured round replays on.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt.runtime.conditions import Conditions
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import Stats

LOOPS = ("auto", "round", "host")  # auto: the round on a CUDA PyTorch backend where the method has one


def plan_round(method: Any, target: Any, draft: Any, sampling: SamplingParams, mix: np.ndarray,
               grammar: Any) -> Optional[Any]:
    """The round that decodes `method` on these runners, or None where the host loop must (see the
    module docstring for which); `grammar`: a unified model's image grammar, or None. Needs torch:
    call it only for PyTorch runners."""
    from specrt.runtime.backends.device_model import device_model_of
    from specrt.runtime.methods.jacobi import JacobiDecoding
    from specrt.runtime.methods.speculative import DraftThenVerify
    from specrt.runtime.rounds.chains import ArRound, ChainRound
    from specrt.runtime.rounds.drafts import draft_of
    from specrt.runtime.rounds.dynamic import DynamicTreeRound
    from specrt.runtime.rounds.jacobi import JacobiRound
    from specrt.runtime.rounds.proactive import ProactiveRound, tree_nodes
    from specrt.runtime.rounds.state import PARTS
    from specrt.runtime.rounds.trees import StaticTreeRound
    from specrt.runtime.tree import static_shape

    if not runs_rounds(target):
        return None
    window = method.max_window
    if method.name == "ar":
        return ArRound(device_model_of(target, mix, sampling, window))
    if isinstance(method, JacobiDecoding) and not method.proactive_drafting:
        return JacobiRound(device_model_of(target, mix, sampling, window), method.window, target.spec.vocab_size,
                           method.coupling, grammar, method.rule(None))
    if isinstance(method, JacobiDecoding) and method.branching <= PARTS and method.tree_depth < method.window and \
            tree_nodes(method.branching, method.tree_depth, method.tree == "full") <= method.window:
        return ProactiveRound(device_model_of(target, mix, sampling, window), method.window, target.spec.vocab_size,
                              method.branching, method.tree_depth, method.coupling, grammar,
                              full=method.tree == "full")
    if not isinstance(method, DraftThenVerify) or method.theorem2 or not runs_rounds(draft):
        return None
    target_model = device_model_of(target, mix, sampling, window)
    if method.tree == "dynamic":  # the draft's frontier nodes take depth · top_k scratch columns
        draft_window = max(window, DynamicTreeRound.draft_scratch(method.depth, method.tree_top_k))
        models = target_model, draft_of(draft, target_model, mix, sampling, draft_window, method.depth + 1)
        return DynamicTreeRound(*models, method.rule(None), method.depth, method.tree_top_k, method.total_tokens) \
            if window <= PARTS else None
    if method.tree == "chain":
        return ChainRound(target_model, draft_of(draft, target_model, mix, sampling, window, window),
                          method.rule(None), method.draft_len)
    if method.tree == "static" and (shape := static_shape(method.static_tree)).size + 1 <= PARTS:
        return StaticTreeRound(target_model, draft_of(draft, target_model, mix, sampling, window, shape.depth + 1),
                               method.rule(None), shape.children)
    return None


KEPT_ROUNDS = 4  # device rounds a pipeline keeps for later calls; a bench sweeping more raises its pipeline's


def kept_round(rounds: dict, key: tuple, make: Callable[[], Any], keep: int) -> Any:
    """The round kept under `key` (its buffers and captured graph reused), or a new one from make()
    (None: no round, nothing kept). The most recent `keep` stay, the oldest dropped first: each holds
    KV buffers and a CUDA graph's memory pool, and one dropped is planned and captured afresh when
    its setting comes back — so a run that alternates more settings than `keep` must raise it."""
    round_ = rounds.pop(key, None) or make()
    if round_ is not None:
        rounds[key] = round_  # the most recent last
        while len(rounds) > keep:
            rounds.pop(next(iter(rounds)))
    return round_


def method_key(method: Any) -> tuple:
    """A method and its parameters' values, as part of the key a kept round is found by."""
    return type(method), tuple((name, repr(getattr(method, name))) for name in sorted(method.PARAMS))


def runs_rounds(runner: Any) -> bool:
    """A PyTorch runner over a whole model or an EAGLE head (DeviceModel, DeviceHead wrap them), or over
    a MAR module (the continuous family's device models)."""
    return runner is not None and runner.device_rounds


def decode_rounds(round_: Any, rows: Conditions, seeds: Sequence[int], total: int, stats: Stats,
                  graphs: bool = False) -> np.ndarray:
    """Image tokens [I, total] from rounds until every image has finished: the round's first run
    eager, then (graphs) one CUDA graph of it replayed — kept on the round, so a later call with the
    same round (Pipeline keeps them per method, batch and sampling) replays from its first. One read
    a round (the finished flags), one at the end (tokens and counters); the round's time is counted
    as the target's forward, since it is device work (model passes and verification together)."""
    import torch

    start = time.perf_counter()
    with torch.inference_mode():
        state = round_.start(rows, seeds, total)
        runs = run_until_finished(torch, round_, state, graphs, max_runs=total, done=bool(state.finished.all()))
        tokens = state.tokens[:, :total].cpu().numpy().copy()  # on a CPU a view of the buffers the next call reuses
        produced, image_rounds = state.produced.cpu().numpy().copy(), int(state.rounds.sum())
    images = len(seeds)
    for count, rounds in enumerate(produced.tolist()):
        if rounds:
            stats.record_round(count, rounds)
    stats.record_round(1, images)  # the prefill's token
    stats.target_forwards += image_rounds + images
    stats.target_calls += runs + 1
    drafts = round_.passes["draft"]
    if drafts:
        stats.draft_forwards += drafts * image_rounds + images
        stats.draft_calls += drafts * runs + 1
    stats.host_syncs = (stats.host_syncs or 0) + runs + 2
    stats.host_numbers = (stats.host_numbers or 0) + runs * images + tokens.size + produced.size + 1
    stats.seconds["target_forward"] += time.perf_counter() - start
    return tokens


def run_until_finished(torch: Any, round_: Any, state: Any, graphs: bool, max_runs: int, done: bool = False) -> int:
    """Run `round_` over `state` until every image has finished (`done`: already at the start); the
    number of runs. The first run is eager; with `graphs` the second captures the round (CapturedRound,
    kept on the round, so a later call replays from its first run) and the rest replay it. One host
    read a run: the finished flags. More than `max_runs` runs is a round that stopped advancing an
    image: an error, not a hang."""
    step, runs = getattr(round_, "captured", None) or round_, 0  # captured by an earlier call: replayed
    while not done:
        if runs > max_runs:
            raise RuntimeError(f"the round ran {runs} times for {state.total} tokens: an image stopped advancing")
        if graphs and runs == 1 and step is round_:  # this round is the capture's warm-up; replays follow
            step = round_.captured = CapturedRound(torch, round_, state)
        else:
            step(state)
        runs += 1
        done = bool(state.finished.all())
    return runs


class CapturedRound:
    """A round captured as one CUDA graph over the state's own buffers, replayed in place.

    Made after the round's first eager run: one more real round runs on a side stream (cuBLAS
    handles and autotuning must not happen during capture, PyTorch's CUDA-graph notes say), then
    the capture records a round without running it."""

    def __init__(self, torch: Any, round_: Any, state: Any):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            round_(state)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            round_(state)

    def __call__(self, state: Any) -> None:
        self.graph.replay()
