"""A mixed load in the scheduler: a request of another group gets a batch of its own and is served
in its turn (oldest first) while the first group's batch goes on; where no batch is left for its
group (one batch at a time here), it waits about one image's time (measured on the running batch)
before the open batch stops admitting, so it is served after a few images of a long single-group
queue, not after the whole queue or a fixed wait of seconds (toy backend)."""
from __future__ import annotations

import threading

import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.errors import SpecrtError
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.scheduling import Request, Scheduler

GUIDED = {"cfg_scale": 2.0, "temperature": 0.9, "top_k": 0, "top_p": 1.0}
BEFORE, AFTER = 8, 8  # requests of the running group submitted just before and just after the other group's


def finishing_order(max_group_wait, groups: int = 1) -> list[str]:
    """Which requests finished in which order: BEFORE sd requests, one ar request, AFTER sd requests."""
    target, draft, vq = toy_models(vocab_size=4, grid_size=4, num_classes=4, seed=3)
    pipe = Pipeline(target, vq, draft, sampling_defaults=GUIDED)
    order: list[str] = []
    lock = threading.Lock()

    def record(name):
        def done(_):
            with lock:
                order.append(name)
        return done

    sd = [Request(class_id=i % 4, seed=i, method="sd", params={"draft_len": 3}, decode=False)
          for i in range(BEFORE + AFTER)]
    other = Request(class_id=1, seed=99, method="ar", decode=False)
    with Scheduler(pipe, slots=2, max_queue=BEFORE + AFTER + 1, max_group_wait=max_group_wait,
                   groups=groups) as scheduler:
        scheduler.submit(sd[0]).result(timeout=120)  # the first image: the scheduler has an image time
        tickets = []
        with scheduler._cond:  # every request queued before the worker admits one: no batch drains between submits
            for request in sd[1:BEFORE] + [other] + sd[BEFORE:]:
                tickets.append(scheduler.submit(request))
                tickets[-1].future.add_done_callback(record("ar" if request is other else "sd"))
        for ticket in tickets:
            ticket.result(timeout=120)
    return order


def test_another_group_is_served_in_its_turn():
    """Default wait: once the ar request has waited one image's time, only the sd requests older
    than it still enter; it finishes right after them (a slot's worth of slack), before most of the
    sd requests that came after it."""
    order = finishing_order(None)
    assert order.index("ar") <= BEFORE + 1, order


def test_a_long_fixed_wait_serves_the_queue_first():
    """The control: with a wait longer than the whole queue takes, the running group admits its
    whole queue, later requests too, and the ar request finishes last (what the default avoids)."""
    order = finishing_order(3600.0)
    assert order[-1] == "ar", order


def test_another_groups_batch_runs_beside_the_first():
    """With batches for two groups, the ar request enters its own batch when its turn comes (the
    requests older than it admitted), even under a wait longer than the whole queue: it finishes
    among the sd requests submitted after it, where one batch at a time finishes it last."""
    order = finishing_order(3600.0, groups=2)
    assert order.index("ar") < len(order) - AFTER // 2, order


@pytest.mark.parametrize("wait", [-1.0, 1e9, float("nan")])
def test_a_group_wait_out_of_range_is_refused(wait):
    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=4, seed=3)
    with pytest.raises(SpecrtError, match="max_group_wait"):
        Scheduler(Pipeline(target, vq, draft, sampling_defaults=GUIDED), max_group_wait=wait)
