"""Model families as plug-ins (runtime/families): one entry point opens any bundle, the manifest
is read once and its damage is one line before any family's code, inspect describes every family."""
from __future__ import annotations

import json
import shutil
import numpy as np
import pytest

from specrt.cli import main
from specrt.errors import SpecrtError
from specrt.runtime.family_registry import FAMILIES, family, read_bundle

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from serving_fixtures import tiny_continuous_bundle  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402


@pytest.fixture(scope="module")
def continuous_bundle(tmp_path_factory):
    return tiny_continuous_bundle(tmp_path_factory.mktemp("families") / "bundle")


def specrt(capsys, *args):
    """The CLI in-process: (exit code, stdout, stderr)."""
    code = 0
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_registered_family_is_a_plugin_with_its_methods():
    for name in FAMILIES:
        plugin = family(name)
        assert plugin.name == name and plugin.methods and plugin.token_dtype in ("int64", "float32")
    assert family("continuous").methods == ("ar", "cspd")
    with pytest.raises(SpecrtError, match="unknown model family 'janus'.*llamagen, continuous"):
        family("janus")


def test_pipeline_from_bundle_opens_a_continuous_bundle_and_generates_cspd(continuous_bundle):
    pipe = Pipeline.from_bundle(continuous_bundle)
    result = pipe.generate([0, 2], method="cspd", seed=3, decode=False, draft_len=2)
    assert result.tokens.shape == (2, 4, 3) and result.tokens.dtype == np.float32
    again = Pipeline.from_bundle(continuous_bundle).generate([0, 2], method="cspd", seed=3, decode=False, draft_len=2)
    np.testing.assert_array_equal(result.tokens, again.tokens)


@pytest.mark.parametrize("damage,message", [
    ('{"family": "continuous", "models": ', "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"family": "janus"}', "unknown model family 'janus'"),
])
def test_a_damaged_manifest_is_one_line_before_any_family_code(continuous_bundle, tmp_path, capsys, damage, message):
    broken = tmp_path / "broken"
    shutil.copytree(continuous_bundle, broken)
    (broken / "manifest.json").write_text(damage)
    with pytest.raises(SpecrtError, match=message):
        read_bundle(broken)
    for command in (["generate", broken, "--method", "cspd", "--out", tmp_path / "x.png"], ["inspect", broken],
                    ["bench", broken, "--images", "1"]):
        code, _, err = specrt(capsys, *command)
        assert code == 2, (command, err)
        assert err.count("\n") == 1 and message.split("'")[0] in err, err


def test_inspect_describes_a_continuous_bundle_and_checks_it(continuous_bundle, tmp_path, capsys):
    code, out, err = specrt(capsys, "inspect", continuous_bundle)
    assert code == 0, err
    assert "continuous" in out and "methods: ar, cspd" in out
    assert "target_step.onnx" in out and "past_k" in out
    missing = tmp_path / "missing"
    shutil.copytree(continuous_bundle, missing)
    (missing / "draft_head.onnx").unlink()
    code, _, err = specrt(capsys, "inspect", missing)
    assert code == 2 and "lacks draft_head.onnx (draft head)" in err
    renamed = tmp_path / "renamed"
    shutil.copytree(continuous_bundle, renamed)
    manifest = json.loads((renamed / "manifest.json").read_text())
    manifest["step_io"][0][0] = "token_ids"
    (renamed / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = specrt(capsys, "inspect", renamed)
    assert code == 2 and "lacks token_ids" in err


def _count_manifest_work(monkeypatch) -> dict[str, list]:
    """Every read of a manifest.json file and every pass of the files' size and sha256 checks,
    counted wherever they happen (the readers all end in Path.read_text and verify_files)."""
    from pathlib import Path

    from specrt import manifest as manifest_module

    counted = {"reads": [], "verified": []}
    read_text, verify_files = Path.read_text, manifest_module.verify_files

    def read(self, *args, **kwargs):
        if self.name == manifest_module.MANIFEST_NAME:
            counted["reads"].append(self)
        return read_text(self, *args, **kwargs)

    def verify(manifest, check_hashes=True):
        counted["verified"].append(check_hashes)
        return verify_files(manifest, check_hashes)

    monkeypatch.setattr(Path, "read_text", read)
    monkeypatch.setattr(manifest_module, "verify_files", verify)
    return counted


def test_one_generate_call_reads_the_manifest_once(demo_bundle, continuous_bundle, tmp_path, capsys, monkeypatch):
    counted = _count_manifest_work(monkeypatch)
    code, _, err = specrt(capsys, "generate", demo_bundle, "--method", "sd", "--class", "3", "--out", tmp_path / "a.png")
    assert code == 0, err
    assert len(counted["reads"]) == 1 and counted["verified"] == [True]  # sizes and sha256, once
    counted["reads"].clear()
    code, _, err = specrt(capsys, "generate", continuous_bundle, "--method", "cspd", "--tokens-only",
                          "--out", tmp_path / "b.npy")
    assert code == 0, err
    assert len(counted["reads"]) == 1


def test_the_python_api_takes_the_manifest_read_once(demo_bundle, monkeypatch):
    counted = _count_manifest_work(monkeypatch)
    family, manifest = read_bundle(demo_bundle)
    assert family.name == "llamagen" and len(counted["reads"]) == 1 and counted["verified"] == [True]
    tokens = Pipeline.from_bundle(manifest).generate([3], method="sd", seed=0).tokens
    assert len(counted["reads"]) == 1 and len(counted["verified"]) == 1  # handed down, not read again
    np.testing.assert_array_equal(tokens, Pipeline.from_bundle(demo_bundle).generate([3], method="sd", seed=0).tokens)
    assert len(counted["reads"]) == 2  # a path: read (once) by the call that gets it


def test_modules_of_a_unified_model_are_that_familys():
    from types import SimpleNamespace

    from specrt.runtime.family_registry import modules_family

    unified = SimpleNamespace(config=SimpleNamespace(grammar=object()))
    assert modules_family(unified) is family("unified")
    assert modules_family(SimpleNamespace(config=SimpleNamespace())) is None  # LlamaGen's: Pipeline.from_torch's own
