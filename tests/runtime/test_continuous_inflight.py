"""The continuous family in flight (runtime/scheduling/continuous_slots.py): ar and cspd images that
enter a running batch between rounds are the images their requests give alone.

A tiny random-weight MAR pair on onnxruntime (8 tokens of 2 channels, drafts of 3, MAR's linear
guidance schedule), so images accept different numbers of drafts, sit in token pre-filling while
others verify, finish in different rounds and leave slots that new requests reuse.

What "the same" means for float tokens: the batched graphs sum over other shapes than a call of one
image (more rows, a wider masked cache), so a token may differ in its last bits, and the difference
rides along the image's later tokens. The tokens here are below 8 in magnitude, where float32's
spacing is at most 2^-21 ≈ 4.8e-7; ATOL = 1e-5 allows about 20 such steps of drift (observed: at most
2, 1.2e-7 on this machine), while a draw taken from the wrong numbers moves a token by the scale of
its noise (order 1; the planted bug below moves them by more than 100 × ATOL). The counters are
integers and must be equal: a float difference that flipped an acceptance test would change them.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")  # the bundle is exported from the PyTorch model
pytest.importorskip("onnxruntime")

from _continuous_exact import tiny_bundle  # noqa: E402
from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.families.continuous.methods import ContinuousDecoding  # noqa: E402
from specrt.runtime.families.continuous.pipeline import ContinuousPipeline, to_pixels  # noqa: E402
from specrt.runtime.scheduling import DeadlineExceeded, Request, Scheduler  # noqa: E402
from specrt.runtime.scheduling.continuous_slots import ContinuousSlots, continuous_batch  # noqa: E402

ATOL = 1e-5
SAMPLING = {"cfg_scale": 2.0, "cfg_schedule": "linear", "temperature": 0.9}
METHODS = [("ar", {}), ("cspd", {"draft_len": 3, "prefill_ratio": 0.25})]  # cspd: 2 of 8 tokens pre-filled


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("inflight") / "bundle", 0.1, token_dim=2, seq_len=8, diffusion_steps=3,
                       beta_start=0.1, beta_end=0.5)


@pytest.fixture(scope="module")
def pipe(bundle):
    return ContinuousPipeline.from_bundle(bundle)


def requests(method: str, params: dict, count: int = 6) -> list[Request]:
    return [Request(class_id=c % 10, seed=100 + 7 * c, method=method, params={**params, **SAMPLING}, decode=False)
            for c in range(count)]


def counters(stats) -> tuple:
    return stats.tokens, stats.target_forwards, stats.drafted, stats.accepted, stats.residual_proposals


def alone(pipe, request: Request):
    return pipe.generate([request.class_id], method=request.method, seed=request.seed, decode=False, **request.params)


def run_in_flight(pipe, queue: list[Request], slots: int = 3) -> tuple[dict, list[int]]:
    """Drive a batch by hand: before each round, the next waiting request enters the first free slot
    (one a round: beside images under way, then into slots finished images left). Returns each request's
    result (by position in `queue`) and, per admission after the first, the tokens the batch's
    other images had decided by then."""
    batch = continuous_batch(pipe, queue[0], slots)
    assert isinstance(batch, ContinuousSlots)
    waiting, results, busy, owner = list(enumerate(queue)), {}, [], {}
    try:
        while waiting or batch.occupied:
            if waiting and batch.free():
                if batch.occupied:
                    busy.append(int(batch.decided[list(batch.occupied)].max()))
                index, request = waiting.pop(0)
                slot = batch.free()[0]
                batch.admit(slot, request)
                owner[slot] = index
            report = batch.round()
            for slot, result in report.finished.items():
                results[owner.pop(slot)] = result
    finally:
        batch.close()
    return results, busy


@pytest.mark.parametrize("method, params", METHODS)
def test_images_admitted_mid_flight_are_their_requests_alone(pipe, method, params):
    queue = requests(method, params)
    results, busy = run_in_flight(pipe, queue)
    assert sorted(results) == list(range(len(queue)))
    assert len(busy) == len(queue) - 1 and min(busy) >= 1  # every later image entered beside one under way
    if method == "cspd":  # some entered (pre-filling) while another verified drafts
        assert max(busy) >= 2
    for index, request in enumerate(queue):
        want = alone(pipe, request)
        np.testing.assert_allclose(results[index].tokens, want.tokens, rtol=0, atol=ATOL)
        assert counters(results[index].stats) == counters(want.stats)
    if method == "cspd":  # ragged: drafts rejected and residuals drawn
        assert 0 < sum(r.stats.accepted for r in results.values()) < sum(r.stats.drafted for r in results.values())
        assert sum(r.stats.residual_proposals for r in results.values()) > 0


@pytest.mark.parametrize("method, params", METHODS)
def test_draws_keyed_by_slot_are_caught(pipe, method, params, monkeypatch):
    """The planted bug: a slot's draws keyed by its batch position as well as the request's seed.
    The comparison above must see it (its control): the images outside slot 0 move by far more
    than ATOL."""
    reseed = ContinuousDecoding.reseed
    monkeypatch.setattr(ContinuousDecoding, "reseed", lambda self, image, seed: reseed(self, image, seed + image))
    queue = requests(method, params, count=4)
    results, _ = run_in_flight(pipe, queue)
    moved = [np.abs(results[i].tokens - alone(pipe, r).tokens).max() > 100 * ATOL for i, r in enumerate(queue)]
    assert sum(moved) >= 2


def test_the_scheduler_decodes_continuous_requests_round_by_round(pipe):
    """Both methods' requests through the Scheduler in 2 slots: round by round (not a generate call
    per batch), every image its request's alone, the counters adding up."""
    queue = [r for (method, params) in METHODS for r in requests(method, params, count=3)]
    with Scheduler(pipe, slots=2, max_queue=len(queue)) as scheduler:
        tickets = [scheduler.submit(r) for r in queue]
        results = [t.result(timeout=120) for t in tickets]
        stats = scheduler.stats()
    for request, result in zip(queue, results):
        np.testing.assert_allclose(result.tokens, alone(pipe, request).tokens, rtol=0, atol=ATOL)
    assert stats.completed == len(queue) and stats.failed == 0
    assert stats.rounds >= 3 * 8 // 2 + 1  # whole calls would take one round per batch
    assert stats.tokens == 8 * len(queue)
    assert stats.target_forwards == sum(r.stats.target_forwards for r in results)
    assert sum(stats.accepted_lengths.values()) == stats.target_forwards and stats.mean_accepted_length > 1
    # the control: whole calls, one round per batch, count no forwards by accepted length (what the
    # serving test reads on the metrics port to tell the two apart)
    with Scheduler(pipe, slots=2, max_queue=len(queue), inflight=False) as scheduler:
        for ticket in [scheduler.submit(r) for r in queue]:
            ticket.result(timeout=120)
        whole = scheduler.stats()
    assert whole.rounds <= len(queue) // 2 + 1 and not whole.accepted_lengths


@pytest.fixture
def slow(pipe, monkeypatch):
    """The target's steps slowed (30 ms each), so an image takes long enough to be cancelled or to
    expire midway; its tokens are unchanged."""
    step = pipe.target.step

    def slow_step(*args, **kwargs):
        time.sleep(0.03)
        return step(*args, **kwargs)
    monkeypatch.setattr(pipe.target, "step", slow_step)
    return pipe


def wait_for(condition, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.002)

def groups_side_by_side(pipe, monkeypatch) -> tuple[int, int]:
    """ar and cspd requests (two groups) queued at once into 4 slots with 2 batches, their rounds
    alternating (the batch that has run fewer rounds next, where the scheduler would run the oldest
    image's batch to that image's end): (the most batches open at once, requests whose latents or
    counters are not their request's alone)."""
    queue = [r for i in range(3) for (method, params) in METHODS for r in requests(method, params, count=3)[i:i + 1]]
    most, turns = [], {}
    scheduler = Scheduler(pipe, slots=4, max_queue=len(queue), groups=2)
    step = ContinuousSlots.round

    def watched(self):
        most.append(len(scheduler._open))
        turns[id(self)] = turns.get(id(self), 0) + 1
        return step(self)
    monkeypatch.setattr(ContinuousSlots, "round", watched)
    monkeypatch.setattr(Scheduler, "_oldest", staticmethod(lambda batch: turns.get(id(batch.batch), 0)))
    try:
        with scheduler._cond:  # every request queued before the worker admits one
            tickets = [scheduler.submit(r) for r in queue]
        results = [None if t.future.exception(timeout=120) else t.result() for t in tickets]
    finally:
        scheduler.close(timeout=5, cancel_running=True)
    wrong = 0
    for request, result in zip(queue, results):
        want = alone(pipe, request)
        wrong += (result is None or np.abs(result.tokens - want.tokens).max() > ATOL
                  or counters(result.stats) != counters(want.stats))
    return max(most), wrong


def test_groups_decode_side_by_side_on_siblings(pipe, monkeypatch):
    """ar's and cspd's batches at once, each on runners of its own over the one bundle's sessions,
    every image its request's alone."""
    twin = pipe.sibling()
    assert twin.target.step_session is pipe.target.step_session and twin.target is not pipe.target
    assert groups_side_by_side(pipe, monkeypatch) == (2, 0)


def test_siblings_sharing_a_cache_are_caught(pipe, monkeypatch):
    """The planted bug: siblings on the original's runners (one cache for both batches) — the check
    above must see it."""
    import copy
    import threading

    def shared(self):
        twin = copy.copy(self)
        twin._lock = threading.Lock()
        return twin
    monkeypatch.setattr(ContinuousPipeline, "sibling", shared)
    batches, wrong = groups_side_by_side(pipe, monkeypatch)
    assert batches == 2 and wrong >= 2



@pytest.mark.parametrize("method, params", METHODS)
def test_cancel_and_deadline_free_the_slot(slow, method, params):
    """One slot: a cancelled image and an expired one each leave it at the next round, and the
    request waiting behind each gets it (its image its own alone) long before the one that left would
    have finished."""
    first, second, third, fourth = requests(method, params, count=4)
    with Scheduler(slow, slots=1, max_queue=4) as scheduler:
        cancelled, after_cancel = scheduler.submit(first), scheduler.submit(second)
        wait_for(lambda: scheduler.stats().rounds >= 2)
        assert cancelled.cancel()
        got = [after_cancel.result(timeout=60)]
        expiring = scheduler.submit(replace(third, deadline=time.monotonic() + 0.05))  # < 2 of its rounds
        after_deadline = scheduler.submit(fourth)
        with pytest.raises(DeadlineExceeded, match="deadline passed"):
            expiring.result(timeout=60)
        got.append(after_deadline.result(timeout=60))
        stats = scheduler.stats()
    for request, result in zip((second, fourth), got):
        np.testing.assert_allclose(result.tokens, alone(slow, request).tokens, rtol=0, atol=ATOL)
    assert stats.cancelled == 1 and stats.expired == 1 and stats.completed == 2
    # one slot: had the two that left run to their ends, the rounds would be the four images' own
    assert stats.rounds < sum(alone(slow, r).stats.target_forwards for r in (first, second, third, fourth))


def test_free_slots_cost_no_rows(pipe, monkeypatch):
    """A lone request in 4 slots: every target step runs its image's two rows (CFG) only, and its
    image is its request's alone."""
    rows: list[int] = []
    transformer = pipe.target._transformer

    def counted(tokens, *args):
        rows.append(len(tokens))
        return transformer(tokens, *args)
    monkeypatch.setattr(pipe.target, "_transformer", counted)
    request = requests("cspd", METHODS[1][1], count=1)[0]
    with Scheduler(pipe, slots=4, max_queue=1) as scheduler:
        result = scheduler.submit(request).result(timeout=60)
    in_flight, rows[:] = list(rows), []
    want = alone(pipe, request)
    assert in_flight == rows and set(rows) == {2}  # the same steps as alone, two rows each
    np.testing.assert_allclose(result.tokens, want.tokens, rtol=0, atol=ATOL)


def test_refusals_fail_at_the_batch_before_a_slot_is_taken(pipe):
    """A group the model refuses fails at the batch, before a slot is taken (the pipeline's lock is
    free again), as does loop "round" on onnxruntime; another family's pipeline gets None here.
    (The device round's slots: test_continuous_round_slots.py.)"""
    with pytest.raises(SpecrtError, match="no tokenizer decoder"):
        continuous_batch(pipe, Request(class_id=1, method="ar"), 2)
    with pytest.raises(SpecrtError, match="temperature"):
        continuous_batch(pipe, Request(class_id=1, method="ar", params={"temperature": 0}, decode=False), 2)
    assert pipe._lock.acquire(timeout=1)
    pipe._lock.release()
    pipe.loop = "round"
    try:
        with pytest.raises(SpecrtError, match="loop 'round' runs on the PyTorch backend only"):
            continuous_batch(pipe, Request(class_id=1, method="ar", decode=False), 2)
    finally:
        pipe.loop = "auto"
    assert continuous_batch(object(), Request(class_id=1), 2) is None


def test_specrt_serve_opens_continuous_bundles_in_flight(bundle):
    """The pipeline `specrt serve BUNDLE` hands its in-flight model (the same spec and factory) puts a
    continuous bundle's requests in ContinuousSlots, not whole calls."""
    from specrt.runtime.scheduling.batches import open_batch
    from specrt.runtime.serving.inflight_repo import open_pipeline

    served = open_pipeline({"factory": "specrt.commands.serve:served_pipeline", "bundle": str(bundle), "demo": None,
                            "backend": None, "device": None, "threads": None})
    for method, params in METHODS:
        batch = open_batch(served, requests(method, params, count=1)[0], 2)
        try:
            assert isinstance(batch, ContinuousSlots)
        finally:
            batch.close()


def test_images_finishing_in_one_round_are_decoded_in_one_call(pipe, monkeypatch):
    """Three ar images admitted together finish in the same round: one decoder call for the two
    whose requests decode (the third asks for tokens only), each image its own pixels."""
    calls = []

    def decoder(tokens):  # [N, seq_len, C] -> [N, 3, 2, 2], each image's from its own tokens
        calls.append(len(tokens))
        return np.tanh(tokens.reshape(len(tokens), -1)[:, :12].reshape(len(tokens), 3, 2, 2))

    monkeypatch.setattr(pipe, "decoder", decoder)
    queue = [replace(request, decode=index != 1) for index, request in enumerate(requests("ar", {}, count=3))]
    batch = continuous_batch(pipe, queue[0], 3)
    try:
        for slot, request in enumerate(queue):
            batch.admit(slot, request)
        finished = {}
        while batch.occupied:
            finished.update(batch.round().finished)
    finally:
        batch.close()
    assert calls == [2]
    assert finished[1].images is None
    for slot in (0, 2):
        np.testing.assert_array_equal(finished[slot].images, to_pixels(decoder(finished[slot].tokens)))
    assert not np.array_equal(finished[0].images, finished[2].images)
