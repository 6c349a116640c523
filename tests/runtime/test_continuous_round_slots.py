"""The continuous family's device round in flight (runtime/scheduling/continuous_round_slots.py), on a CPU.

An ar or cspd image admitted into a slot of the running round — beside an image under way, into a
slot a finished or cancelled image left — must get its request's latents alone (generate of its
one image on the same loop); admitting and releasing must leave the round as a captured graph
needs it: the same buffers (data_ptr) and, compiled with torch.compile(fullgraph=True), one graph
traced once (a recompilation raises); the host must read once a round and nothing at an admission.
Each check has a planted bug it must catch.

A tiny random-weight MAR pair on PyTorch (8 tokens of 2 channels, drafts of 3, MAR's linear
guidance schedule; test_rounds_continuous.py's BATCH), with loop "round" so a CPU runs the device
round. "The same" is test_continuous_inflight.py's: latents within ATOL = 1e-5 (a batched round sums
over other shapes; observed here: at most 2.4e-7), counters equal; a draw taken from the wrong
numbers moves a latent by the scale of its noise, far more than 100 × ATOL.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch._dynamo  # noqa: E402
from torch._dynamo.utils import counters as dynamo_counters  # noqa: E402

from continuous_slot_runs import alone, counters, farthest, open_round_batch, run_in_flight  # noqa: E402
from slot_runs import round_buffers  # noqa: E402
from test_rounds_continuous import BATCH, pipeline  # noqa: E402
from specrt.runtime.families.continuous.round_state import ContinuousRoundState  # noqa: E402
from specrt.runtime.families.continuous.rounds import ContinuousArRound  # noqa: E402
from specrt.runtime.scheduling import Request, Scheduler  # noqa: E402
from specrt.runtime.scheduling.continuous_round_slots import ContinuousRoundSlots  # noqa: E402
from specrt.runtime.arrays import namespace  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

ATOL = 1e-5
SAMPLING = {"cfg_scale": 2.0, "cfg_schedule": "linear", "temperature": 0.9}
METHODS = [("ar", {}), ("cspd", {"draft_len": 3, "prefill_ratio": 0.25})]  # cspd: 2 of 8 tokens pre-filled
IDS = [m for m, _ in METHODS]
SLOTS = 2


@pytest.fixture(scope="module")
def pipe():
    return pipeline(0.1, loop="round", sampling=SAMPLING, **BATCH)


def requests(method: str, params: dict, count: int) -> list[Request]:
    return [Request(class_id=c % 10, seed=100 + 7 * c, method=method, params=params, decode=False)
            for c in range(count)]


@pytest.mark.parametrize("method,params", METHODS, ids=IDS)
def test_images_admitted_mid_flight_are_their_requests_alone_and_the_host_reads_once_a_round(pipe, method, params):
    """Five requests in 2 slots, one admitted a round; the third is cancelled after 2 of its rounds
    (its slot refilled while its draw may be open). Every other request's latents and counters are
    its alone; one read a round, none at an admission; a later batch reuses the same kept round."""
    queue = requests(method, params, count=5)
    batch = open_round_batch(pipe, queue[0], SLOTS)
    run = run_in_flight(batch, queue, cancel_after={2: 2})
    assert sorted(run.results) == [0, 1, 3, 4]  # the cancelled one gave nothing
    assert len(set(run.entered.values())) == len(queue)  # each arrived at its own round
    assert run.slot[1] == 1 and run.entered[1] == 1  # beside request 0 under way
    assert {run.slot[3], run.slot[4]} == {0, 1}  # into slots others left
    for index, result in run.results.items():
        want = alone(pipe, queue[index])
        np.testing.assert_allclose(result.tokens, want.tokens, rtol=0, atol=ATOL, err_msg=f"{method} {index}")
        assert counters(result.stats) == counters(want.stats), f"{method} {index}"
        assert result.stats.host_syncs == result.stats.target_forwards  # its rounds' reads, one each
    assert len({r.tokens.tobytes() for r in run.results.values()}) == len(run.results)
    assert run.reads["admit"] == [0] * len(queue)
    assert run.reads["round"] == [1] * batch.rounds.runs and batch.rounds.host_reads == batch.rounds.runs
    if method == "cspd":  # ragged: drafts rejected and residuals drawn
        stats = [r.stats for r in run.results.values()]
        assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)
        assert sum(s.residual_proposals for s in stats) > 0
    again = open_round_batch(pipe, queue[0], SLOTS)
    again.close()
    assert again.rounds.round_ is batch.rounds.round_  # the pipeline's kept round: its buffers, its graph


def test_draws_keyed_by_slot_are_caught(pipe, monkeypatch):
    """The planted bug: an admitted image's seed mixed with its slot. The comparison with the request
    alone must see it: exactly the images outside slot 0 move, by far more than ATOL."""
    admit = ContinuousRoundState.admit
    monkeypatch.setattr(ContinuousRoundState, "admit", lambda self, image, seed: admit(self, image, seed + image))
    queue = requests(*METHODS[1], count=4)
    run = run_in_flight(open_round_batch(pipe, queue[0], SLOTS), queue)
    moved = {i: gap > 100 * ATOL for i, gap in farthest(run.results, pipe, queue).items()}
    assert moved == {i: run.slot[i] != 0 for i in range(len(queue))} and any(moved.values())


def test_a_read_inside_the_round_is_counted(pipe, monkeypatch):
    """The planted bug for the read count: an .item() in the round (a wait a captured round cannot have)."""
    original = ContinuousArRound.__call__

    def reading(self, state):
        original(self, state)
        state.length.sum().item()

    monkeypatch.setattr(ContinuousArRound, "__call__", reading)
    queue = requests(*METHODS[0], count=1)
    run = run_in_flight(open_round_batch(pipe, queue[0], SLOTS), queue)
    assert set(run.reads["round"]) == {2}


@pytest.mark.parametrize("method,params", METHODS, ids=IDS)
def test_admissions_keep_the_buffers_and_the_compiled_round_traces_once(pipe, method, params):
    """The round compiled whole (fullgraph; dynamo's own tracing, where a recompilation would come
    from) with every recompilation an error: one graph for every round across the admissions, the
    same latents, and every buffer where the first admission left it."""
    queue = requests(method, params, count=3)
    batch, first = open_round_batch(pipe, queue[0], SLOTS), {}
    namespace(torch.zeros(1))  # made on first use: before the trace, or its guard changes and the round recompiles
    batch.rounds.step = torch.compile(batch.rounds.round_.__call__, fullgraph=True, backend="eager")
    torch._dynamo.reset()
    dynamo_counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        run = run_in_flight(batch, queue, admitted=lambda b: first or first.update(round_buffers(b.rounds)))
    assert dynamo_counters["stats"]["unique_graphs"] == 1
    assert round_buffers(batch.rounds) == first and len(first) >= 10
    assert {"target.kv", "target.class_ids", "state.tokens", "state.seed_low"} <= set(first)
    if method == "cspd":
        assert "draft.kv" in first
    assert max(farthest(run.results, pipe, queue).values()) <= ATOL


def test_an_admission_that_moves_a_buffer_is_caught(pipe, monkeypatch):
    """The planted bug for the buffer check: an admission that rebinds the state's lengths to a new
    tensor (a captured graph would go on reading the old one)."""
    admit, replaced = ContinuousRoundState.admit, []

    def moving(self, image, seed):
        replaced.append(self.length)  # kept alive: a later clone cannot land on a freed tensor's address
        self.length = self.length.clone()
        admit(self, image, seed)

    monkeypatch.setattr(ContinuousRoundState, "admit", moving)
    queue, first = requests(*METHODS[0], count=3), {}
    batch = open_round_batch(pipe, queue[0], SLOTS)
    run_in_flight(batch, queue, admitted=lambda b: first or first.update(round_buffers(b.rounds)))
    moved = {name for name, pointer in round_buffers(batch.rounds).items() if first[name] != pointer}
    assert moved == {"state.length"}


def test_the_scheduler_refills_the_continuous_device_rounds_slots(pipe, monkeypatch):
    """A continuous pipeline that decodes with the device round serves in flight through its slots
    (not whole generate calls): every slot busy while requests wait, both methods' groups, each in
    a batch of its own on a sibling's device round, side by side, each image its request's alone,
    the counters adding up."""
    seen: list[tuple[int, int]] = []
    batches: list[int] = []
    step = ContinuousRoundSlots.round
    scheduler = Scheduler(pipe, slots=SLOTS, max_queue=8)

    def watched(self):
        for batch in scheduler._open:  # each batch's images, and its group's requests waiting
            seen.append((len(batch.running), sum(t.request.group == batch.group for t in scheduler._waiting)))
        batches.append(len(scheduler._open))
        return step(self)

    monkeypatch.setattr(ContinuousRoundSlots, "round", watched)
    queue = [r for method, params in METHODS for r in requests(method, params, count=3)]
    with scheduler:
        with scheduler._cond:  # every request queued before the worker admits the first
            tickets = [scheduler.submit(r) for r in queue]
        results = [t.result(timeout=60) for t in tickets]
        stats = scheduler.stats()
    for request, result in zip(queue, results):
        np.testing.assert_allclose(result.tokens, alone(pipe, request).tokens, rtol=0, atol=ATOL)
    assert stats.completed == len(queue) and stats.rounds == len(batches) > len(queue)
    assert all(busy == SLOTS for busy, waiting in seen if waiting) and any(waiting for _, waiting in seen)
    assert max(batches) == 2  # ar's and cspd's batches open together
    assert stats.target_forwards == sum(r.stats.target_forwards for r in results)
    assert sum(stats.accepted_lengths.values()) == stats.target_forwards
