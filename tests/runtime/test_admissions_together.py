"""Requests admitted between two rounds are prefilled in one call, and images finished in one round
are decoded in one call (runtime/scheduling/inflight.py), each image still its request's alone: the
toy backend (exact arithmetic: every token and pixel equal) under CFG for every host-loop method
with a step-wise form, a planted bug that matches rows to the wrong slots (the control), a
request refused at admission failing alone, and the demo bundle on onnxruntime (tokens and pixels)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.errors import SpecrtError
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.runner import ModelRunner
from specrt.runtime.scheduling import Request, Scheduler

GUIDED = {"cfg_scale": 2.0, "temperature": 0.9, "top_k": 0, "top_p": 1.0}
METHODS = [("ar", {}), ("sd", {"draft_len": 3}), ("sjd", {"window": 3}), ("sjd-pac", {"window": 4})]
SLOTS = 4


def toy_pipeline() -> Pipeline:
    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=4, seed=5)
    return Pipeline(target, vq, draft, sampling_defaults=GUIDED)


def served(pipe: Pipeline, requests: list[Request], slots: int = SLOTS) -> tuple[list, list[int], list[int]]:
    """Submit `requests` before the worker admits any: each one's result (or the exception it
    ended with), the images of every target prefill for admissions, and of every VQ decode call."""
    prefills: list[int] = []
    decodes: list[int] = []
    prefill_rows, decode = pipe.target._prefill_rows, pipe.vq.decode

    def counted_prefill(model_rows, rows, mix, uniforms):
        prefills.append(len(mix))
        return prefill_rows(model_rows, rows, mix, uniforms)

    def counted_decode(grids):
        decodes.append(len(grids))
        return decode(grids)

    pipe.target._prefill_rows, pipe.vq.decode = counted_prefill, counted_decode
    try:
        scheduler = Scheduler(pipe, slots=slots, max_queue=len(requests))
        with scheduler:
            with scheduler._cond:  # all queued before the worker admits one
                tickets = [scheduler.submit(r) for r in requests]
            outcomes = []
            for ticket in tickets:
                try:
                    outcomes.append(ticket.result(timeout=60))
                except SpecrtError as exc:
                    outcomes.append(exc)
    finally:
        del pipe.target._prefill_rows, pipe.vq.decode
    return outcomes, prefills, decodes


def alone(pipe: Pipeline, request: Request):
    return pipe.generate([request.class_id], method=request.method, seed=request.seed, decode=request.decode,
                         **request.params)


@pytest.mark.parametrize("method,params", METHODS, ids=[m for m, _ in METHODS])
def test_admissions_share_a_prefill_and_images_equal_alone(method, params):
    """Seven requests through four slots: the first four enter with one prefill of four images
    (their CFG twins beside them), later ones as slots free; images finishing in the same round are
    decoded in one call; every image — tokens and pixels — equals its request alone."""
    pipe = toy_pipeline()
    requests = [Request(class_id=c % 4, seed=70 + c, method=method, params=params) for c in range(7)]
    results, prefills, decodes = served(pipe, requests)
    assert prefills[0] == SLOTS and sum(prefills) == len(requests)
    assert sum(decodes) == len(requests) and max(decodes) >= 2
    for request, result in zip(requests, results):
        expected = alone(pipe, request)
        np.testing.assert_array_equal(result.tokens, expected.tokens)
        np.testing.assert_array_equal(result.images, expected.images)


def test_rows_matched_to_the_wrong_slots_are_caught(monkeypatch):
    """The planted bug: the prefill of admitted images written to their positions in reverse order
    (each image's KV rows and token 0 in another's slot). The comparison above must see it."""
    admit = ModelRunner.admit
    monkeypatch.setattr(ModelRunner, "admit", lambda self, positions, rows, uniforms:
                        admit(self, list(positions)[::-1], rows, uniforms))
    pipe = toy_pipeline()
    requests = [Request(class_id=c, seed=80 + c, method="sd", params={"draft_len": 3}, decode=False) for c in range(4)]
    results, prefills, _ = served(pipe, requests)
    assert prefills == [SLOTS]
    assert sum(not np.array_equal(r.tokens, alone(pipe, q).tokens) for q, r in zip(requests, results)) >= 2


def test_a_request_refused_at_admission_fails_alone(monkeypatch):
    """Of four requests admitted together, one whose condition the model refuses as it enters ends
    with that error; the three others are admitted together and equal their requests alone."""
    pipe = toy_pipeline()
    conditions = pipe.conditions

    def refusing(class_ids=None, **kwargs):  # in the worker only: submit's own check lets it through
        if class_ids == [2] and threading.current_thread().name == "specrt-scheduler":
            raise SpecrtError("class 2 refused as it entered")
        return conditions(class_ids=class_ids, **kwargs)

    requests = [Request(class_id=c, seed=90 + c, method="sjd", params={"window": 3}, decode=False) for c in range(4)]
    monkeypatch.setattr(pipe, "conditions", refusing)
    results, prefills, _ = served(pipe, requests)
    monkeypatch.undo()
    assert isinstance(results[2], SpecrtError) and "class 2 refused" in str(results[2])
    assert prefills == [3]
    for request, result in zip(requests, results):
        if request.class_id != 2:
            np.testing.assert_array_equal(result.tokens, alone(pipe, request).tokens)


def test_a_prefill_refused_for_one_request_fails_it_alone(monkeypatch):
    """A prefill the model refuses for one request's rows fails the joint admission; the requests are
    then admitted one at a time with the conditions already prepared, so only that request ends with
    the error, the others equal alone, and no condition is prepared twice."""
    pipe = toy_pipeline()
    admit = ModelRunner.admit

    def refusing(self, positions, rows, uniforms):
        if 2 in rows.class_ids.tolist():
            raise SpecrtError("class 2's prefill refused")
        return admit(self, positions, rows, uniforms)

    conditions, prepared = pipe.conditions, []

    def counted(**kwargs):  # in the worker: each request's condition is prepared once, not again one by one
        if threading.current_thread().name == "specrt-scheduler":
            prepared.append(kwargs)
        return conditions(**kwargs)

    requests = [Request(class_id=c, seed=95 + c, method="sd", params={"draft_len": 3}, decode=False) for c in range(4)]
    monkeypatch.setattr(ModelRunner, "admit", refusing)
    monkeypatch.setattr(pipe, "conditions", counted)
    results, prefills, _ = served(pipe, requests)
    monkeypatch.undo()
    assert isinstance(results[2], SpecrtError) and "prefill refused" in str(results[2])
    assert prefills == [1, 1, 1]  # the joint prefill refused before it ran; then one each, class 2's refused
    assert len(prepared) == len(requests)
    for request, result in zip(requests, results):
        if request.class_id != 2:
            np.testing.assert_array_equal(result.tokens, alone(pipe, request).tokens)


def test_demo_admissions_together_give_tokens_and_pixels_alone(ort_pipe):
    """The demo bundle on onnxruntime: eight requests in eight slots enter with one prefill and
    finish (ar: the same number of rounds) with one decode; tokens and pixels equal alone, a float
    tie at a CDF boundary allowed to flip one image's tokens."""
    requests = [Request(class_id=c % 10, seed=300 + c, method="ar") for c in range(8)]
    results, prefills, decodes = served(ort_pipe, requests, slots=8)
    assert prefills == [8] and decodes == [8]
    expected = [alone(ort_pipe, request) for request in requests]
    assert sum(not np.array_equal(r.tokens, e.tokens) for r, e in zip(results, expected)) <= 1
    same = [np.array_equal(r.tokens, e.tokens) for r, e in zip(results, expected)]
    for result, exp, equal in zip(results, expected, same):
        if equal:
            np.testing.assert_array_equal(result.images, exp.images)
