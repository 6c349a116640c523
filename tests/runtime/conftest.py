"""Fixtures the runtime tests share: the demo's pipelines (one per test module)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ort_pipe(demo_bundle):
    """The demo bundle on onnxruntime, one thread."""
    from specrt.runtime.pipeline import Pipeline

    return Pipeline.from_bundle(demo_bundle, threads=1)


@pytest.fixture(scope="module")
def torch_pipe():
    """The demo's PyTorch modules (tests/runtime/demo_pipes.py)."""
    pytest.importorskip("torch")
    from demo_pipes import demo_torch_pipeline

    return demo_torch_pipeline()
