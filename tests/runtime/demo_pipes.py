"""Pipelines over the demo models that several runtime tests share, and the step-by-step switch."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


def demo_torch_pipeline() -> Any:
    """The trained demo target, draft and VQ on PyTorch (one thread), with the demo's sampling defaults."""
    import torch

    from specrt.export.demo import load_demo
    from specrt.runtime.pipeline import Pipeline

    torch.set_num_threads(1)
    demo = load_demo()
    pipe = Pipeline.from_torch(demo.target, demo.draft, demo.vq)
    pipe.sampling_defaults = dict(vars(demo.sampling_defaults))
    return pipe


@contextmanager
def step_by_step(pipe: Any) -> Iterator[None]:
    """The pipeline's draft runner without its draft chain (runtime/chain.py): one call per draft."""
    with _refusing(pipe.draft, "can_chain"):
        yield


def assert_one_call_trees_are_the_levels(pipe: Any, classes: list[int], seed: int, **settings: Any) -> None:
    """Trees drafted in one call (runtime/tree_call.py) against the level path, a draft pass per
    depth (the method's fused_drafting=False): the same tokens for a ragged batch, with far fewer
    draft calls, and an image of it alone (the next seed) the same as in the batch."""
    import numpy as np

    one_call = pipe.generate(classes, seed=seed, decode=False, **settings)
    calls = pipe.draft.forwards  # counted per generate call
    levels = pipe.generate(classes, seed=seed, decode=False, fused_drafting=False, **settings)
    assert calls < 0.4 * pipe.draft.forwards  # one draft call a round instead of one a depth
    np.testing.assert_array_equal(one_call.tokens, levels.tokens)
    alone = pipe.generate([classes[1]], seed=seed + 1, decode=False, **settings)
    np.testing.assert_array_equal(alone.tokens[0], one_call.tokens[1])


@contextmanager
def _refusing(runner: Any, capability: str) -> Iterator[None]:
    setattr(runner, capability, lambda *_: False)
    try:
        yield
    finally:
        delattr(runner, capability)
