"""`specrt bench` with auto's row: the setting --method auto chooses on the run's own pipeline (the
real probe, on the tiny random demo) is measured beside the fixed settings and says what it chose."""
from __future__ import annotations

import json

import pytest

from tiny_demo import run_cli

pytest.importorskip("torch")


def test_auto_row_beside_the_fixed_ones(demo_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = run_cli(["bench", "--backend", "torch", "--demo-weights", str(demo_dir), "--images", "2",
                              "--methods", "ar,auto", "--no-progress", "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    payload = json.loads((tmp_path / "r.json").read_text())
    auto = payload["settings"]["auto"]
    rows = {r["label"]: r for r in payload["results"]}
    label = next(label for label in rows if label.startswith("auto:"))
    row = rows[label]
    assert auto["guarantee"] == "lossless" and auto["batch"] == 1
    assert f"{row['method']}({','.join(f'{k}={v}' for k, v in sorted(row['params'].items()))})".rstrip("()") == \
        auto["chose"].rstrip("()")
    assert row["theory"]["lossless"] is True  # the guarantee: a lossless method's row
    predicted = {c["label"]: c["predicted_speedup"] for c in auto["candidates"]}
    assert predicted["ar"] == pytest.approx(1.0) and max(predicted.values()) >= auto["predicted_speedup"]
    assert not any(c["method"] in ("cool-sd", "lantern", "gsd") for c in auto["candidates"])
    assert label in out
    assert list((tmp_path / "cache" / "auto").glob("*.json"))  # the choice is cached for generate too
