"""runtime.tree_plan_file: plan files written and read, and as `static_tree` values (read once per version,
refused in one line).

Exactness of static trees is tested elsewhere (test_losslessness, test_planted_bugs); here a plan
file only has to give the same shape, hence the same tokens, as the same paths given by name.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from _toy_exact import one_torch_thread  # noqa: F401 (autouse fixture)
from specrt.errors import SpecrtError
from specrt.runtime.methods import make_method
from specrt.runtime.tree import STATIC_TREES, static_shape
from specrt.runtime.tree_latency import Latency
from specrt.runtime.tree_plan import make_plan
from specrt.runtime.tree_plan_file import TreePlan, read_plan, write_plan

A = [0.6, 0.2, 0.1]


def test_a_version_1_plan_is_read_with_its_pooled_acceptance_at_every_depth(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "specrt-tree-plan", "version": 1, "tree": [[0], [1], [0, 0]],
                                "acceptance": [0.7, 0.1]}))
    plan = read_plan(path)
    assert plan.tree == [[0], [1], [0, 0]] and plan.acceptance == [0.7, 0.1]
    assert plan.acceptance_by_depth == [[0.7, 0.1]]  # one row: every depth
    assert static_shape(str(path)).size == 3


def plan_file(tmp_path, paths, name="plan.json"):
    return str(write_plan(tmp_path / name, TreePlan(paths, list(A))))


def test_static_tree_takes_a_plan_file_and_generates_what_the_same_shape_by_name_does(tmp_path, monkeypatch):
    from specrt.runtime.backends.toy import toy_models
    from specrt.runtime.pipeline import Pipeline

    paths = STATIC_TREES["reverse_balanced_25"]
    plan = plan_file(tmp_path, paths)
    assert static_shape(plan).children == static_shape("reverse_balanced_25").children
    assert make_method("sd", tree="static", static_tree=plan).max_window == 26
    target, draft, vq = toy_models(vocab_size=6, grid_size=3, max_window=26)
    pipe = Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 2.0})
    by_name = pipe.generate([0, 1], method="sd", seed=3, tree="static", static_tree="reverse_balanced_25").tokens
    by_file = pipe.generate([0, 1], method="sd", seed=3, tree="static", static_tree=plan).tokens
    np.testing.assert_array_equal(by_name, by_file)


@pytest.mark.parametrize("content,message", [
    (None, "cannot read tree plan"),
    ("{not json", "is not JSON"),
    ('{"tree": [[0]]}', "is not a tree plan"),
    ('{"format": "specrt-tree-plan", "version": 9, "tree": [[0]]}', "version 9"),
    ('{"format": "specrt-tree-plan", "version": 1, "tree": [[0], ["x"]]}', "rank paths"),
    ('{"format": "specrt-tree-plan", "version": 1, "tree": [[0], [2]]}', "lower-ranked siblings"),
    ('{"format": "specrt-tree-plan", "version": 1, "tree": [[0]], "latency": {"target_s": []}}', "latency"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [0.7, 0.1]}',
     "one list of probabilities per depth"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7], 0.5]}',
     "one list of probabilities per depth"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7], [1.5]]}',
     "a_0 at depth 2 must be a probability"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7, "x"]]}',
     "a_1 at depth 1 must be a probability"),
    ('{"format": "specrt-tree-plan", "version": 2, "tree": [[0]], "acceptance_by_depth": [[0.7, 0.1], [0.2, 0.3]]}',
     "must not increase with the sibling rank: a_1 at depth 2"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "oak", "tree": [[0]]}', "tree_kind"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "dynamic", "tree": [[0]]}', "a dynamic plan needs"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "dynamic", "tree": [[0]], '
     '"dynamic": {"total_tokens": 0, "depth": 1, "tree_top_k": 1}}', "total_tokens must be a positive integer"),
    ('{"format": "specrt-tree-plan", "version": 3, "tree_kind": "dynamic", "tree": [[0]], '
     '"dynamic": {"total_tokens": 1, "depth": 1, "tree_top_k": 1}}', "is for a dynamic tree.*tree_top_k=1"),
])
def test_bad_plan_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    for make in (lambda: static_shape(str(path)), lambda: make_method("sd", tree="static", static_tree=str(path))):
        with pytest.raises(SpecrtError, match=message) as err:
            make()
        assert "\n" not in str(err.value) and "bad.json" in str(err.value)
    with pytest.raises(SpecrtError, match="must be one of .* or a tree plan file"):
        make_method("sd", static_tree="oak")


def test_a_dynamic_plan_is_refused_as_a_static_tree_in_one_line(tmp_path):
    latency = Latency([1e-3] * 70, [1e-4] * 70)
    path = str(write_plan(tmp_path / "dynamic.json", make_plan(A, latency, 12, kind="dynamic")))
    flags = read_plan(path, kind=None).dynamic.flags()
    for make in (lambda: static_shape(path), lambda: make_method("sd", tree="static", static_tree=path),
                 lambda: read_plan(path)):
        with pytest.raises(SpecrtError, match="is for a dynamic tree, not a static_tree shape") as err:
            make()
        assert "\n" not in str(err.value) and flags in str(err.value)
    static = plan_file(tmp_path, [[0], [1]], "static.json")
    with pytest.raises(SpecrtError, match="is for a static tree: use --param tree=static"):
        read_plan(static, kind="dynamic")
    # a version 2 file (no tree_kind) is a static plan
    old = tmp_path / "v2.json"
    old.write_text(json.dumps({"format": "specrt-tree-plan", "version": 2, "tree": [[0], [1]], "acceptance": [0.7, 0.1]}))
    assert read_plan(old).dynamic is None and static_shape(str(old)).size == 2


def test_a_plan_file_is_parsed_once_per_version_and_a_rewritten_plan_is_seen(tmp_path, monkeypatch):
    import specrt.runtime.tree as tree

    plan = plan_file(tmp_path, [[0]])
    reads = []
    monkeypatch.setattr(tree, "read_plan", lambda *a, **k: reads.append(a) or read_plan(*a, **k))
    assert static_shape(plan).size == 1 and static_shape(plan).size == 1
    assert len(reads) == 1  # the second ask is the cached shape
    plan_file(tmp_path, [[0], [1], [0, 0]])  # the same path rewritten
    assert static_shape(plan).size == 3 and len(reads) == 2
