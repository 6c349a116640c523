"""`specrt bench --demo mar --backend torch --loop host,round`: the continuous family's device round and
host loop side by side (rows labelled by loop, speed-ups against ar in the same loop, the host share and
the round's host reads beside them); the flags that need the PyTorch backend are refused elsewhere."""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from tiny_demo import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from serving_fixtures import tiny_continuous_bundle  # noqa: E402

SETTINGS = ["ar", "cspd(draft_len=2)"]


@pytest.fixture(scope="module")
def loops_run(tmp_path_factory):
    """ar and cspd on the mar demo's PyTorch modules, each once per loop, at batch 1 and 2: the JSON
    payload and the printed text."""
    from specrt.cli import main

    out, printed = tmp_path_factory.mktemp("mar-bench") / "r.json", io.StringIO()
    argv = ["bench", "--demo", "mar", "--backend", "torch", "--device", "cpu", "--loop", "host,round",
            "--methods", "ar,cspd", "--sweep", "cspd:draft_len=2", "--images", "2", "--batch", "1,2",
            "--no-progress", "--json", str(out)]
    with contextlib.redirect_stdout(printed):
        try:
            main(argv)
        except SystemExit as exc:
            assert not exc.code, f"specrt bench exited {exc.code}"
    return json.loads(out.read_text()), printed.getvalue()


def test_every_setting_runs_once_per_loop_and_the_loops_agree(loops_run):
    payload = loops_run[0]
    rows = payload["results"]
    expected = [f"{s} loop={loop}" for s in SETTINGS for loop in ("host", "round")]
    assert [r["label"] for r in rows] == expected + [f"{label} batch=2" for label in expected]
    assert [r["loop"] for r in rows] == ["host", "round"] * 4 and payload["loop"] == ["host", "round"]
    by_label = {r["label"]: r for r in rows}
    for label in [s for s in by_label if "loop=host" in s]:  # the same tokens for a seed: the same passes
        host, device = by_label[label], by_label[label.replace("loop=host", "loop=round")]
        assert host["tokens_per_target_pass"] == device["tokens_per_target_pass"]
        assert host["target_passes_per_image"] == device["target_passes_per_image"]
    assert by_label["cspd(draft_len=2) loop=round"]["tokens_per_target_pass"] > 1


def test_speedups_are_against_ar_in_the_same_loop_and_batch(loops_run):
    rows = loops_run[0]["results"]
    for row in rows:
        ar = next(r for r in rows
                  if r["method"] == "ar" and r["loop"] == row["loop"] and r["batch"] == row["batch"])
        assert row["speedup_vs_ar"] == pytest.approx(ar["latency_s"]["median"] / row["latency_s"]["median"])


def test_the_round_counts_its_reads_and_the_host_share_is_a_share(loops_run):
    for row in loops_run[0]["results"]:
        assert 0 <= row["host_share"] < 1, row["label"]
        if row["loop"] == "round":  # one read a round, two a call (its tokens and counters)
            assert 1 < row["host_syncs_per_round"] <= 1 + 2 / 20, row["label"]
        else:
            assert row["host_syncs_per_round"] is None


def test_the_table_prints_both_loops_with_host_share_and_reads(loops_run):
    lines = loops_run[1].splitlines()
    header = next(line for line in lines if line.startswith("setting "))
    host, device = (next(line for line in lines if line.startswith(f"ar loop={loop} ")) for loop in ("host", "round"))
    assert "host %" in header
    end = header.index("syncs/round") + len("syncs/round")  # the column's right edge
    assert host[:end].split()[-1] == "-" and float(device[:end].split()[-1]) > 1  # counted by the round alone


@pytest.fixture(scope="module")
def continuous_bundle(tmp_path_factory):
    return tiny_continuous_bundle(tmp_path_factory.mktemp("continuous") / "bundle")


@pytest.mark.parametrize("flags, message", [
    (["--loop", "host,round"], "--loop round runs on --backend torch"),
    (["--loop", "round", "--backend", "torch"], "a BUNDLE runs on the ort backend"),
    (["--device", "cuda"], "--device cuda applies to --backend torch"),
])
def test_a_continuous_bundle_refuses_the_torch_flags_in_one_line(continuous_bundle, flags, message, capsys):
    code, _, err = run_cli(["bench", str(continuous_bundle), *flags, "--no-progress"], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("device, message", [
    ("gpu", "--device must be cpu, cuda or cuda:N"),
    ("cuda:x", "--device must be cpu, cuda or cuda:N"),
])
def test_a_bad_device_exits_2_before_the_demo_loads(device, message, tmp_path, capsys):
    code, _, err = run_cli(["bench", "--demo", "mar", "--backend", "torch", "--device", device,
                            "--cache-dir", str(tmp_path / "cache"), "--no-progress"], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
