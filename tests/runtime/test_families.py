"""Model families as plug-ins (runtime/families): one entry point opens any bundle, the manifest
is read once and its damage is one line before any family's code, inspect describes every family."""
from __future__ import annotations

import json
import shutil
import numpy as np
import pytest

from specrt.cli import main
from specrt.errors import SpecrtError
from specrt.runtime.families import FAMILIES, family, read_bundle

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
