"""`specrt triton-repo`: the config.pbtxt Triton reads, and the model.py it runs, without Triton.

The config is parsed with Triton's own ModelConfig protobuf (from tritonclient) and checked for
the protocol's tensors, dynamic batching and one instance per GPU; model.py is imported from
the written repository and its execute runs on fake Triton requests (a stand-in for the
`triton_python_backend_utils` module the Python-backend stub provides). The same for a
continuous bundle (FP32 tokens, CPU instances); both also run on the stock tritonserver binary.
"""
from __future__ import annotations

import importlib.util
import io
import json
import sys
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parents[1] / "export"))

from tiny_export import cli_exit_code, tiny_bundle  # noqa: E402

from specrt.runtime.pipeline import Pipeline  # noqa: E402
from specrt.runtime.serving.protocol import INPUTS, OUTPUTS  # noqa: E402
from specrt.runtime.serving.repository import config_dtype  # noqa: E402


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    manifest, _ = tiny_bundle()
    out = tmp_path_factory.mktemp("repo") / "models"
    assert cli_exit_code(["triton-repo", str(manifest.root), "--out", str(out), "--max-batch", "4",
                          "--backend", "ort-cuda"]) == 0
    return out


def parsed_config(path: Path):
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install 'specrt[serve]')")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_config_declares_the_protocol(repo):
    from tritonclient.grpc import model_config_pb2 as pb

    config = parsed_config(repo / "specrt" / "config.pbtxt")
    assert config.name == "specrt" and config.backend == "python" and config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert [(g.kind, g.count) for g in config.instance_group] == [(pb.ModelInstanceGroup.KIND_GPU, 1)]
    assert [(t.name, pb.DataType.Name(t.data_type), list(t.dims), t.optional) for t in config.input] == \
        [(s.name, config_dtype(s.dtype), list(s.shape), True) for s in INPUTS]
    assert [(t.name, pb.DataType.Name(t.data_type), list(t.dims)) for t in config.output] == \
        [(s.name, config_dtype(s.dtype), list(s.shape)) for s in OUTPUTS]
    assert config.parameters["backend"].string_value == "ort-cuda"
    assert (repo / "specrt" / "1" / "bundle" / "manifest.json").is_file()
    assert not [p for p in repo.parent.iterdir() if p.name.startswith(".")]  # no partial folder left


class _Tensor:
    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Response:
    def __init__(self, output_tensors: list, error=None):
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors}


def fake_pb_utils() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    module.Tensor = _Tensor
    module.InferenceResponse = _Response
    module.get_input_tensor_by_name = lambda request, name: request.get(name)
    return module


def loaded_model(model_dir, monkeypatch, backend=None):
    """The repository's model.py loaded and initialized as Triton's Python backend would (its
    config as Triton hands it over; `backend` overrides the config's), on the fake pb_utils."""
    from google.protobuf import json_format

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils())
    spec = importlib.util.spec_from_file_location(f"specrt_triton_model_{model_dir.parent.name}",
                                                  model_dir / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = json_format.MessageToDict(parsed_config(model_dir / "config.pbtxt"), preserving_proto_field_name=True)
    if backend is not None:
        config["parameters"]["backend"] = {"string_value": backend}
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(model_dir), "model_version": "1",
                      "model_instance_kind": "CPU", "model_instance_device_id": "0"})
    return model


def test_model_py_runs_execute_without_triton(repo, monkeypatch):
    model = loaded_model(repo / "specrt", monkeypatch, backend="ort")  # no GPU here

    def request(**inputs):
        return {name: _Tensor(name, value) for name, value in inputs.items()}

    good = request(class_id=np.array([[2], [4]], np.int64), method=np.array([[b"sjd"], [b"sjd"]], object),
                   seed=np.array([[3], [9]], np.uint64), params=np.array([[b'{"window": 4}']] * 2, object))
    bad = request(class_id=np.array([[1]], np.int64), params=np.array([[b"{window"]], object))
    responses = model.execute([good, bad])
    assert len(responses) == 2

    reference = Pipeline.from_bundle(repo / "specrt" / "1" / "bundle", threads=1)
    served = responses[0].outputs
    for row, (class_id, seed) in enumerate([(2, 3), (4, 9)]):
        expected = reference.generate([class_id], method="sjd", seed=seed, window=4)
        np.testing.assert_array_equal(served["tokens"][row], expected.tokens.reshape(-1))
        assert bytes(served["image"][row, 0]).startswith(b"\x89PNG") and served["error"][row, 0] == b""
        assert json.loads(served["stats"][row, 0])["method"] == "sjd"
    assert responses[1].outputs["error"][0, 0].decode().startswith("params is not valid JSON")


def test_refusals_are_one_line(tmp_path, capsys):
    manifest, _ = tiny_bundle()
    assert cli_exit_code(["triton-repo", str(manifest.root), "--out", str(tmp_path / "r"), "--instance-kind", "cpu",
                          "--backend", "trt"]) == 2
    assert "with --instance-kind cpu use ort" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert cli_exit_code(["triton-repo", str(manifest.root), "--out", str(tmp_path / "taken")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli_exit_code(["triton-repo", str(tmp_path / "taken"), "--out", str(tmp_path / "r")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@contextmanager
def stock_tritonserver(repo: Path, tmp_path: Path) -> Iterator[int]:
    """tritonserver on `repo` (the binary PyTriton's wheel bundles, started the way the stock
    container starts it) on 127.0.0.1, once its model 'specrt' is ready; yields the gRPC port.
    Stopped (terminate, then kill) when the block ends; every wait bounded."""
    pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install 'specrt[serve]')")
    import os
    import shutil
    import subprocess
    import time
    import urllib.request

    from pytriton.utils.distribution import get_libs_path, get_root_module_path, get_stub_path
    from serving_fixtures import free_ports

    server = tmp_path / "tritonserver"  # the stub for this interpreter in place, as PyTriton does
    shutil.copytree(get_root_module_path() / "tritonserver", server, ignore=shutil.ignore_patterns("python_backend_stubs"))
    shutil.copy(get_stub_path(f"{sys.version_info[0]}.{sys.version_info[1]}"),
                server / "backends" / "python" / "triton_python_backend_stub")
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(filter(None, [os.environ.get("LD_LIBRARY_PATH"),
                                                                  str(get_libs_path())])),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    http, grpc, metrics = free_ports(3)
    log = open(tmp_path / "tritonserver.log", "w")
    process = subprocess.Popen([str(server / "bin" / "tritonserver"), f"--model-repository={repo}",
                                f"--backend-directory={server / 'backends'}", "--http-address=127.0.0.1",
                                f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
                                f"--metrics-port={metrics}", "--allow-metrics=false", "--exit-timeout-secs=2"],
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, (tmp_path / "tritonserver.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/specrt/ready", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "tritonserver did not get the model ready in 90 s"
            time.sleep(0.5)
        yield grpc
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def test_stock_tritonserver_serves_the_repository(tmp_path):
    """The repository on a real tritonserver: Triton parses config.pbtxt, loads model.py in its
    Python-backend stub, and serves each row its own seed's image."""
    from specrt.errors import SpecrtError
    from specrt.runtime.serving.client import Client

    manifest, _ = tiny_bundle()
    repo = tmp_path / "models"
    assert cli_exit_code(["triton-repo", str(manifest.root), "--out", str(repo), "--instance-kind", "cpu",
                          "--backend", "ort", "--threads", "1"]) == 0
    with stock_tritonserver(repo, tmp_path) as grpc:
        reference = Pipeline.from_bundle(manifest.root, threads=1)
        with Client(f"127.0.0.1:{grpc}", protocol="grpc", timeout_s=60) as client:
            for class_id, method, seed, params in [(1, "sd", 4, {"draft_len": 3}), (3, "sjd", 5, {"window": 4})]:
                served = client.generate(class_id=class_id, method=method, seed=seed, **params)
                expected = reference.generate([class_id], method=method, seed=seed, **params)
                np.testing.assert_array_equal(served.tokens, expected.tokens.reshape(-1))
            with pytest.raises(SpecrtError, match="out of range"):
                client.generate(class_id=999)


# ---- a continuous (MAR-style) bundle: the same repository, FP32 tokens, CPU instances ----------

@pytest.fixture(scope="module")
def continuous_repo(tmp_path_factory) -> Path:
    """`specrt triton-repo` with no flags on a tiny continuous bundle (no decoder)."""
    from serving_fixtures import tiny_continuous_bundle

    bundle = tiny_continuous_bundle(tmp_path_factory.mktemp("continuous") / "bundle")
    out = tmp_path_factory.mktemp("repo") / "models"
    assert cli_exit_code(["triton-repo", str(bundle), "--out", str(out), "--max-batch", "4"]) == 0
    return out


def test_a_continuous_repository_declares_float_tokens_on_cpu_instances(continuous_repo, tmp_path, capsys):
    from tritonclient.grpc import model_config_pb2 as pb

    config = parsed_config(continuous_repo / "specrt" / "config.pbtxt")
    assert [(g.kind, g.count) for g in config.instance_group] == [(pb.ModelInstanceGroup.KIND_CPU, 1)]
    assert config.parameters["backend"].string_value == "ort"
    assert [(t.name, pb.DataType.Name(t.data_type), list(t.dims)) for t in config.output] == \
        [("image", "TYPE_STRING", [1]), ("tokens", "TYPE_FP32", [-1, 3]), ("stats", "TYPE_STRING", [1]),
         ("error", "TYPE_STRING", [1])]
    bundle = continuous_repo / "specrt" / "1" / "bundle"
    for flags, message in [(["--backend", "ort-cuda"], "runs on ort, ort-cpu, torch, not backend 'ort-cuda'"),
                           (["--instance-kind", "gpu"], "use --instance-kind cpu")]:
        assert cli_exit_code(["triton-repo", str(bundle), "--out", str(tmp_path / "r"), *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_continuous_model_py_runs_execute_without_triton(continuous_repo, monkeypatch):
    from specrt.runtime.family_registry import open_bundle

    model_dir = continuous_repo / "specrt"
    model = loaded_model(model_dir, monkeypatch)
    request = {"class_id": _Tensor("class_id", np.array([[2], [5]], np.int64)),
               "method": _Tensor("method", np.array([[b"cspd"], [b"cspd"]], object)),
               "seed": _Tensor("seed", np.array([[3], [4]], np.uint64)),
               "params": _Tensor("params", np.array([[b'{"draft_len": 2}']] * 2, object))}
    [response] = model.execute([request])
    served = response.outputs
    assert served["error"][0, 0] == b"" and "class id 5 out of range" in served["error"][1, 0].decode()
    assert served["tokens"].dtype == np.float32 and served["tokens"].shape == (2, 4, 3)
    assert np.isnan(served["tokens"][1]).all() and bytes(served["image"][0, 0]) == b""
    expected = open_bundle(model_dir / "1" / "bundle").generate([2], method="cspd", seed=3, decode=False, draft_len=2)
    np.testing.assert_allclose(served["tokens"][0], expected.tokens[0], rtol=0, atol=1e-5)


def test_stock_tritonserver_serves_a_continuous_demo_repository(tmp_path):
    """`specrt triton-repo` on the continuous demo bundle, served by a real tritonserver: one
    cspd request through the Client gets generate's PNG and float tokens."""
    from PIL import Image
    from serving_fixtures import continuous_demo_bundle

    from specrt.errors import SpecrtError
    from specrt.runtime.family_registry import open_bundle
    from specrt.runtime.serving.client import Client

    bundle = continuous_demo_bundle(tmp_path / "mar")
    repo = tmp_path / "models"
    assert cli_exit_code(["triton-repo", str(bundle), "--out", str(repo)]) == 0
    with stock_tritonserver(repo, tmp_path) as grpc:
        expected = open_bundle(bundle).generate([7], method="cspd", seed=2, draft_len=2)
        with Client(f"127.0.0.1:{grpc}", protocol="grpc", timeout_s=60) as client:
            served = client.generate(class_id=7, method="cspd", seed=2, draft_len=2)
            assert served.tokens.dtype == np.float32 and served.tokens.shape == (64, 4)
            np.testing.assert_allclose(served.tokens, expected.tokens[0], rtol=0, atol=1e-5)
            pixels = np.asarray(Image.open(io.BytesIO(served.png)).convert("RGB"))
            assert np.abs(pixels.astype(int) - expected.images[0]).max() <= 1
            with pytest.raises(SpecrtError, match="class id 10 out of range"):
                client.generate(class_id=10)
