"""The onnxruntime-vs-PyTorch comparison reproduced by an independent tool, polygraphy."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from specrt.export.polygraphy_case import polygraphy_command, write_case
from tiny_export import tiny_bundle, tiny_models

pytestmark = pytest.mark.skipif(shutil.which("polygraphy") is None, reason="polygraphy is not installed (pip install polygraphy)")


def _polygraphy(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command.split(), capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("graph", ["target_step", "target_prefill", "vq_decode"])
def test_polygraphy_onnxrt_matches_saved_torch_outputs(tmp_path, graph):
    manifest, models = tiny_bundle()
    write_case(manifest.root, graph, models, tmp_path / "case")
    command = polygraphy_command(manifest.root, graph, tmp_path / "case")
    assert "--onnxrt" in command and "--data-loader-script" in command
    if graph != "vq_decode":  # the sampling head's outputs are compared too, draws exactly
        assert "probs:0.0001" in command and "draws:0 " in command
    result = _polygraphy(command)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "PASSED" in result.stdout


def test_polygraphy_fails_against_another_models_outputs(tmp_path):
    manifest, models = tiny_bundle()
    write_case(manifest.root, "target_step", tiny_models(seed=1), tmp_path / "case")
    result = _polygraphy(polygraphy_command(manifest.root, "target_step", tmp_path / "case"))
    assert result.returncode != 0
    assert "FAILED" in result.stdout
