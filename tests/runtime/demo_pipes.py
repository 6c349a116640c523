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


@contextmanager
def level_by_level(pipe: Any) -> Iterator[None]:
    """The pipeline's draft runner without its one-call trees (runtime/tree_call.py: a static
    tree's draft_tree, a dynamic tree's draft_growth): a draft pass per depth."""
    with _refusing(pipe.draft, "can_draft_tree"), _refusing(pipe.draft, "can_grow_tree"):
        yield


@contextmanager
def _refusing(runner: Any, capability: str) -> Iterator[None]:
    setattr(runner, capability, lambda *_: False)
    try:
        yield
    finally:
        delattr(runner, capability)
