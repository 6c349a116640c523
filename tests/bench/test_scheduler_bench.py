"""`specrt bench --serve --in-process`: the runtime's scheduler measured in this process, in flight
against whole generate calls, under the load generator's phases (toy backend: seconds, not minutes)."""
from __future__ import annotations

import asyncio

import pytest

from specrt.bench.scheduler_bench import SchedulerClient, run_scheduler_bench
from specrt.bench.serve_bench import ServeBenchConfig
from specrt.bench.serve_load import LoadRequest
from specrt.runtime.backends.toy import toy_models
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.scheduling import Scheduler
from tiny_demo import run_cli

GUIDED = {"cfg_scale": 2.0, "temperature": 0.9, "top_k": 0, "top_p": 1.0}


def toy_pipeline() -> Pipeline:
    target, draft, vq = toy_models(vocab_size=4, grid_size=3, num_classes=4, seed=3)
    return Pipeline(target, vq, draft, sampling_defaults=GUIDED)


def test_both_modes_answer_every_request_with_its_tokens_alone():
    """A short run of every phase on a mixed pool: both modes measured at each load, every request
    answered or refused (nothing else), every answer the same request's tokens alone, the modes'
    alone answers agreeing, both schedulers closed."""
    config = ServeBenchConfig(fractions=(0.5, 1.5), rate_s=1.0, overload_s=1.0, saturation_s=1.0, slots=2,
                              max_queue=4, methods=(("sd", {"draft_len": 3}), ("ar", {})), classes=4, pool_size=6,
                              timeout_s=60.0)
    results = run_scheduler_bench(toy_pipeline(), config)
    assert results["modes"] == ["inflight", "dynamic"] and results["in_process"] is True
    assert results["alone_agree"] and set(results["stopped"]) == {"inflight", "dynamic"}
    assert all(value > 0 for value in results["saturated_per_s"].values())
    rows = results["rates"]
    assert sorted((r["mode"], r["fraction"]) for r in rows) == sorted(
        (mode, fraction) for mode in ("inflight", "dynamic") for fraction in (0.5, 1.5))
    for row in rows:
        assert row["sent"] > 0 and row["errors"] == 0, row
        assert row["ok"] + row["refused"] == row["sent"]
        assert row["same_tokens"] == row["ok"], row


def test_a_full_queue_is_a_refusal_and_the_rest_are_answered():
    """The in-process client reports the scheduler's QueueFull as a refusal, at once: with the
    pipeline held no request is decoded, so of six sent together into a queue of one at most two
    are taken (one waiting, one the worker picked up) and the rest are refused; let go, the taken
    ones are answered."""
    pipe = toy_pipeline()
    request = LoadRequest(class_id=1, seed=5, method="ar")

    async def send_six(client: SchedulerClient) -> list:
        return list(await asyncio.gather(*(client.send(request, 0, 0.0) for _ in range(6))))

    with Scheduler(pipe, slots=1, max_queue=1) as scheduler:
        pipe.hold()
        loop = asyncio.new_event_loop()
        try:
            sending = loop.create_task(send_six(SchedulerClient(scheduler, timeout_s=60.0)))
            loop.run_until_complete(asyncio.sleep(0.5))  # every submit has happened; nothing decodes
            pipe.let_go()
            outcomes = loop.run_until_complete(sending)
        finally:
            loop.close()
    kinds = [o.kind for o in outcomes]
    assert kinds.count("refused") >= 4 and set(kinds) <= {"ok", "refused"}, kinds
    assert all("queue is full" in o.message for o in outcomes if o.kind == "refused")
    assert all(o.tokens is not None for o in outcomes if o.kind == "ok")


@pytest.mark.parametrize("argv,expected", [
    (["bench", "--serve", "--in-process", "--serve-url", "127.0.0.1:8001"], "--in-process"),
    (["bench", "--serve", "--in-process", "--loads", "0"], "--loads"),
    (["bench", "--serve", "--in-process", "--groups", "0"], "--groups"),
    (["bench", "--serve", "--in-process", "--groups", "17"], "--groups"),
])
def test_in_process_flag_mistakes_are_one_line(argv, expected, capsys):
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
