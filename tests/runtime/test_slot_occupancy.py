"""In-flight rounds cost what their images do: the runners' batch holds the occupied slots' images
only (runtime/scheduling/slot_rounds.py), growing on admit and shrinking on release, and an image
is the same alone and wherever it sits in a batch that grows and shrinks around it (toy backend,
ar, an sd chain, sjd and sjd-pac)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.scheduling import Request, Scheduler
from specrt.runtime.scheduling.inflight import InflightBatch
from specrt.runtime.scheduling.slot_rounds import SlotRounds

GUIDED = {"cfg_scale": 2.0, "temperature": 0.9, "top_k": 0, "top_p": 1.0}
METHODS = [("ar", {}), ("sd", {"draft_len": 3}), ("sjd", {"window": 3}), ("sjd-pac", {"window": 4})]


def toy_pipeline() -> Pipeline:
    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=4, seed=3)
    return Pipeline(target, vq, draft, sampling_defaults=GUIDED)


def served(pipe: Pipeline, requests: list[Request], slots: int, monkeypatch) -> tuple[list, list]:
    """Submit `requests` at once to a scheduler of `slots` slots: their results, and for every
    round (occupied slots, the target's images per pass, its model batch rows per pass) as each of
    the round's target passes ran."""
    passes: list[tuple[int, int, int]] = []
    occupied = [0]
    rounds, step = InflightBatch.round, pipe.target.step

    def watched_round(self):
        occupied[0] = len(self.occupied)
        return rounds(self)

    def watched_step(*args, **kwargs):
        passes.append((occupied[0], pipe.target.images, pipe.target.batch))
        return step(*args, **kwargs)

    monkeypatch.setattr(InflightBatch, "round", watched_round)
    monkeypatch.setattr(pipe.target, "step", watched_step)
    with Scheduler(pipe, slots=slots, max_queue=len(requests)) as scheduler:
        tickets = [scheduler.submit(r) for r in requests]
        results = [t.result(timeout=60) for t in tickets]
    return results, passes


@pytest.mark.parametrize("method,params", METHODS, ids=[m for m, _ in METHODS])
@pytest.mark.parametrize("cfg_scale,rows", [(2.0, 2), (1.0, 1)], ids=["cfg", "no-cfg"])
def test_one_request_in_many_slots_runs_one_image(method, params, cfg_scale, rows, monkeypatch):
    """A lone request in 4 slots: every target pass runs one image, its two rows under CFG (one
    without), not four images' rows."""
    request = Request(class_id=1, seed=9, method=method, params={**params, "cfg_scale": cfg_scale}, decode=False)
    _, passes = served(toy_pipeline(), [request], 4, monkeypatch)
    assert passes and {(images, batch) for _, images, batch in passes} == {(1, rows)}


@pytest.mark.parametrize("method,params", METHODS, ids=[m for m, _ in METHODS])
def test_rows_follow_occupancy_and_images_equal_alone(method, params, monkeypatch):
    """Seven requests through 3 slots: the batch grows as requests enter and shrinks as images
    leave, each pass running exactly the occupied slots' images (two rows each under CFG), and
    every image equals its request alone (its position in the batch moves as others leave)."""
    pipe = toy_pipeline()
    requests = [Request(class_id=c % 4, seed=40 + c, method=method, params=params, decode=False) for c in range(7)]
    results, passes = served(pipe, requests, 3, monkeypatch)
    assert {occupied for occupied, _, _ in passes} >= {1, 3}  # grown to full and shrunk at the end
    assert all(images == occupied and batch == 2 * occupied for occupied, images, batch in passes)
    for request, result in zip(requests, results):
        alone = pipe.generate([request.class_id], method=method, seed=request.seed, decode=False, **params)
        np.testing.assert_array_equal(result.tokens, alone.tokens)


def test_a_batch_that_never_shrinks_is_caught(monkeypatch):
    """The planted bug: released slots ride along as pad rows (no shrink). The occupancy check
    above must see it (its control)."""
    monkeypatch.setattr(SlotRounds, "compact", lambda self: None)
    requests = [Request(class_id=c % 4, seed=40 + c, method="sd", params={"draft_len": 3}, decode=False)
                for c in range(5)]
    _, passes = served(toy_pipeline(), requests, 3, monkeypatch)
    assert any(images != occupied for occupied, images, _ in passes)


def test_a_batch_reopened_reuses_the_buffers(monkeypatch):
    """An in-flight batch that closes when the queue empties and opens again for the next request
    takes the runners' buffers as they are (viewed whole again, not allocated afresh), and its
    images still equal their requests alone."""
    pipe = toy_pipeline()
    first = Request(class_id=1, seed=3, method="sd", params={"draft_len": 3}, decode=False)
    second = Request(class_id=2, seed=4, method="sd", params={"draft_len": 3}, decode=False)
    with Scheduler(pipe, slots=3) as scheduler:
        one = scheduler.submit(first).result(timeout=60)
        end = time.monotonic() + 30
        while scheduler._open:  # the queue is empty: the worker closes the batch
            assert time.monotonic() < end, "the batch did not close"
            time.sleep(0.002)
        buffer = pipe.target.kv_buffer
        allocations = []
        allocate_kv = type(pipe.target)._allocate_kv
        monkeypatch.setattr(type(pipe.target), "_allocate_kv", lambda self, *a: allocations.append(a) or allocate_kv(self, *a))
        two = scheduler.submit(second).result(timeout=60)
        assert scheduler.stats().completed == 2
    assert allocations == [] and pipe.target.kv_buffer is buffer
    for request, result in ((first, one), (second, two)):
        alone = pipe.generate([request.class_id], method="sd", seed=request.seed, decode=False, draft_len=3)
        np.testing.assert_array_equal(result.tokens, alone.tokens)
