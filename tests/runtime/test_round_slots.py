"""In-flight slots in the device round's fixed buffers (runtime/scheduling/round_slots.py), on a CPU.

An image admitted into a slot freed mid-flight must get the tokens its request gets alone; admitting
and releasing must leave the round as a captured graph needs it — the same buffers (data_ptr) and,
compiled with torch.compile(fullgraph=True), one graph traced once (a recompilation raises); and the
host must read once a round, as a generate call's round does, and nothing at an admission. Each
check has a planted bug it must catch. Tiny random-weight models (tests/runtime/test_rounds.py);
three requests in two slots, so the third enters a slot another image used, beside a running one.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch._dynamo  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from slot_runs import alone, round_buffers, run_requests, slots_of  # noqa: E402
from test_rounds import GUIDED, pipeline  # noqa: E402
from specrt.runtime.rounds.chains import ArRound  # noqa: E402
from specrt.runtime.rounds.state import RoundState  # noqa: E402
from specrt.runtime.scheduling import Request, Scheduler  # noqa: E402
from specrt.runtime.scheduling.round_slots import RoundSlots  # noqa: E402
from specrt.runtime.arrays import namespace  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

METHODS = [("ar", {}), ("sd", {"draft_len": 3}), ("sjd", {"window": 3}),
           ("sjd-pac", {"window": 8, "branching": 3, "tree_depth": 2})]
IDS = [m for m, _ in METHODS]
REQUESTS = [(3, 5), (6, 9), (1, 2)]  # (class id, seed)
SLOTS = 2


def tiny_pipe():
    return pipeline(GUIDED, vocab=16, grid=4, classes=10)


@pytest.mark.parametrize("method,params", METHODS, ids=IDS)
def test_an_image_admitted_mid_flight_gets_its_tokens_alone_and_the_host_reads_once_a_round(method, params):
    pipe = tiny_pipe()
    slots, reads = slots_of(pipe, method, params, SLOTS), {}
    tokens = run_requests(slots, pipe, REQUESTS, reads=reads)
    for request in REQUESTS:
        assert tokens[request] == alone(pipe, method, params, request), f"{method} {request}"
    assert len({tuple(t) for t in tokens.values()}) == len(REQUESTS)
    assert reads["admit"] == [0] * len(REQUESTS)  # token 0 arrives with the next round's read
    # one read a round, as a generate call's round reads its finished flags (test_rounds.py), none inside it
    assert reads["round"] == [1] * slots.runs and slots.host_reads == slots.runs


TOGETHER_REQUESTS = [(3, 5), (6, 9), (1, 2), (8, 4), (0, 7)]  # three enter together, two as slots free


def prefilled_together(pipe, method: str, params: dict, patch: pytest.MonkeyPatch) -> tuple[dict, list[int]]:
    """TOGETHER_REQUESTS through 3 slots, the requests entering between two rounds admitted with
    one admit_all: their tokens, and the images of each admission's target prefill."""
    from specrt.runtime.backends.device_model import DeviceModel

    slots, sizes, prefill = slots_of(pipe, method, params, 3), [], DeviceModel.prefill

    def counted(self, rows, images=None):
        if images is not None and self is slots.round_.target:
            sizes.append(len(images))
        return prefill(self, rows, images)
    patch.setattr(DeviceModel, "prefill", counted)
    return run_requests(slots, pipe, TOGETHER_REQUESTS, together=True), sizes


@pytest.mark.parametrize("method,params", METHODS + [("eagle", {"draft_len": 3})], ids=IDS + ["sd-eagle-head"])
def test_images_admitted_together_share_a_prefill_and_get_their_tokens_alone(method, params, monkeypatch):
    """Three requests enter the device round's slots with one prefill of three images (their CFG
    twins, a draft model's or an EAGLE head's start beside them), later ones as slots free: every
    image is its request's alone."""
    if method == "eagle":
        from test_rounds_heads import head_pipeline

        pipe, method = head_pipeline(GUIDED, vocab=16, grid=4, classes=10), "sd"
    else:
        pipe = tiny_pipe()
    tokens, sizes = prefilled_together(pipe, method, params, monkeypatch)
    assert sizes[0] == 3 and sum(sizes) == len(TOGETHER_REQUESTS)
    for request in TOGETHER_REQUESTS:
        assert tokens[request] == alone(pipe, method, params, request), f"{method} {request}"


def test_rows_admitted_to_the_wrong_slots_are_caught(monkeypatch):
    """The planted bug: images admitted together get their conditions' rows in reverse order (each
    image prefilled with another's class). The comparison above must see it."""
    from specrt.runtime.rounds import chains

    admit_images = chains.admit_images
    monkeypatch.setattr(chains, "admit_images", lambda round_, images, rows, seeds:
                        admit_images(round_, images[::-1], rows, seeds[::-1]))
    pipe = tiny_pipe()
    tokens, _ = prefilled_together(pipe, "sd", {"draft_len": 3}, monkeypatch)
    assert sum(tokens[r] != alone(pipe, "sd", {"draft_len": 3}, r) for r in TOGETHER_REQUESTS) >= 2


def test_draws_keyed_by_slot_are_caught():
    """The planted bug: an admitted image's seed mixed with its slot. The comparison with the
    request alone must see it."""
    pipe, original = tiny_pipe(), RoundState.admit
    slots = slots_of(pipe, "sd", {"draft_len": 3}, SLOTS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RoundState, "admit", lambda self, image, seed: original(self, image, seed + image))
        tokens = run_requests(slots, pipe, REQUESTS)
    assert sum(tokens[r] != alone(pipe, "sd", {"draft_len": 3}, r) for r in REQUESTS) >= 1


def test_a_read_inside_the_round_is_counted():
    """The planted bug for the read count: an .item() in the round (a wait a captured round cannot have)."""
    pipe, original = tiny_pipe(), ArRound.__call__
    slots, reads = slots_of(pipe, "ar", {}, SLOTS), {}

    def reading(self, state):
        original(self, state)
        state.length.sum().item()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ArRound, "__call__", reading)
        run_requests(slots, pipe, REQUESTS[:1], reads=reads)
    assert set(reads["round"]) == {2}


@pytest.mark.parametrize("method,params", METHODS, ids=IDS)
def test_admissions_keep_the_buffers_and_the_compiled_round_traces_once(method, params):
    """The round compiled whole (fullgraph; dynamo's own tracing, which is where a recompilation
    would come from) with every recompilation an error: one graph for every round across the
    admissions, the same tokens, and every buffer where the first admission left it."""
    pipe = tiny_pipe()
    slots = slots_of(pipe, method, params, SLOTS)
    namespace(torch.zeros(1))  # made on first use: before the trace, or its guard changes and the round recompiles
    slots.step = torch.compile(slots.round_.__call__, fullgraph=True, backend="eager")
    first: dict = {}
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        tokens = run_requests(slots, pipe, REQUESTS, admitted=lambda s: first or first.update(round_buffers(s)))
    assert counters["stats"]["unique_graphs"] == 1
    assert round_buffers(slots) == first and len(first) >= 10
    for request in REQUESTS:
        assert tokens[request] == alone(pipe, method, params, request), f"{method} {request}"


def test_an_admission_that_moves_a_buffer_is_caught():
    """The planted bug for the buffer check: an admission that rebinds the state's lengths to a new
    tensor (a captured graph would go on reading the old one)."""
    pipe, original = tiny_pipe(), RoundState.admit
    slots, first, replaced = slots_of(pipe, "ar", {}, SLOTS), {}, []

    def moving(self, image, seed):
        replaced.append(self.length)  # kept alive: a later clone cannot land on a freed tensor's address
        self.length = self.length.clone()
        original(self, image, seed)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RoundState, "admit", moving)
        run_requests(slots, pipe, REQUESTS, admitted=lambda s: first or first.update(round_buffers(s)))
    moved = {name for name, pointer in round_buffers(slots).items() if first[name] != pointer}
    assert moved == {"state.length"}


def test_the_scheduler_refills_the_device_rounds_slots(monkeypatch):
    """A pipeline that decodes with the device round serves in flight through RoundSlots (not whole
    generate calls): every slot busy while requests wait, and each image its request's alone."""
    pipe = tiny_pipe()
    params = {"window": 8, "branching": 3, "tree_depth": 2}
    seen: list[tuple[int, int]] = []
    scheduler = Scheduler(pipe, slots=SLOTS, max_queue=8)
    step = RoundSlots.round

    def watched(self):
        seen.append((sum(1 for t in self.tokens if t), len(scheduler._waiting)))
        return step(self)

    monkeypatch.setattr(RoundSlots, "round", watched)
    requests = [Request(class_id=c, seed=40 + c, method="sjd-pac", params=params) for c in range(4)]
    with scheduler:
        with scheduler._cond:  # all queued before the worker admits one: none arrives between admission and round
            tickets = [scheduler.submit(r) for r in requests]
        results = [t.result(timeout=60) for t in tickets]
        stats = scheduler.stats()
    for request, result in zip(requests, results):
        np.testing.assert_array_equal(result.tokens[0].ravel(),
                                      alone(pipe, "sjd-pac", params, (request.class_id, request.seed)))
    assert all(result.images.shape[0] == 1 for result in results)  # each decoded alone by the VQ decoder
    assert len(seen) == stats.rounds > len(requests)
    assert all(occupied == SLOTS for occupied, waiting in seen if waiting)


def test_an_admitted_images_condition_goes_to_its_slot_alone():
    """Padded captions (t2i) of three lengths: the first admitted is copied to every slot at the start,
    later ones replace a slot's condition and its hidden columns; each image is its caption's alone."""
    pipe = pipeline(GUIDED, vocab=16, grid=4, classes=10, model_type="t2i", cond_len=5, caption_dim=12)
    captions = np.random.default_rng(0).standard_normal((3, 5, 12)).astype(np.float32)
    masks = np.array([[1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=bool)
    caption = lambda i: (captions[i:i + 1], masks[i:i + 1])  # noqa: E731
    requests = [(0, 4), (1, 6), (2, 8)]  # (caption, seed)
    tokens = run_requests(slots_of(pipe, "sd", {"draft_len": 3}, SLOTS), pipe, requests,
                          conditions_of=lambda i: pipe.conditions(captions=caption(i)))
    for i, seed in requests:
        got = pipe.generate(captions=caption(i), method="sd", seed=seed, decode=False, draft_len=3).tokens
        assert tokens[(i, seed)] == got[0].ravel().tolist(), f"caption {i}"


def test_a_unified_models_prompts_refill_the_round_under_its_grammar():
    """The chameleon demo (prompts, its image grammar's forced row ends) served in flight on the device
    round: each stream valid and its prompt's alone."""
    from specrt.export.demo.registry import get_demo

    pipe = get_demo("chameleon").hook("torch_pipeline")(None, threads=1)
    pipe.loop = "round"
    requests = [Request(prompt=p, seed=20 + i, method="sjd", decode=False)
                for i, p in enumerate(["a thin two", "a thick seven", "a thin one"])]
    with Scheduler(pipe, slots=SLOTS, max_queue=4) as scheduler:
        tickets = [scheduler.submit(r) for r in requests]
        results = [t.result(timeout=120) for t in tickets]
        rounds = scheduler.stats().rounds
    assert rounds > len(requests)  # round by round, not a generate call per batch
    for request, result in zip(requests, results):
        alone_ = pipe.generate(prompts=[request.prompt], method="sjd", seed=request.seed, decode=False)
        np.testing.assert_array_equal(result.stream, alone_.stream)
        assert pipe.grammar.is_valid(result.stream).all()


def test_groups_run_their_device_rounds_side_by_side(monkeypatch):
    """Three groups' batches at once, each a device round on a sibling pipeline (its own rounds,
    state and buffers over the one model's weights): batches open together, the rounds' buffers
    apart, and every image its request's alone."""
    assert groups_side_by_side(monkeypatch) == 0


def test_siblings_sharing_their_runners_are_caught(monkeypatch):
    """The planted bug: siblings that share the original's runners and rounds (its KV rows and round
    state) — the check above must see it."""
    import copy
    import threading

    from specrt.runtime.pipeline import Pipeline

    def shared_runners(self):
        twin = copy.copy(self)
        twin._generate_lock = threading.Lock()
        return twin
    monkeypatch.setattr(Pipeline, "sibling", shared_runners)
    assert groups_side_by_side(monkeypatch) > 0


def groups_side_by_side(monkeypatch) -> int:
    """Nine requests of three groups queued at once into 4 slots with 3 batches — sd, and ar twice:
    decoded to images and not, two groups whose rounds are alike (one round each on siblings, one
    round for both where the rounds are shared) — the count of faults: images not their request's
    alone, a round's buffers shared with another's, fewer than three batches ever open together,
    a request that failed."""
    pipe = tiny_pipe()
    groups = [("ar", {}, False), ("ar", {}, True), ("sd", {"draft_len": 3}, False)]
    requests = [Request(class_id=c, seed=60 + 7 * m + c, method=method, params=params, decode=decode)
                for c in range(3) for m, (method, params, decode) in enumerate(groups)]
    batches: list[int] = []
    buffers: dict[int, set[int]] = {}
    scheduler = Scheduler(pipe, slots=4, max_queue=len(requests), groups=3)
    step = RoundSlots.round

    def watched(self):
        batches.append(len(scheduler._open))
        buffers.setdefault(id(self), set()).add(self.state.tokens.data_ptr())
        return step(self)

    monkeypatch.setattr(RoundSlots, "round", watched)
    try:
        with scheduler._cond:  # every request queued before the worker admits one
            tickets = [scheduler.submit(r) for r in requests]
        end = time.monotonic() + 20  # 2 s when right (a CPU); a round broken by shared state may never end
        results = [answer(t, end - time.monotonic()) for t in tickets]
    finally:
        scheduler.close(timeout=5, cancel_running=True)
    faults = (max(batches) != 3) + (len(set().union(*buffers.values())) != len(buffers))
    for request, result in zip(requests, results):
        faults += result is None or result.tokens[0].ravel().tolist() != alone(
            pipe, request.method, dict(request.params), (request.class_id, request.seed))
    return faults


def answer(ticket, seconds: float):
    """The ticket's result, or None when it failed or took longer than `seconds`."""
    try:
        return None if ticket.future.exception(timeout=max(seconds, 0.0)) else ticket.result()
    except TimeoutError:
        return None
