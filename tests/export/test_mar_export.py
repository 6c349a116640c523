"""The continuous family's bundle: graphs with dynamic rows, manifest family, --verify, mistakes."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from specrt.errors import SpecrtError

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from specrt.export.mar.export import export_bundle, verify_bundle  # noqa: E402
from specrt.models.mar.model import MARConfig, random_mar  # noqa: E402
from specrt.runtime.families.continuous.bundle import open_runner  # noqa: E402
from specrt.runtime.family_registry import bundle_family  # noqa: E402
from specrt.runtime.families.continuous.methods import make_continuous_method  # noqa: E402

SHARED = dict(token_dim=3, seq_len=4, n_head=2, diffusion_steps=4)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    target = random_mar(MARConfig(dim=32, n_layer=2, **SHARED), seed=0)
    draft = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **SHARED), seed=1)
    return export_bundle(target, draft, tmp_path_factory.mktemp("mar") / "bundle")


def test_manifest_names_the_family_and_every_file(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["family"] == "continuous" and bundle_family(bundle) == "continuous"
    for role in ("target", "draft"):
        entry = manifest["models"][role]
        assert entry["family"] == "continuous"
        assert all((bundle / entry[key]).is_file() for key in ("step", "head", "weights"))
    assert manifest["models"]["draft"]["config"]["dim"] < manifest["models"]["target"]["config"]["dim"]


def test_verify_covers_step_windows_and_head_rows(bundle):
    lines = verify_bundle(bundle)
    assert any("target step rows 2 past 2 window 3" in line for line in lines)
    assert any("draft head rows 5" in line for line in lines)


def test_verify_catches_a_graph_that_disagrees_with_the_weights(bundle, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    other = random_mar(MARConfig(dim=32, n_layer=2, **SHARED), seed=7)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(broken / manifest["models"]["target"]["weights"]))
    with pytest.raises(SpecrtError, match="onnxruntime and torch differ"):
        verify_bundle(broken)


def test_the_llamagen_reader_refuses_a_continuous_bundle_in_one_line(bundle):
    from specrt.manifest import read_manifest

    with pytest.raises(SpecrtError, match="continuous"):
        read_manifest(bundle)


def test_the_step_graph_keeps_a_kv_cache_the_runtime_owns(bundle):
    """Decoding token by token through the cache equals one window over the whole prefix."""
    runner = open_runner(bundle, "target")
    inputs = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    for cfg_scale in (1.0, 3.0):  # one row, then CFG's [class; unconditional]
        runner.start(2, cfg_scale)
        whole = runner.step(inputs)
        runner.truncate(0)
        pieces = []
        for row in range(4):
            pieces.append(runner.step(inputs[row : row + 1]))
            runner.commit(1)
        np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, atol=1e-5)
    assert whole.shape[0] == 2 and np.abs(whole[0] - whole[1]).max() > 1e-3


def test_method_parameters_are_validated():
    assert make_continuous_method("cspd", draft_len="3", prefill_ratio="0.1").draft_len == 3
    for params, text in [({"draft_len": 0}, "draft_len"), ({"draft_len": 2.5}, "draft_len"),
                         ({"prefill_ratio": 1.5}, "prefill_ratio"), ({"prefill_ratio": "nan"}, "prefill_ratio"),
                         ({"residual_batch": 0}, "residual_batch"), ({"window": 3}, "no parameter")]:
        with pytest.raises(SpecrtError, match=text) as info:
            make_continuous_method("cspd", **params)
        assert "\n" not in str(info.value)
    with pytest.raises(SpecrtError, match="choose one of ar, cspd"):
        make_continuous_method("sjd")


def test_cli_refuses_continuous_exports_it_cannot_make(tmp_path, capsys):
    """(The CLI export + --verify itself runs on the mar demo: tests/export/test_mar_demo.py.)"""
    from tiny_export import cli_exit_code

    out = str(tmp_path / "x")
    assert cli_exit_code(["export", "--family", "continuous", "--random-weights", "--demo-weights", out, "--out", out]) == 2
    assert "--random-weights makes its own weights" in capsys.readouterr().err
    import torch

    checkpoint = tmp_path / "mar.pth"  # a real torch checkpoint: the continuous export still cannot read it
    torch.save({"model": {}}, checkpoint)
    assert cli_exit_code(["export", "--demo", "mar", "--target", str(checkpoint), "--out", out]) == 2
    assert "LTH14/mar checkpoints load in Python" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
