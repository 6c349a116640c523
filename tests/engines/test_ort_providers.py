"""onnxruntime provider lists for ort-cpu / ort-cuda / ort-trt."""
import onnxruntime as ort
import pytest

from specrt.engines.ort_providers import providers_for, session_providers, tensorrt_options
from specrt.errors import SpecrtError
from tiny_bundle import CAPACITY, step_feeds

ALL = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_tensorrt_options_carry_the_manifest_profiles_and_bundle_caches(bundle):
    options = tensorrt_options(bundle, "target_step", "fp16", max_window=4)
    assert options["trt_profile_max_shapes"] == (
        f"input_ids:4x4,positions:4x4,attention_mask:4x4x{CAPACITY + 4},past_kv:1x2x4x2x{CAPACITY}x8,"
        "mix:4x4,uniforms:4x4")
    assert options["trt_profile_min_shapes"].startswith("input_ids:1x1,")
    assert options["trt_fp16_enable"] == "1" and "trt_bf16_enable" not in options
    assert options["trt_engine_cache_enable"] == "1"
    assert options["trt_engine_cache_path"] == str(bundle.absolute() / "engines/ort-trt")
    assert all(isinstance(v, str) for v in options.values())


def test_bf16_sets_the_bf16_flag(bundle):
    options = tensorrt_options(bundle, "vq_decode", "bf16")
    assert options["trt_bf16_enable"] == "1" and options["trt_fp16_enable"] == "0"
    assert options["trt_profile_opt_shapes"] == "codes:1x4x4"


def test_provider_lists_have_their_fallbacks(bundle):
    trt = providers_for("ort-trt", bundle, "target_step", available=ALL)
    assert [p if isinstance(p, str) else p[0] for p in trt] == ALL
    cuda = providers_for("ort-cuda", bundle, "target_step", device_id=1, available=ALL)
    assert cuda == [("CUDAExecutionProvider", {"device_id": "1"}), "CPUExecutionProvider"]
    assert providers_for("ort-cpu", bundle, "target_step", available=["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


@pytest.mark.parametrize("backend", ["ort-cuda", "ort-trt"])
def test_missing_provider_is_a_clear_error(bundle, backend):
    with pytest.raises(SpecrtError, match=f"--backend {backend} needs onnxruntime's .*onnxruntime-gpu"):
        providers_for(backend, bundle, "target_step", available=["CPUExecutionProvider"])


def test_unknown_backend_and_graph_are_refused(bundle):
    with pytest.raises(SpecrtError, match="unknown onnxruntime backend"):
        providers_for("trt", bundle, "target_step", available=ALL)
    with pytest.raises(SpecrtError, match="not in the bundle"):
        providers_for("ort-trt", bundle, "nope", available=ALL)


def test_cpu_provider_list_runs_a_session(bundle):
    names, options = session_providers(providers_for("ort-cpu", bundle, "target_step"))
    session = ort.InferenceSession(str(bundle / "target_step.onnx"), providers=names, provider_options=options)
    logits, present, probs, draws = session.run(None, step_feeds())
    assert logits.shape == (2, 3, 32) and present.shape[4] == 3
    assert probs.shape == (1, 3, 32) and draws.shape == (1, 3)
