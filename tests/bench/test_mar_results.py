"""The committed continuous-demo run (bench/results/mar-demo.json) is complete and says what docs/benchmarks.md reads."""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_mar_demo_results_compare_ar_and_cspd_on_a_named_device():
    payload = json.loads((RESULTS / "mar-demo.json").read_text())
    assert payload["device"] and payload["backend"] == "ort"
    rows = payload["results"]
    assert rows[0]["method"] == "ar" and rows[0]["speedup_vs_ar"] == 1.0
    cspd = [r for r in rows if r["method"] == "cspd"]
    assert [r["params"]["draft_len"] for r in cspd] == [2, 4, 8]
    for row in cspd:
        assert row["tokens_per_target_pass"] > 1 and 0 < row["acceptance_rate"] < 1
        assert row["quality"]["fd_images"] == payload["fd_noise_floor"]["images"]
    assert "2-core AMD EPYC CPU, shared" in (RESULTS / "mar-demo.txt").read_text()
