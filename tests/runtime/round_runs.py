"""Running a device round to its end in a test, eagerly or compiled whole."""
from __future__ import annotations

from typing import Any


def run_to_end(round_: Any, state: Any, compiled: bool, max_runs: int) -> None:
    """Run `round_` over `state` until every image has finished: eagerly, or compiled whole with
    torch.compile(fullgraph=True, backend="aot_eager") — a graph break there (an .item(), a Python
    branch on a tensor) is a round a GPU could not capture, shown without a GPU."""
    import torch

    step = torch.compile(round_.__call__, fullgraph=True, backend="aot_eager") if compiled else round_
    for _ in range(max_runs):
        if bool(state.finished.all()):
            break
        step(state)
    assert bool(state.finished.all()), f"images unfinished after {max_runs} rounds"
