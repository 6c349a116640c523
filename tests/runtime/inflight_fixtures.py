"""Pipelines the in-flight serving tests open inside Triton's stub process (named as a factory,
"inflight_fixtures:slow_tiny_pipeline"; the tests put this folder on the server's PYTHONPATH)."""
from __future__ import annotations

import time

from serving_fixtures import tiny_pipeline


def slow_tiny_pipeline(spec: dict):
    """The tiny random-weight pipeline with every target step slowed by spec["step_sleep_s"]: its
    images take long enough to queue behind each other and to be cancelled midway; the tokens are
    the tiny pipeline's own."""
    pipeline = tiny_pipeline()
    step, pause = pipeline.target.step, float(spec.get("step_sleep_s", 0.05))

    def slow_step(*args, **kwargs):
        time.sleep(pause)
        return step(*args, **kwargs)

    pipeline.target.step = slow_step
    return pipeline
