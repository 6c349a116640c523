"""Driving a device round's in-flight slots (runtime/scheduling/round_slots.py) in a test, as the
scheduler drives them, and what such a test watches: the host's reads and the round's buffers."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode

from specrt.runtime.conditions import Conditions
from specrt.runtime.sampling import guidance_mix
from specrt.runtime.scheduling.round_slots import RoundSlots, round_slots

# Tensor methods that bring values to the host: on a GPU each waits for the device
READS = {torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__bool__,
         torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.__array__}
# attributes a pass rebinds to its outputs (a captured graph keeps those in its own pool), not buffers
PASS_OUTPUTS = {"hidden", "ranking", "_last", "_nodes"}


class HostReads(TorchFunctionMode):
    """Counts the calls that read a tensor's values on the host while it is entered (`seen`: their names)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def slots_of(pipe: Any, method: str, params: dict, slots: int) -> RoundSlots:
    """The device round's slots for one group on `pipe` (whose loop runs rounds), as inflight_batch opens them."""
    decoder, sampling = pipe.prepared(method, dict(params))
    found = round_slots(pipe, decoder, sampling, guidance_mix(slots, sampling), slots)
    assert found is not None, f"{method} {params}: no device round"
    return found


def run_requests(slots: RoundSlots, pipe: Any, requests: list[tuple[int, int]],
                 admitted: Optional[Callable[[RoundSlots], None]] = None,
                 reads: Optional[dict[str, list[int]]] = None,
                 conditions_of: Optional[Callable[[int], Any]] = None,
                 together: bool = False) -> dict[tuple[int, int], list[int]]:
    """Decode requests (class id, seed) in `slots`, each admitted into the first free slot between
    rounds, oldest first, as the scheduler admits them; their tokens by request. `admitted(slots)` runs
    after every admission; `reads` collects the host reads of each admission ("admit") and round ("round");
    `conditions_of(label)`: a request's conditions where its label is not a class id; `together`: the
    requests entering between two rounds admitted in one admit_all call (as the scheduler does), not
    one admit each."""
    def counted(kind: str, call: Callable[[], None]) -> None:
        if reads is None:
            call()
            return
        with HostReads() as meter:
            call()
        reads.setdefault(kind, []).append(len(meter.seen))

    def condition(label: int) -> Any:
        return conditions_of(label) if conditions_of else pipe.conditions(class_ids=[label])

    waiting, running, done = list(requests), {}, {}
    while waiting or running:
        entering = []
        for slot in range(slots.slots):
            if slot not in running and waiting:
                running[slot] = waiting.pop(0)
                entering.append(slot)
        if together and entering:
            batch = Conditions.concatenated([condition(running[slot][0]) for slot in entering])
            counted("admit", lambda: slots.admit_all(entering, batch, [running[s][1] for s in entering]))  # noqa: B023
            if admitted is not None:
                admitted(slots)
        for slot in entering if not together else ():
            label, seed = running[slot]
            conditions = condition(label)
            counted("admit", lambda: slots.admit(slot, conditions, seed))  # noqa: B023 (called at once)
            if admitted is not None:
                admitted(slots)
        counted("round", slots.round)
        for slot in [s for s in running if slots.done(s)]:
            done[running.pop(slot)] = list(slots.tokens[slot])
            slots.release(slot)
        assert slots.runs <= 10 * len(requests) * slots.total, "images stopped advancing"
    return done


def alone(pipe: Any, method: str, params: dict, request: tuple[int, int]) -> list[int]:
    """The request's tokens from a generate call of its one image."""
    label, seed = request
    return pipe.generate([label], method=method, seed=seed, decode=False, **params).tokens[0].ravel().tolist()


def round_buffers(slots: RoundSlots) -> dict[str, int]:
    """The data_ptr of every tensor a captured round replays over, by owner and name: the state's,
    the round's own, its target's and draft's (an EAGLE head's input features are a pass's), and
    the slots' read indices."""
    round_ = slots.round_
    draft = getattr(round_, "draft", None)
    owners = {"state": slots.state, "round": round_, "target": round_.target, "draft": draft,
              "draft.model": getattr(draft, "model", None), "draft.head": getattr(draft, "head", None),
              "fresh": getattr(round_, "fresh", None), "slots": slots}
    found = {}
    for owner_name, owner in owners.items():
        skip = PASS_OUTPUTS | ({"features"} if owner_name == "draft.head" else set())
        for name, value in (vars(owner) if owner is not None else {}).items():
            if isinstance(value, torch.Tensor) and name not in skip:
                found[f"{owner_name}.{name}"] = value.data_ptr()
    return found
