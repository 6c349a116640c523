"""Several groups' batches at once in the scheduler: each on runners of its own over the one model
(Pipeline.sibling: sessions and weights shared, buffers not), a round of each in turn,
each batch holding up to `slots` images. Every image equals its request alone; a planted sibling that
shares its runners' buffers is caught; a pipeline whose runners cannot share their model keeps
one batch at a time."""
from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.scheduling import Request, Scheduler
from specrt.runtime.scheduling.inflight import InflightBatch

# three groups that cannot share a round, with parameters that make their rounds ragged
METHODS = [("ar", {}), ("sd", {"draft_len": 3}), ("sjd", {"window": 4})]
GUIDED = {"cfg_scale": 2.0, "temperature": 0.9, "top_k": 0, "top_p": 1.0}


def mixed(count: int) -> list[Request]:
    return [Request(class_id=(3 * m + i) % 10, seed=700 + 10 * m + i, method=method, params=params, decode=False)
            for i in range(count) for m, (method, params) in enumerate(METHODS)]


def alone(pipe: Pipeline, request: Request) -> np.ndarray:
    return pipe.generate([request.class_id], method=request.method, seed=request.seed, decode=False,
                         **request.params).tokens[0]


def serve(pipe: Pipeline, requests: list[Request], monkeypatch, **options) -> tuple[list, list[tuple[int, int, int]]]:
    """Submit `requests` at once: their tokens (None for a request that failed), and (open batches,
    images in all of them, images in the fullest) at every round."""
    seen: list[tuple[int, int, int]] = []
    scheduler = Scheduler(pipe, max_queue=len(requests), **options)
    rounds = InflightBatch.round

    def watched(self):
        images = [len(b.running) for b in scheduler._open]
        seen.append((len(images), sum(images), max(images)))
        return rounds(self)
    monkeypatch.setattr(InflightBatch, "round", watched)
    with scheduler:
        with scheduler._cond:  # every request queued before the worker admits the first
            tickets = [scheduler.submit(r) for r in requests]
        tokens = [None if t.future.exception(timeout=120) else t.result().tokens[0] for t in tickets]
    return tokens, seen


def changed(pipe: Pipeline, requests: list[Request], tokens: list) -> int:
    """Requests whose image is not their request's alone (or that failed)."""
    return sum(got is None or not np.array_equal(got, alone(pipe, r)) for got, r in zip(tokens, requests))


def test_a_sibling_shares_the_model_not_the_buffers(ort_pipe):
    """The sibling runs the same onnxruntime sessions on KV buffers of its own, and its images
    are the original's, decoded while the original holds other images' rows."""
    twin = ort_pipe.sibling()
    assert twin.target.step_session is ort_pipe.target.step_session and twin.vq is ort_pipe.vq
    first = ort_pipe.generate([1, 2], method="sd", seed=5, decode=False).tokens
    kept = ort_pipe.target.kv_buffer.copy()
    second = twin.generate([1, 2], method="sd", seed=5, decode=False).tokens
    assert not np.shares_memory(twin.target.kv_buffer, ort_pipe.target.kv_buffer)
    assert not np.shares_memory(twin.draft.kv_buffer, ort_pipe.draft.kv_buffer)
    np.testing.assert_array_equal(ort_pipe.target.kv_buffer, kept)  # the twin wrote nothing of the original's
    np.testing.assert_array_equal(first, second)


def test_a_torch_sibling_shares_the_weights(torch_pipe):
    twin = torch_pipe.sibling()
    assert twin.target.gpt is torch_pipe.target.gpt
    first = torch_pipe.generate([3], method="sjd", seed=2, decode=False).tokens
    second = twin.generate([3], method="sjd", seed=2, decode=False).tokens
    assert twin.target.kv_buffer.data_ptr() != torch_pipe.target.kv_buffer.data_ptr()
    np.testing.assert_array_equal(first, second)


def test_groups_decode_side_by_side_each_image_as_alone(ort_pipe, monkeypatch):
    """Three groups' requests at once, batches of two slots: their batches are open together (not one
    group draining before the next opens), each filling its own slots (six images at once, never more
    than two a batch), and every image equals its request alone (a float tie at a CDF boundary may
    flip one)."""
    requests = mixed(4)
    tokens, seen = serve(ort_pipe, requests, monkeypatch, slots=2, groups=3)
    assert changed(ort_pipe, requests, tokens) <= 1
    assert max(batches for batches, _, _ in seen) == 3
    assert all(most <= 2 for _, _, most in seen) and max(images for _, images, _ in seen) == 6


def turns_out_of_order(pipe: Pipeline, monkeypatch) -> tuple[int, int]:
    """Three groups' requests queued at once, batches of two: (rounds whose batch did not hold the
    longest-waiting image of the busy batches, rounds run)."""
    scheduler = Scheduler(pipe, slots=2, max_queue=12, groups=3)
    rounds = InflightBatch.round
    late, total = [], []

    def watched(self):
        oldest = {id(b.batch): min(t.submitted for t in b.running.values()) for b in scheduler._open if b.running}
        late.append(oldest[id(self)] > min(oldest.values()))
        return rounds(self)
    monkeypatch.setattr(InflightBatch, "round", watched)
    with scheduler:
        with scheduler._cond:
            tickets = [scheduler.submit(r) for r in mixed(4)]
        for ticket in tickets:
            ticket.result(timeout=120)
    return sum(late), len(late)


def test_the_batch_holding_the_longest_waiting_image_runs_next(ort_pipe, monkeypatch):
    """Turns go oldest first (a batch's oldest image by submission), so the slowest requests are not
    held up behind younger batches' rounds: no round runs a batch while another holds an older image."""
    late, rounds = turns_out_of_order(ort_pipe, monkeypatch)
    assert rounds > 12 and late == 0


def test_turns_taken_in_a_fixed_order_are_caught(ort_pipe, monkeypatch):
    """The control: turns that ignore the images' age (the last busy batch first) are seen."""
    monkeypatch.setattr(Scheduler, "_oldest", staticmethod(lambda batch: -len(batch.running) if batch.running
                                                           else float("-inf")))
    late, rounds = turns_out_of_order(ort_pipe, monkeypatch)
    assert late > 0


def test_a_sibling_sharing_its_runners_is_caught(ort_pipe, monkeypatch):
    """The planted bug: a sibling that shares the original's runners (their KV rows) — the
    comparison above must see it (the control for that test)."""
    def shared_runners(self):
        twin = copy.copy(self)
        twin._generate_lock = threading.Lock()
        return twin
    monkeypatch.setattr(Pipeline, "sibling", shared_runners)
    requests = mixed(4)
    tokens, _ = serve(ort_pipe, requests, monkeypatch, slots=4, groups=3)
    assert changed(ort_pipe, requests, tokens) >= 2


def test_runners_that_cannot_share_keep_one_batch_at_a_time(monkeypatch):
    """A runner without siblings (TensorRT's): the scheduler falls back to one group's batch at a time
    and still serves every group, each image as alone."""
    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=10, seed=3)
    monkeypatch.setattr(type(target), "siblings", False)
    pipe = Pipeline(target, vq, draft, sampling_defaults=GUIDED)
    assert pipe.sibling() is None
    requests = mixed(2)
    tokens, seen = serve(pipe, requests, monkeypatch, slots=2, groups=3)
    assert max(batches for batches, _, _ in seen) == 1
    assert changed(pipe, requests, tokens) == 0


@pytest.mark.parametrize("error", [MemoryError("numpy could not allocate"),
                                   RuntimeError("[ONNXRuntimeError] : 6 : Failed to allocate memory for requested buffer")])
def test_a_batch_that_does_not_fit_in_memory_keeps_the_batches_that_do(error, monkeypatch, caplog):
    """The third group's batch runs out of memory as it opens: its requests go back to the queue
    (none fails), two batches at most from then on, a warning says so, every image as alone."""
    from specrt.runtime.scheduling import scheduler as scheduling

    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=10, seed=3)
    pipe = Pipeline(target, vq, draft, sampling_defaults=GUIDED)
    opened = scheduling.open_batch

    def tight(pipeline, request, slots, inflight):
        if len(scheduler_of[0]._open) == 2:
            raise error
        return opened(pipeline, request, slots, inflight)
    scheduler_of = []
    monkeypatch.setattr(scheduling, "open_batch", tight)
    monkeypatch.setattr(scheduling.Scheduler, "_work", _recording(scheduler_of, scheduling.Scheduler._work))
    requests = mixed(2)
    tokens, seen = serve(pipe, requests, monkeypatch, slots=6, groups=3)
    assert all(t is not None for t in tokens) and changed(pipe, requests, tokens) == 0
    assert max(batches for batches, _, _ in seen) == 2
    assert scheduler_of[0]._batches_allowed() == 2 and "does not fit in memory" in caplog.text


def test_an_error_other_than_memory_fails_its_requests(monkeypatch):
    """Only an allocation that did not fit is retried later: another error opening a batch fails
    that group's requests with it, and the other groups are served."""
    from specrt.runtime.scheduling import scheduler as scheduling

    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=10, seed=3)
    pipe = Pipeline(target, vq, draft, sampling_defaults=GUIDED)
    opened = scheduling.open_batch

    def broken(pipeline, request, slots, inflight):
        if request.method == "sjd":
            raise RuntimeError("a bug")
        return opened(pipeline, request, slots, inflight)
    monkeypatch.setattr(scheduling, "open_batch", broken)
    requests = mixed(2)
    tokens, _ = serve(pipe, requests, monkeypatch, slots=6, groups=3)
    assert [t is None for t in tokens] == [r.method == "sjd" for r in requests]


def _recording(into: list, work):
    """Scheduler._work that first notes its scheduler in `into` (for a patched function to read)."""
    def recorded(self):
        into.append(self)
        return work(self)
    return recorded


@pytest.mark.parametrize("groups", [0, 17, 2.5])
def test_a_group_count_out_of_range_is_refused(groups):
    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=4, seed=3)
    with pytest.raises(SpecrtError, match="groups"):
        Scheduler(Pipeline(target, vq, draft, sampling_defaults=GUIDED), groups=groups)


def test_serve_groups_reach_the_scheduler():
    """`specrt serve --groups` travels as the in-flight model's parameter to its Scheduler; absent,
    the scheduler's default; --slots beyond the model's images is refused with the flag to fix."""
    import json
    import re

    from specrt.runtime.scheduling.scheduler import DEFAULT_GROUPS
    from specrt.runtime.serving.inflight_model import scheduler_options
    from specrt.runtime.serving.inflight_repo import InflightConfig, config_pbtxt

    def parameters(config: InflightConfig) -> dict[str, str]:
        text = config_pbtxt("specrt", config, {"bundle": "b"}, "/tmp/drain", 5.0)
        return {json.loads(key): json.loads(value) for key, value in
                re.findall(r'parameters \{ key: ("[^"]*") value \{ string_value: ("(?:[^"\\]|\\.)*") \} \}', text)}

    assert scheduler_options(parameters(InflightConfig(slots=4, groups=2)), 8)["groups"] == 2
    options = scheduler_options(parameters(InflightConfig()), 4)
    assert options["groups"] == DEFAULT_GROUPS and options["slots"] == 4 and options["max_group_wait"] is None
    with pytest.raises(SpecrtError, match="--slots 9: this model decodes at most 8"):
        scheduler_options(parameters(InflightConfig(slots=9)), 8)
