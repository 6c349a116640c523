"""Real TensorRT builds and runs: need TensorRT, cuda-python and a CUDA GPU; skipped (with the reason) otherwise.

They build the tiny bundle's engines through `build_bundle`, run them with TrtEngine /
TrtRunner, and compare with onnxruntime on CPU, the sampling head's probs and draws included.
"""
import numpy as np
import onnxruntime as ort
import pytest

from specrt.lazy import available

pytestmark = pytest.mark.trt


def _gpu_reason() -> str | None:
    if not available("tensorrt"):
        return "TensorRT is not installed (pip install 'specrt[trt]'; on Jetson it comes with JetPack)"
    if not (available("cuda.bindings") or available("cuda.cudart")):
        return "cuda-python is not installed (pip install 'specrt[trt]')"
    from specrt.engines.cache import detect_device
    from specrt.errors import SpecrtError

    try:
        detect_device()
    except SpecrtError as exc:
        return str(exc)
    return None


REASON = _gpu_reason()
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from specrt.engines.build import build_bundle  # noqa: E402
from specrt.engines.trt_runner import TrtEngine  # noqa: E402
from tiny_bundle import CAPACITY, HEAD_DIM, N_HEAD, N_LAYER, VOCAB, step_feeds  # noqa: E402


def _onnxruntime(bundle, graph, feeds):
    session = ort.InferenceSession(str(bundle / f"{graph}.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _inverse_cdf(probs, uniforms):
    cdf = np.cumsum(probs.astype(np.float64), -1)
    return np.minimum((cdf <= (uniforms * cdf[..., -1])[..., None]).sum(-1), probs.shape[-1] - 1)


@pytest.mark.parametrize("precision, atol", [("fp32", 1e-3), ("fp16", 5e-2)])
def test_built_step_engine_matches_onnxruntime(bundle, precision, atol):
    [step, _] = build_bundle(bundle, precision, workspace_bytes=1 << 30)
    feeds = step_feeds(batch=2, window=3, length=5)
    logits_ref, present_ref, probs_ref, draws_ref = _onnxruntime(bundle, "target_step", feeds)
    engine = TrtEngine(step.engine_path)
    engine.allocate({"input_ids": (4, 8), "positions": (4, 8), "attention_mask": (4, 8, CAPACITY + 8),
                     "past_kv": (N_LAYER, 2, 4, N_HEAD, CAPACITY, HEAD_DIM), "mix": (4, 4), "uniforms": (4, 8)})
    engine.run(feeds)
    logits = engine.fetch("logits", np.empty(4 * 8 * VOCAB, np.float32))
    present = engine.fetch("present_kv", np.empty(N_LAYER * 2 * 4 * N_HEAD * 8 * HEAD_DIM, np.float32))
    probs = engine.fetch("probs", np.empty(4 * 8 * VOCAB, np.float32))
    draws = engine.fetch("draws", np.empty(4 * 8, np.int32))
    np.testing.assert_allclose(logits, logits_ref, atol=atol)
    np.testing.assert_allclose(present, present_ref, atol=atol)
    np.testing.assert_allclose(probs, probs_ref, atol=atol)
    # the head ran in fp32 either way: its draws are the inverse CDF of its own probabilities
    np.testing.assert_array_equal(draws, _inverse_cdf(probs, feeds["uniforms"]))
    if precision == "fp32":
        np.testing.assert_array_equal(draws, draws_ref)


def test_second_build_reuses_engines_and_writes_a_timing_cache(bundle):
    first = build_bundle(bundle, "fp32", workspace_bytes=1 << 30)
    second = build_bundle(bundle, "fp32", workspace_bytes=1 << 30)
    assert all(r.built for r in first) and not any(r.built for r in second)
    assert (first[0].engine_path.parent / "timing.cache").stat().st_size > 0


def test_vq_engine_matches_onnxruntime(bundle):
    [vq] = build_bundle(bundle, "fp32", graphs=["vq_decode"], workspace_bytes=1 << 30)
    codes = np.random.default_rng(0).integers(0, VOCAB, (2, 4, 4)).astype(np.int32)
    [image_ref] = _onnxruntime(bundle, "vq_decode", {"codes": codes})
    engine = TrtEngine(vq.engine_path)
    engine.allocate({"codes": (4, 4, 4)})
    engine.run({"codes": codes})
    np.testing.assert_allclose(engine.fetch("image", np.empty(4 * 3 * 8 * 8, np.float32)), image_ref, atol=1e-3)


def test_runner_commits_kv_rows_on_the_device(tmp_path):
    """Prefill, then steps through TrtRunner's device KV commits, against onnxruntime on a host KV
    copy; the head's outputs of a step stay readable after the next step (double buffering)."""
    from specrt.engines.trt_runner import runner_from_bundle
    from specrt.runtime.window import Window
    from tiny_bundle import cfg_mix, write_bundle

    bundle = write_bundle(tmp_path / "bundle", with_prefill=True)
    build_bundle(bundle, "fp32", workspace_bytes=1 << 30)
    runner = runner_from_bundle(bundle, "target")
    mix = cfg_mix(1)
    runner.allocate(mix, capacity=CAPACITY)
    class_ids = np.array([1, 3], np.int32)
    uniforms = np.array([[0.3]], np.float32)
    _, present_ref, probs_ref, draws_ref = _onnxruntime(bundle, "target_prefill",
                                                        {"class_ids": class_ids, "mix": mix, "uniforms": uniforms})
    out = runner.prefill(class_ids, uniforms)
    np.testing.assert_allclose(np.asarray(out.probs), probs_ref, atol=1e-3)
    np.testing.assert_array_equal(out.draws, draws_ref)
    kv_host = np.zeros((N_LAYER, 2, 2, N_HEAD, CAPACITY, HEAD_DIM), np.float32)
    kv_host[..., :1, :] = present_ref
    previous = None
    for ids, accepted in (([3, 4, 5], [0, 1]), ([6, 7, 8, 9], [0, 2, 3]), ([10, 11], [0])):
        length = runner.length
        uniforms = np.random.default_rng(length).random((1, len(ids))).astype(np.float32)
        out = runner.step(Window.chain(ids), uniforms)
        mask = np.zeros((2, len(ids), CAPACITY + len(ids)), bool)
        mask[:, :, :length] = True
        mask[:, :, CAPACITY:] = np.tril(np.ones((len(ids), len(ids)), bool))
        positions = np.repeat((length + np.arange(len(ids)))[None], 2, 0).astype(np.int32)
        feeds = {"input_ids": np.array([ids, ids], np.int32), "positions": positions, "attention_mask": mask,
                 "past_kv": kv_host, "mix": mix, "uniforms": uniforms}
        _, present_ref, probs_ref, draws_ref = _onnxruntime(bundle, "target_step", feeds)
        # reads the KV committed on the device so far
        np.testing.assert_allclose(np.asarray(out.probs), probs_ref, atol=1e-3)
        np.testing.assert_allclose(out.probs[0, -1][np.array([1, 0])], probs_ref[0, -1, [1, 0]], atol=1e-3)
        np.testing.assert_array_equal(out.draws, draws_ref)
        if previous is not None:  # the previous step's output survived this step
            np.testing.assert_allclose(np.asarray(previous[0].probs), previous[1], atol=1e-3)
        previous = (out, probs_ref)
        runner.commit(accepted)
        kv_host[..., length:length + len(accepted), :] = present_ref[..., accepted, :]


@pytest.fixture(scope="module")
def built_demo_bundle(demo_bundle, tmp_path_factory):
    """A private copy of the demo bundle (engines are written into it) with fp32 engines built."""
    import shutil

    copy = tmp_path_factory.mktemp("trt-demo") / "bundle"
    shutil.copytree(demo_bundle, copy)
    build_bundle(copy, "fp32", workspace_bytes=1 << 30)
    return copy


@pytest.mark.parametrize("method", ["ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac"])
def test_every_method_on_tensorrt_matches_onnxruntime_greedy(built_demo_bundle, method):
    """The demo through `--backend trt` gives onnxruntime's tokens under greedy decoding."""
    from specrt.runtime.pipeline import Pipeline

    ids = [0, 4, 9]
    on_trt = Pipeline.from_bundle(built_demo_bundle, backend="trt").generate(ids, method=method, seed=0, temperature=0.0)
    on_ort = Pipeline.from_bundle(built_demo_bundle, backend="ort").generate(ids, method=method, seed=0, temperature=0.0)
    np.testing.assert_array_equal(on_trt.tokens, on_ort.tokens)
    assert on_trt.stats.target_forwards == on_ort.stats.target_forwards


def test_a_static_tree_is_drafted_in_one_tensorrt_call(built_demo_bundle):
    """The bundle's draft_tree engine drafts sd's default static tree in one execution a round,
    with the tokens of the level-by-level drafter on the same engines."""
    from specrt.runtime.pipeline import Pipeline

    pipe = Pipeline.from_bundle(built_demo_bundle, backend="trt")
    assert pipe.draft.can_draft_tree(pipe.draft.tree_layout)
    settings = dict(method="sd", tree="static", seed=0, temperature=0.0)
    fused = pipe.generate([0, 4, 9], **settings)
    calls = pipe.draft.forwards
    per_level = pipe.generate([0, 4, 9], **settings, fused_drafting=False)
    np.testing.assert_array_equal(fused.tokens, per_level.tokens)
    assert calls < 0.6 * pipe.draft.forwards
