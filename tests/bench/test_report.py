"""The bench's time-per-image table, JSON and Markdown: the cost model's speed-up from the run's own
graph timings beside the measured one, on synthetic results with known answers."""
from __future__ import annotations

import pytest

from specrt.bench.report import MethodResult, attach_speedups, format_breakdown, format_markdown, host_share, \
    to_json_object


def result(label: str, method: str, graphs_ms: tuple[float, float, float], host_ms: float,
           batch: int = 1) -> MethodResult:
    """A setting whose every image costs `graphs_ms` (target, draft, VQ decode) plus `host_ms` of host work."""
    target, draft, vq = (ms / 1000 for ms in graphs_ms)
    total = target + draft + vq + host_ms / 1000
    return MethodResult(method=method, params={}, label=label, images=4, mean_accepted_length=1.0,
                        target_forwards_per_image=64.0, draft_forwards_per_image=0.0,
                        latency_s={"median": total, "p90": total, "mean": total}, speedup_vs_ar=None,
                        breakdown_s={"target_forward": target, "draft_forward": draft, "verify_sample": host_ms / 2000,
                                     "cache": host_ms / 2000, "vq_decode": vq}, batch=batch)


@pytest.fixture
def results() -> list[MethodResult]:
    runs = [result("ar", "ar", (90.0, 0.0, 10.0), 10.0),
            result("sd", "sd", (40.0, 20.0, 10.0), 0.0),  # host work free: measured = predicted
            result("sjd", "sjd", (50.0, 0.0, 10.0), 30.0),
            result("sd batch=2", "sd", (30.0, 10.0, 10.0), 10.0, batch=2)]  # no ar at batch 2
    attach_speedups(runs)
    return runs


def test_prediction_is_ar_graph_time_over_the_setting_and_ar_predicts_one(results):
    ar, sd, sjd, batch2 = results
    assert ar.predicted_speedup_vs_ar == 1.0 and ar.mean_speedup_vs_ar == 1.0
    assert ar.measured_over_predicted == 1.0
    assert sd.predicted_speedup_vs_ar == pytest.approx(100 / 70)
    assert sjd.predicted_speedup_vs_ar == pytest.approx(100 / 60)
    assert batch2.predicted_speedup_vs_ar is None and batch2.measured_over_predicted is None


def test_measured_over_predicted_is_the_host_cost_alone(results):
    ar, sd, sjd, _ = results
    assert sd.mean_speedup_vs_ar == pytest.approx(110 / 70)
    # sd spends nothing on the host, ar 1/11 of its time: sd measures better than its graphs predict
    assert sd.measured_over_predicted == pytest.approx(sd.mean_speedup_vs_ar / sd.predicted_speedup_vs_ar)
    for r in (sd, sjd):
        assert r.measured_over_predicted == pytest.approx((1 - host_share(r)) / (1 - host_share(ar)))
    assert sjd.measured_over_predicted == pytest.approx((60 / 90) / (100 / 110))
    # with no host work anywhere, measured = predicted
    free = [result("ar", "ar", (90.0, 0.0, 10.0), 0.0), result("sd", "sd", (40.0, 20.0, 10.0), 0.0)]
    attach_speedups(free)
    assert free[1].mean_speedup_vs_ar == pytest.approx(free[1].predicted_speedup_vs_ar)
    assert free[1].measured_over_predicted == pytest.approx(1.0)


def test_time_per_image_table_shows_measured_and_predicted_for_every_setting(results):
    lines = format_breakdown(results).splitlines()
    assert lines[0].split()[-3:] == ["speed-up", "pred.", "meas/pred"]
    ar, sd, sjd, batch2 = (line.split()[-3:] for line in lines[2:])
    assert ar == ["1.00x", "1.00x", "1.00"]
    assert sd == ["1.57x", "1.43x", "1.10"]
    assert sjd == ["1.22x", "1.67x", "0.73"]
    assert batch2 == ["-", "-", "-"]  # no ar at its batch size


def test_json_and_markdown_carry_the_prediction_and_read_older_files(results):
    payload = to_json_object(results, device="cpu", backend="ort", bundle="b",
                             settings={"threads": 1, "images_per_setting": 4})
    sd = payload["results"][1]
    assert sd["predicted_speedup_vs_ar"] == pytest.approx(100 / 70)
    assert sd["measured_over_predicted"] == pytest.approx(1.1)
    assert sd["mean_speedup_vs_ar"] == pytest.approx(110 / 70)
    markdown = format_markdown(payload).splitlines()
    assert "| predicted (graphs only) | measured / predicted |" in markdown[0]
    assert markdown[3].startswith("| sd |") and "| 1.43x | 1.10 |" in markdown[3]
    assert all(line.count("|") == markdown[0].count("|") for line in markdown[1:2 + len(results)])
    older = {**payload, "results": [{k: v for k, v in r.items() if k not in
                                     ("predicted_speedup_vs_ar", "mean_speedup_vs_ar", "measured_over_predicted")}
                                    for r in payload["results"]]}  # written before the cost-model columns existed
    assert "| sd |" in format_markdown(older) and "| - | - |" in format_markdown(older)
