"""`specrt bench --loop`: one loop for the whole run, or several side by side (`--loop host,round`: every
setting once per loop, rows labelled, speed-ups against ar in the same loop, syncs per round shown)."""
from __future__ import annotations

import json

import pytest

from specrt.bench.report import MethodResult, attach_speedups, format_breakdown
from specrt.bench.settings import build_settings, parse_loops
from specrt.cli import main
from specrt.errors import SpecrtError
from tiny_demo import run_cli

IMAGES = 2




@pytest.fixture(scope="module")
def ab_run(demo_dir, tmp_path_factory):
    """ar, sd, cool-sd (δ 4, so the Theorem-2 pass runs) and sjd-pac in its round's form, host vs round,
    at batch 1 and 2."""
    out = tmp_path_factory.mktemp("bench") / "r.json"
    argv = ["bench", "--backend", "torch", "--demo-weights", str(demo_dir), "--images", str(IMAGES), "--batch", "1,2",
            "--methods", "ar,sd,cool-sd,sjd-pac", "--sweep", "cool-sd:delta=4",
            "--sweep", "sjd-pac:proactive_drafting=false", "--loop", "host,round", "--no-progress", "--json", str(out)]
    try:
        main(argv)
    except SystemExit as exc:
        assert not exc.code, f"specrt bench exited {exc.code}"
    return json.loads(out.read_text())


SETTINGS = ["ar", "sd", "cool-sd(delta=4)", "sjd-pac(proactive_drafting=False)"]


def test_every_setting_runs_once_per_loop_side_by_side(ab_run):
    labels = [r["label"] for r in ab_run["results"]]
    expected = [f"{s} loop={loop}" for s in SETTINGS for loop in ("host", "round")]
    assert labels == expected + [f"{label} batch=2" for label in expected]
    assert [r["loop"] for r in ab_run["results"]] == ["host", "round"] * 2 * len(SETTINGS)
    assert ab_run["settings"]["loop"] == ["host", "round"]
    assert [s.get("loop") for s in ab_run["settings"]["settings"]] == ["host", "round"] * len(SETTINGS)
    # the round, like the host loop, gives an image the same tokens alone or in a batch
    assert ab_run["settings"]["tokens_identical_across_batches"] is True


def test_speedups_are_against_ar_in_the_same_loop(ab_run):
    for result in ab_run["results"]:
        ar = next(r for r in ab_run["results"]
                  if r["method"] == "ar" and r["loop"] == result["loop"] and r["batch"] == result["batch"])
        assert result["speedup_vs_ar"] == pytest.approx(ar["latency_s"]["median"] / result["latency_s"]["median"])
        if result["method"] == "ar":
            assert result["speedup_vs_ar"] == 1.0 and result["measured_over_predicted"] == 1.0


def test_the_round_reads_the_host_once_a_round(ab_run):
    for result in ab_run["results"]:
        per_round, rounds = result["host_syncs_per_round"], result["target_calls_per_image"]
        assert per_round is not None, result["label"]
        if result["loop"] == "round":  # a call: one read a round, one at the start and one at the end, with
            # target_calls = rounds + 1 (the prefill): syncs = target calls + 1, at most one call an image
            assert per_round * rounds <= rounds + 1 + 1e-9, result["label"]
    by_label = {r["label"]: r for r in ab_run["results"]}
    for setting in ("sd", "cool-sd(delta=4)"):  # the host loop's drafted round waits for drafts and verification
        assert (by_label[f"{setting} loop=host"]["host_syncs_per_round"]
                > by_label[f"{setting} loop=round"]["host_syncs_per_round"] + 0.5)


def test_theorem2_estimates_come_from_the_host_loop_for_both_rows(ab_run):
    """The round has no Theorem-2 estimates: the untimed pass runs the host loop for a round row too."""
    by_label = {r["label"]: r for r in ab_run["results"]}
    host, device = (by_label[f"cool-sd(delta=4) loop={loop}"]["theory"] for loop in ("host", "round"))
    assert host["tv_bound"] > 0 and device["tv_bound"] == pytest.approx(host["tv_bound"])


def test_one_loop_labels_nothing_and_is_recorded(demo_dir, tmp_path, capsys):
    code, out, err = run_cli(["bench", "--backend", "torch", "--demo-weights", str(demo_dir), "--images", "1",
                              "--methods", "ar", "--loop", "round", "--no-progress",
                              "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    payload = json.loads((tmp_path / "r.json").read_text())
    (ar,) = payload["results"]
    assert ar["label"] == "ar" and "loop" not in ar and payload["settings"]["loop"] == "round"
    assert ar["host_syncs_per_round"] * ar["target_calls_per_image"] <= ar["target_calls_per_image"] + 1 + 1e-9
    assert "syncs/round" in out and "syncs/fwd" not in out


@pytest.mark.parametrize("flags, message", [
    (["--loop", "bogus"], "--loop 'bogus': expected auto, round, host"),
    (["--loop", "host,round"], "--loop round runs on --backend torch"),  # the default backend, ort: no round
    (["--backend", "torch", "--loop", "host,round", "--profile-arch", "llamagen-c2i-B"], "--profile-arch times"),
    (["--loop", "host", "--precision", "fp32"], "--precision runs bundles"),
    (["--demo", "mar", "--loop", "host,round"], "--loop round runs on --backend torch"),  # the mar demo on ort
])
def test_loop_mistakes_exit_2_in_one_line_before_anything_loads(flags, message, tmp_path, capsys):
    code, out, err = run_cli(["bench", *flags, "--cache-dir", str(tmp_path / "cache"), "--no-progress"], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_setting_without_a_round_is_named(demo_dir, capsys):  # a spine wider than the window: K·D = 4 > L = 3
    code, _, err = run_cli(["bench", "--backend", "torch", "--demo-weights", str(demo_dir), "--images", "1",
                            "--methods", "ar", "--sweep", "sjd-pac:window=3;K=2;D=2", "--loop", "host,round",
                            "--no-progress"], capsys)
    assert code == 2 and "loop=round:" in err and "no device round" in err


def test_loops_parse_and_expand_settings():
    assert parse_loops(" host, round,host") == ("host", "round")
    for bad in ("", "hots", "host,,gpu"):
        with pytest.raises(SpecrtError, match="--loop"):
            parse_loops(bad)
    assert [s.label for s in build_settings("ar,sd", loops=("round",))] == ["ar", "sd"]  # one loop: the pipeline's
    expanded = build_settings("ar", ["cool-sd:delta=4"], loops=("host", "round"))
    assert [s.label for s in expanded] == ["ar loop=host", "ar loop=round", "cool-sd(delta=4) loop=host",
                                           "cool-sd(delta=4) loop=round"]
    assert len(set(expanded)) == 4  # the loop is part of a setting's identity


def result(label: str, method: str, loop: str, total_ms: float, syncs: float) -> MethodResult:
    total = total_ms / 1000
    return MethodResult(method=method, params={}, label=label, images=1, mean_accepted_length=1.0,
                        target_forwards_per_image=64.0, draft_forwards_per_image=0.0,
                        latency_s={"median": total, "p90": total, "mean": total}, speedup_vs_ar=None,
                        breakdown_s={"target_forward": total}, host_syncs_per_round=syncs, loop=loop)


def test_breakdown_shows_syncs_per_round_and_speedups_within_each_loop():
    rows = [result("ar loop=host", "ar", "host", 100.0, 1.0), result("ar loop=round", "ar", "round", 50.0, 1.02),
            result("sd loop=host", "sd", "host", 80.0, 2.0), result("sd loop=round", "sd", "round", 25.0, 1.04)]
    attach_speedups(rows)
    assert [r.speedup_vs_ar for r in rows] == [1.0, 1.0, pytest.approx(1.25), pytest.approx(2.0)]
    lines = format_breakdown(rows).splitlines()
    end = lines[0].index("syncs/round") + len("syncs/round")  # the column's right edge
    assert [line[:end].split()[-1] for line in lines[2:]] == ["1.00", "1.02", "2.00", "1.04"]


def test_a_round_rows_prediction_comes_from_its_host_loop_twin():
    """The round counts its whole time as the target's, so its own breakdown would predict exactly what
    it measured; its prediction is the host loop's graph-time speed-up for the same setting (host work
    free), and meas/pred says how much of that the round reaches."""
    ar_host, sd_host = result("ar loop=host", "ar", "host", 100.0, 1.0), result("sd loop=host", "sd", "host", 80.0, 2.0)
    sd_host.breakdown_s = {"target_forward": 0.030, "draft_forward": 0.010}  # graphs 40 ms of its 80: pred 2.5
    rows = [ar_host, result("ar loop=round", "ar", "round", 50.0, 1.02), sd_host,
            result("sd loop=round", "sd", "round", 25.0, 1.04)]
    attach_speedups(rows)
    assert rows[1].predicted_speedup_vs_ar == pytest.approx(1.0)  # ar against ar, from the host rows
    assert rows[3].predicted_speedup_vs_ar == pytest.approx(2.5)
    assert rows[3].measured_over_predicted == pytest.approx(2.0 / 2.5)
    alone = [result("ar loop=round", "ar", "round", 50.0, 1.0), result("sd loop=round", "sd", "round", 25.0, 1.0)]
    attach_speedups(alone)  # no host twins: its own breakdown, as before
    assert alone[1].predicted_speedup_vs_ar == pytest.approx(2.0)


def test_a_run_of_more_round_settings_than_a_pipeline_keeps_plans_each_round_once(demo_dir, capsys, monkeypatch):
    """Six round settings alternate image by image, more than the rounds a pipeline keeps by default: the
    bench lets it keep one per setting, so each is planned (and on a GPU captured) once, at its warm-up."""
    from specrt.runtime import rounds

    planned, plan = [], rounds.plan_round
    monkeypatch.setattr(rounds, "plan_round", lambda method, *rest: planned.append(method.name) or plan(method, *rest))
    methods = ["ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac"]
    assert len(methods) > rounds.KEPT_ROUNDS
    code, _, err = run_cli(["bench", "--backend", "torch", "--demo-weights", str(demo_dir), "--images", "3",
                            "--methods", ",".join(methods), "--sweep", "sjd-pac:proactive_drafting=false",
                            "--loop", "round", "--no-progress"], capsys)
    assert code == 0, err
    assert sorted(planned) == sorted(methods)
