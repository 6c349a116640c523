"""`specrt plan-tree` end to end on the embedded demo (PyTorch modules, no export: seconds), its
plan used by `generate` and `bench --sweep`, and its one-line refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cli_helpers import one_line, run
from specrt.runtime.tree import StaticShape
from specrt.runtime.tree_latency import DynamicTree
from specrt.runtime.tree_plan_file import read_plan

pytest.importorskip("torch")

SMALL = ["--backend", "torch", "--images", "2", "--max-nodes", "6", "--probe-width", "3", "--probe-depth", "2",
         "--repeats", "1", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """A plan of the demo's draft GPT, made once for the module."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    from specrt.cli import main

    try:
        main(["plan-tree", *SMALL, "--out", str(out)])
    except SystemExit as exc:
        assert exc.code in (0, None)
    return out


def test_plan_tree_writes_a_plan_that_generate_and_bench_take(plan, tmp_path, capsys):
    data = json.loads(plan.read_text())
    assert data["format"] == "specrt-tree-plan" and 1 <= data["nodes"] <= 6
    assert data["measured_on"]["backend"] == "torch" and data["measured_on"]["images"] == 2
    assert len(data["latency"]["target_s"]) == 7 and data["predicted"]["faster"] in ("tree", "chain")
    counts = data["acceptance_counts"]
    assert len(counts["tried"]) == 3 and counts["tried"][0] > 0 and sum(counts["accepted"]) <= counts["tried"][0]
    # per depth: the probe's 2 levels at most (depth 2 only where a rank-0 child was accepted), totals their sums
    assert data["version"] == 3 and 1 <= len(counts["tried_by_depth"]) <= 2
    assert [sum(col) for col in zip(*counts["tried_by_depth"])] == counts["tried"]
    rows = data["acceptance_by_depth"]
    assert len(rows) == len(counts["tried_by_depth"]) and all(len(row) == len(data["acceptance"]) for row in rows)
    assert read_plan(plan).acceptance_by_depth == rows
    StaticShape(read_plan(plan).tree)
    code, _ = run(["generate", "--method", "sd", "--param", "tree=static", "--param", f"static_tree={plan}",
                   "--class", "3", "--tokens-only", "--out", str(tmp_path / "t.png"), "--threads", "1"], capsys)
    assert code == 0 and np.load(tmp_path / "t.npy").shape[0] == 1

    from specrt.bench.settings import build_settings

    settings = build_settings("ar", [f"sd:tree=static;static_tree={plan}"])
    assert settings[1].params == {"tree": "static", "static_tree": str(plan)}


@pytest.fixture(scope="module")
def dynamic_plan(tmp_path_factory):
    """A dynamic-tree plan of the demo's draft GPT, made once for the module."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("plan") / "dynamic.json"
    from specrt.cli import main

    try:
        main(["plan-tree", "--tree", "dynamic", *SMALL, "--out", str(out)])
    except SystemExit as exc:
        assert exc.code in (0, None)
    return out


def test_plan_tree_dynamic_writes_parameters_that_generate_takes_and_static_tree_refuses(dynamic_plan, tmp_path, capsys):
    data = json.loads(dynamic_plan.read_text())
    assert data["version"] == 3 and data["tree_kind"] == "dynamic" and 1 <= data["nodes"] <= 6
    assert data["measured_on"]["probe"] == {"tree": "dynamic", "width": 3, "depth": 2}
    dynamic = DynamicTree.covering(data["tree"])
    assert data["dynamic"] == dynamic.params() and data["predicted"]["tree"]["kind"] == "dynamic"
    assert 1 <= dynamic.tree_top_k <= 3 and dynamic.depth <= 6  # ranks of the 3-wide probe only
    # the chains are priced from the chain's own measured rounds (sampled drafts), not the top-k probe's a_0
    assert 0 < data["measured_on"]["chain_check"]["chain_a0_solved"] <= 1
    counts = data["acceptance_counts"]
    assert counts["tried"][0] > 0 and sum(counts["accepted"]) <= counts["tried"][0]
    assert read_plan(dynamic_plan, kind="dynamic").dynamic == dynamic
    code, _ = run(["generate", "--method", "sd", *dynamic.flags().split(), "--class", "3", "--tokens-only",
                   "--out", str(tmp_path / "t.png"), "--threads", "1"], capsys)
    assert code == 0 and np.load(tmp_path / "t.npy").shape[0] == 1
    code, err = run(["generate", "--method", "sd", "--param", "tree=static", "--param", f"static_tree={dynamic_plan}",
                     "--tokens-only", "--out", str(tmp_path / "u.png")], capsys)
    assert code == 2 and "is for a dynamic tree" in one_line(err) and dynamic.flags() in one_line(err)


@pytest.mark.parametrize("args,message", [
    (["--tree", "oak"], "Invalid value for '--tree'"),
    (["--tree", "dynamic", "--param", "tree_top_k=4"], "plan-tree chooses the tree itself"),
    (["--tree", "dynamic", "--probe-width", "40", "--probe-depth", "40"], "exceeds this model's max_window"),
    (["--images", "0"], "--images must be"),
    (["--param", "tree=chain"], "plan-tree chooses the tree itself"),
    (["--param", "relaxation_budget=0.5", "--method", "cool-sd"], "relaxation_budget"),
    (["--out", "/nonexistent-folder/plan.json"], "does not exist"),
    (["--backend", "ort", "--device", "cuda"], "--device cuda applies to --backend torch"),
    (["--probe-width", "40", "--probe-depth", "40"], "exceeds this model's max_window"),
])
def test_plan_tree_refuses_in_one_line(args, message, tmp_path, capsys):
    code, err = run(["plan-tree", *SMALL, "--out", str(tmp_path / "p.json"), *args], capsys)
    assert code == 2 and message in one_line(err), err


def test_a_bad_plan_file_is_one_line_at_the_cli(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    code, err = run(["generate", "--method", "sd", "--param", "tree=static", "--param", f"static_tree={bad}",
                     "--tokens-only", "--out", str(tmp_path / "t.png")], capsys)
    assert code == 2 and "is not a tree plan" in one_line(err)
    code, err = run(["bench", "--methods", "ar", "--sweep", f"sd:tree=static;static_tree={tmp_path / 'none.json'}",
                     "--images", "1"], capsys)
    assert code == 2 and "cannot read tree plan" in one_line(err)
