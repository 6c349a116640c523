"""Siblings: a pipeline's second set of runners over the same model, for a second batch at once.

Why: an in-flight scheduler decodes several request groups' batches round by round (runtime/scheduling),
each batch keeping its images' caches between its rounds. Loading the model again per batch would
multiply the weights; a sibling shares what a model is — onnxruntime sessions, PyTorch modules and
compiled blocks, schedules — and owns what a batch is: KV buffers, staging arrays, counters, its
device rounds and its lock. A runner says what is whose: `_unallocated()` sets every piece of
per-batch state to what it is before the first batch, and a sibling starts from it.
"""
from __future__ import annotations

import copy
import threading
from typing import Any, Optional


def twin_runner(runner: Any) -> Any:
    """A shallow copy of `runner` whose dicts, lists and sets are its own (a twin's cache of graphs
    or views never fills the original's) and whose per-batch state is reset (`_unallocated()`)."""
    twin = copy.copy(runner)
    for name, value in vars(twin).items():
        if isinstance(value, (dict, list, set)):
            setattr(twin, name, copy.copy(value))
    twin._unallocated()
    return twin


def twin_pipeline(pipeline: Any, lock: str) -> Optional[Any]:
    """A copy of `pipeline` on sibling runners (target and draft), with a lock of its own (the
    attribute `lock` names) and no device rounds yet; None where a runner cannot share its model
    (`siblings` False: TensorRT's execution contexts hold their bindings). The rest — text encoder,
    tokenizer decoder, grammar — is shared: it keeps nothing between calls."""
    runners = [runner for runner in (pipeline.target, pipeline.draft) if runner is not None]
    if not all(getattr(runner, "siblings", False) for runner in runners):
        return None
    twin = copy.copy(pipeline)
    twin.target = pipeline.target.sibling()
    twin.draft = pipeline.draft.sibling() if pipeline.draft is not None else None
    setattr(twin, lock, threading.Lock())
    twin._rounds = {}
    return twin
