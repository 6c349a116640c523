"""`specrt bench BUNDLE --precision fp32,int8,int4`: the same settings on the bundle and its
quantized copies (int8 and int4 by onnxruntime's quantizers on this CPU-only machine; the
quantizers themselves are tested in tests/engines).
"""
from __future__ import annotations

import json

import pytest

from tiny_demo import run_cli



def test_precision_run_reports_speed_weights_and_fidelity_against_fp32(demo_bundle, tmp_path, capsys):
    path = tmp_path / "p.json"
    code, out, err = run_cli(["bench", str(demo_bundle), "--precision", "fp32,int8,int4", "--methods", "ar,sd",
                              "--images", "2", "--cache-dir", str(tmp_path / "cache"), "--no-progress",
                              "--json", str(path)], capsys)
    assert code == 0, err
    payload = json.loads(path.read_text())
    rows = {(r["precision"], r["label"]): r for r in payload["rows"]}
    assert set(rows) == {(p, m) for p in ("fp32", "int8", "int4") for m in ("ar", "sd")}
    assert {p: rows[p, "ar"]["quantizer"] for p in ("fp32", "int8", "int4")} == {
        "fp32": "-", "int8": "onnxruntime", "int4": "onnxruntime"}
    assert rows["int8", "ar"]["greedy_agreement"] > rows["int4", "ar"]["greedy_agreement"]  # 8 bits stay closer
    assert rows["int8", "sd"]["weight_mb_per_target_step"] < rows["fp32", "sd"]["weight_mb_per_target_step"] / 3
    assert rows["fp32", "ar"]["speedup_vs_fp32_ar"] == pytest.approx(1.0)
    assert rows["fp32", "ar"]["greedy_agreement"] == 1.0
    assert 0.3 < rows["int4", "ar"]["greedy_agreement"] < 1.0  # close to fp32, not the same graph
    assert rows["int4", "sd"]["weight_mb_per_target_step"] < rows["fp32", "sd"]["weight_mb_per_target_step"] / 4
    assert rows["int4", "sd"]["accepted_length"] >= 1.0 and rows["int4", "sd"]["class_accuracy"] is not None
    assert set(payload["runs"]) == {"fp32", "int8", "int4"}
    assert "int4" in payload["bundles"]["int4"] and (tmp_path / "cache").is_dir()
    assert "greedy agree" in out and "MB/target step" in out and "vs fp32 ar" in out and "quantizer" in out


@pytest.mark.parametrize("argv,fragment", [
    (["--precision", "fp32,int3"], "unknown int3"),
    (["--precision", "int4"], "must include fp32"),
    (["--precision", "fp32,int4", "--backend", "torch"], "not --backend torch"),
])
def test_precision_user_errors_are_one_line(argv, fragment, capsys):
    code, _out, err = run_cli(["bench", *argv, "--no-progress"], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1
