"""Build orchestration with an injected fake builder, and `specrt build` without TensorRT."""
import json
import subprocess
import sys

import pytest

from specrt.engines.build import TRT_MISSING, build_bundle, plan_jobs
from specrt.engines.cache import DeviceInfo, EngineCache
from specrt.errors import SpecrtError
from specrt.lazy import available

GPU = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0")


class FakeBuilder:
    """Records what it was asked to build; the 'engine' is the key digest, so content tracks the key."""

    def __init__(self):
        self.calls = []

    def __call__(self, job, cache):
        self.calls.append((job.entry.name, job.onnx_path.name))
        return f"engine:{job.key.digest}".encode()


def _build(bundle, builder, **kwargs):
    kwargs.setdefault("trt_version", "10.3.0")
    return build_bundle(bundle, device=GPU, engine_builder=builder, **kwargs)


def test_builds_one_engine_per_graph_then_reuses_them(bundle):
    builder = FakeBuilder()
    first = _build(bundle, builder, precision="fp16")
    assert [r.graph for r in first] == ["target_step", "vq_decode"] and all(r.built for r in first)
    assert builder.calls == [("target_step", "target_step.onnx"), ("vq_decode", "vq_decode.onnx")]
    second = _build(bundle, builder, precision="fp16")
    assert not any(r.built for r in second) and len(builder.calls) == 2
    assert [r.engine_path for r in second] == [r.engine_path for r in first]


def test_force_rebuilds(bundle):
    builder = FakeBuilder()
    _build(bundle, builder)
    _build(bundle, builder, force=True)
    assert len(builder.calls) == 4


@pytest.mark.parametrize("change, rebuilt", [
    ({"max_window": 4}, [True, False]),         # profiles (only the step graph has a window)
    ({"trt_version": "10.4.0"}, [True, True]),  # TensorRT version (another cache folder)
    ({"device": DeviceInfo("Orin", "8.7")}, [True, True]),
    ({"precision": "fp16"}, [True, True]),
])
def test_a_changed_key_component_rebuilds(bundle, change, rebuilt):
    builder = FakeBuilder()
    _build(bundle, builder)
    kwargs = {"trt_version": "10.3.0", "device": GPU, **change}
    results = build_bundle(bundle, engine_builder=builder, **kwargs)
    assert [r.built for r in results] == rebuilt
    assert len(builder.calls) == 2 + sum(rebuilt)


def test_a_mismatched_cached_engine_is_rebuilt_not_loaded(bundle):
    builder = FakeBuilder()
    [step, _] = _build(bundle, builder)
    sidecar = step.engine_path.with_suffix(".json")
    record = json.loads(sidecar.read_text())
    record["key"]["onnx_sha256"] = "0" * 64  # as if built from an older export of the graph
    sidecar.write_text(json.dumps(record))
    results = _build(bundle, builder)
    assert [r.built for r in results] == [True, False]
    assert json.loads(sidecar.read_text())["key"]["onnx_sha256"] != "0" * 64


def test_a_changed_onnx_file_is_refused_by_the_manifest_hash(bundle):
    with open(bundle / "vq_decode.onnx", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(SpecrtError, match="vq_decode.onnx"):
        _build(bundle, FakeBuilder())


def test_profiles_are_validated_before_anything_is_built(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["graphs"]["vq_decode"]["inputs"][0]["shape"] = ["batch", 5, "batch"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    builder = FakeBuilder()
    with pytest.raises(SpecrtError, match="vq_decode"):
        _build(bundle, builder)
    assert builder.calls == []


def test_tensorrt_11_builds_from_a_converted_graph(bundle):
    builder = FakeBuilder()
    _build(bundle, builder, precision="fp16", trt_version="11.0.0")
    assert builder.calls == [("target_step", "target_step.fp16.onnx"), ("vq_decode", "vq_decode.fp16.onnx")]
    jobs = plan_jobs(bundle, "fp16", "11.0.0", GPU)
    assert all(job.key.converter for job in jobs)
    assert not any(job.key.converter for job in plan_jobs(bundle, "fp16", "10.3.0", GPU))


def test_progress_reports_every_engine(bundle):
    messages = []
    _build(bundle, FakeBuilder(), progress=messages.append)
    _build(bundle, FakeBuilder(), progress=messages.append)
    assert any("[1/2] target_step: built" in m for m in messages)
    assert any("[2/2] vq_decode: cached" in m for m in messages)


def test_engine_files_land_in_the_gpu_and_trt_folder(bundle):
    results = _build(bundle, FakeBuilder(), precision="bf16")
    folder = EngineCache(bundle, GPU, "10.3.0").dir
    assert {r.engine_path for r in results} == {folder / "target_step.bf16.engine", folder / "vq_decode.bf16.engine"}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "specrt.cli", "build", *args], capture_output=True, text=True)


@pytest.mark.skipif(available("tensorrt"), reason="checks the path taken when TensorRT is missing")
def test_cli_without_tensorrt_fails_at_once_with_one_line(bundle):
    result = _cli(str(bundle), "--precision", "fp16")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"specrt: error: {TRT_MISSING}"]
    assert not (bundle / "engines").exists()


def test_cli_prints_trtexec_lines_without_tensorrt(bundle):
    result = _cli(str(bundle), "--print-trtexec", "--precision", "fp16", "--workspace", "2G", "--trt-major", "10")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("trtexec \\") == 2
    assert "--fp16" in result.stdout and "--memPoolSize=workspace:2048" in result.stdout


def test_cli_reports_a_bad_max_window_in_one_line(bundle):
    result = _cli(str(bundle), "--print-trtexec", "--max-window", "99")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--max-window 99" in result.stderr


def test_a_static_tree_gets_an_engine_and_a_dynamic_one_none(demo_bundle):
    """The TensorRT runner drafts a bundle's static tree in one call: its draft_tree graph is built
    with the rest, its uniforms fixed at the tree's drafts. A draft_growth (float64 scores) is
    skipped, and refused by name."""
    names = [job.entry.name for job in plan_jobs(demo_bundle, "fp32", "10.3.0", GPU)]
    assert "draft_tree" in names and "draft_chain" in names and "draft_growth" not in names
    job, = plan_jobs(demo_bundle, "fp32", "10.3.0", GPU, graphs=["draft_tree"])
    assert {shape[1] for shape in job.profile.to_json()["uniforms"].values()} == {25}  # mc_sim_7b_63's drafts
    with pytest.raises(SpecrtError, match="draft_growth outputs float64 scores"):
        plan_jobs(demo_bundle, "fp32", "10.3.0", GPU, graphs=["draft_growth"])
