"""Choosing a bundle backend: onnxruntime's providers and TensorRT engines, or a clear one-line refusal."""
from __future__ import annotations

import subprocess
import sys

import pytest

from specrt.errors import SpecrtError
from specrt.lazy import available
from specrt.runtime.backends.bundle_backends import BUNDLE_BACKENDS
from specrt.runtime.pipeline import Pipeline

pytest.importorskip("onnxruntime")
import onnxruntime  # noqa: E402


def test_ort_cpu_provider_runs_the_bundle(demo_bundle):
    tokens = Pipeline.from_bundle(demo_bundle, backend="ort-cpu").generate([2], method="sd", seed=0, temperature=0.0).tokens
    reference = Pipeline.from_bundle(demo_bundle).generate([2], method="sd", seed=0, temperature=0.0).tokens
    assert (tokens == reference).all()


@pytest.mark.skipif("CUDAExecutionProvider" in onnxruntime.get_available_providers(), reason="onnxruntime-gpu present")
def test_missing_cuda_provider_is_a_user_error(demo_bundle):
    with pytest.raises(SpecrtError, match="CUDAExecutionProvider.*onnxruntime-gpu"):
        Pipeline.from_bundle(demo_bundle, backend="ort-cuda")


@pytest.mark.skipif(available("tensorrt"), reason="TensorRT is installed")
def test_trt_without_tensorrt_fails_at_once_with_the_install_hint(demo_bundle):
    with pytest.raises(SpecrtError, match=r"TensorRT is not installed: pip install 'specrt\[trt\]'"):
        Pipeline.from_bundle(demo_bundle, backend="trt")


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_unknown_bundle_backend(demo_bundle, backend):
    with pytest.raises(SpecrtError, match="choose one of " + ", ".join(BUNDLE_BACKENDS)):
        Pipeline.from_bundle(demo_bundle, backend=backend)


@pytest.mark.skipif(available("tensorrt"), reason="TensorRT is installed")
def test_generate_backend_trt_is_one_line_and_exit_2(demo_bundle, tmp_path):
    done = subprocess.run([sys.executable, "-m", "specrt.cli", "generate", str(demo_bundle), "--backend", "trt",
                           "--out", str(tmp_path / "x.png")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "specrt: error: TensorRT is not installed: pip install 'specrt[trt]' " \
                                  "(on Jetson it comes with JetPack)"
    assert not (tmp_path / "x.png").exists()


def test_a_backend_whose_plugin_cannot_be_loaded_is_one_line(demo_bundle, monkeypatch):
    from specrt.runtime.backends import bundle_backends

    monkeypatch.setitem(bundle_backends.PROVIDERS, "ort-cpu", "specrt.no_such_layer:providers_for")
    with pytest.raises(SpecrtError, match="the ort-cpu backend's execution providers cannot be loaded"):
        Pipeline.from_bundle(demo_bundle, backend="ort-cpu")
