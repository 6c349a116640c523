"""The exported graphs compute what the PyTorch model computes, driven only by manifest.json.

The decoding test is deliberately independent of specrt.export.verify: it allocates the KV
buffer from the manifest's dims, runs prefill + steps in onnxruntime the way the runtime
will, and compares with the model's plain teacher-forcing forward pass (no KV cache, no
step API), token by token and by windows, with a CFG batch. The sampling head every graph
ends in is checked against numpy written from docs/contracts.md (not against
specrt.runtime.head): probs = softmax(mix @ logits), draws = the inverse CDF of the uniform.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from specrt.manifest import GraphSpec, Manifest
from specrt.runtime.kv_inputs import past_dtype, past_feeds, past_names, stacked_shape
from tiny_export import MAX_WINDOW, TINY_OPTIONS, VOCAB, tiny_bundle

ATOL = 1e-4
CFG_SCALE = 2.0


@pytest.fixture(scope="module")
def bundle():
    return tiny_bundle()


def contract_mix(images: int, cfg_scale: float | None = None, temperature: float = 1.0) -> np.ndarray:
    """docs/contracts.md: identity / T without CFG; s/T at cond row i and (1 - s)/T at uncond row images + i."""
    eye = np.eye(images)
    mix = eye if cfg_scale is None else np.concatenate([eye * cfg_scale, eye * (1 - cfg_scale)], axis=1)
    return (mix / temperature).astype(np.float32)


def contract_head(logits: np.ndarray, mix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(probs, cdf) in float64: softmax over the vocabulary of the guided logits mix @ logits."""
    guided = np.einsum("ib,bwv->iwv", mix.astype(np.float64), logits.astype(np.float64))
    probs = np.exp(guided - guided.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return probs, np.cumsum(probs, -1)


def mid_bin_uniforms(cdf: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(uniforms, the tokens they must draw): for a random token per row, the uniform at the
    middle of its CDF bin, so rounding cannot move the draw to a neighbour."""
    vocab = cdf.shape[-1]
    tokens = rng.integers(0, vocab, size=cdf.shape[:-1])
    high = np.take_along_axis(cdf, tokens[..., None], -1)[..., 0]
    low = np.where(tokens > 0, np.take_along_axis(cdf, np.maximum(tokens - 1, 0)[..., None], -1)[..., 0], 0.0)
    return ((low + high) / 2 / cdf[..., -1]).astype(np.float32), tokens


def _session(manifest: Manifest, name: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(manifest.graph_path(name)), options, providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, graph: GraphSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feed by the manifest's input names/dtypes; return outputs by the manifest's output names."""
    typed = {t.name: np.ascontiguousarray(feeds[t.name], dtype=np.dtype(t.dtype)) for t in graph.inputs}
    return dict(zip(graph.output_names, session.run(list(graph.output_names), typed)))


class ManifestDecoder:
    """A minimal runtime: KV buffer sized from the manifest, prefill, window steps, commit."""

    def __init__(self, manifest: Manifest, role: str, batch: int):
        self.model = manifest.models[role]
        self.prefill_graph, self.step_graph = manifest.graph(f"{role}_prefill"), manifest.graph(f"{role}_step")
        self.prefill_session, self.step_session = _session(manifest, self.prefill_graph.name), _session(manifest, self.step_graph.name)
        self.capacity = self.model["capacity"]
        shape = stacked_shape(self.step_graph, "max", batch=batch, cache_len=self.capacity)
        self.kv = np.zeros(shape, dtype=np.dtype(past_dtype(self.step_graph)))  # fed as past_kv or per layer
        self.batch, self.length = batch, 0

    def prefill(self, class_ids: np.ndarray, mix: np.ndarray) -> dict[str, np.ndarray]:
        uniforms = np.full((mix.shape[0], 1), 0.5, dtype=np.float32)
        out = _run(self.prefill_session, self.prefill_graph, {"class_ids": class_ids, "mix": mix, "uniforms": uniforms})
        cond_len = self.model["cond_len"]
        self.kv[:, :, :, :, :cond_len] = out["present_kv"]
        self.length = cond_len
        return out

    def step(self, tokens: np.ndarray, first_image_index: int, mix: np.ndarray) -> dict[str, np.ndarray]:
        """Feed image tokens [B, W] (causal window) and commit all of them."""
        window = tokens.shape[1]
        positions = np.broadcast_to(self.model["cond_len"] + first_image_index + np.arange(window), tokens.shape)
        mask = np.zeros((self.batch, window, self.capacity + window), dtype=bool)
        mask[:, :, : self.length] = True
        mask[:, :, self.capacity:] = np.tril(np.ones((window, window), dtype=bool))
        uniforms = np.full((mix.shape[0], window), 0.5, dtype=np.float32)
        out = _run(self.step_session, self.step_graph, {"input_ids": tokens, "positions": positions,
                                                        "attention_mask": mask, **past_feeds(self.step_graph, self.kv),
                                                        "mix": mix, "uniforms": uniforms})
        self.kv[:, :, :, :, self.length: self.length + window] = out["present_kv"]
        self.length += window
        return out


def _teacher_forcing_logits(model, class_ids: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(class_ids).long(), torch.from_numpy(tokens).long()).numpy()


@pytest.mark.parametrize("role", ["target", "draft"])
@pytest.mark.parametrize("schedule", [[1] * 15, [5, 1, 3, 6]], ids=["token-by-token", "windows-5-1-3-6"])
def test_manifest_driven_decoding_matches_teacher_forcing(bundle, role, schedule):
    manifest, models = bundle
    model_entry = manifest.models[role]
    n_image = model_entry["grid_size"] ** 2
    assert sum(schedule) == n_image - 1
    rng = np.random.default_rng(7)
    class_ids = np.array([3, model_entry["null_class"]])  # a CFG batch: [cond; uncond]
    tokens = np.repeat(rng.integers(0, model_entry["vocab_size"], size=(1, n_image)), 2, axis=0)

    mix = contract_mix(1, CFG_SCALE)
    decoder = ManifestDecoder(manifest, role, batch=2)
    outs = [decoder.prefill(class_ids, mix)]
    fed = 0
    for window in schedule:
        outs.append(decoder.step(tokens[:, fed: fed + window], fed, mix))
        fed += window
    streamed = np.concatenate([o["logits"] for o in outs], axis=1)
    probs = np.concatenate([o["probs"] for o in outs], axis=1)

    reference = _teacher_forcing_logits(getattr(models, role), class_ids, tokens)
    assert streamed.shape == reference.shape == (2, n_image, model_entry["vocab_size"])
    np.testing.assert_allclose(streamed, reference, atol=ATOL, rtol=0)
    assert np.abs(streamed[0] - streamed[1]).max() > 1e-3  # cond and uncond rows really differ
    # the head: one image, its CFG-guided distribution at every position
    guided = CFG_SCALE * reference[0] + (1 - CFG_SCALE) * reference[1]
    expected = np.exp(guided - guided.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    assert probs.shape == (1, n_image, model_entry["vocab_size"]) and probs.dtype == np.float32
    np.testing.assert_allclose(probs[0], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("window", [1, 5, 17])
@pytest.mark.parametrize("batch", [1, 3])
def test_one_step_graph_runs_any_window_and_batch(bundle, window, batch):
    manifest, models = bundle
    graph = manifest.graph("target_step")
    capacity = manifest.models["target"]["capacity"]
    rng = np.random.default_rng(window * 10 + batch)
    length = 4
    ids = rng.integers(0, manifest.models["target"]["vocab_size"], size=(batch, window)).astype(np.int32)
    seq_len = manifest.models["target"]["cond_len"] + manifest.models["target"]["grid_size"] ** 2
    positions = np.minimum(length + np.arange(window), seq_len - 1)  # slots past the image repeat the last position
    positions = np.broadcast_to(positions, (batch, window)).astype(np.int32)
    mask = np.zeros((batch, window, capacity + window), dtype=bool)
    mask[:, :, :length] = True
    mask[:, :, capacity:] = np.tril(np.ones((window, window), dtype=bool))
    past_kv = rng.standard_normal(stacked_shape(graph, "max", batch=batch)).astype(np.float32)
    mix = contract_mix(batch)
    out = _run(_session(manifest, "target_step"), graph,
               {"input_ids": ids, "positions": positions, "attention_mask": mask, **past_feeds(graph, past_kv), "mix": mix,
                "uniforms": rng.random((batch, window)).astype(np.float32)})
    with torch.no_grad():
        logits, hidden, present_kv = models.target.step(torch.from_numpy(ids).long(), torch.from_numpy(positions).long(),
                                                        torch.from_numpy(mask), torch.from_numpy(past_kv))
    assert out["logits"].shape == (batch, window, manifest.models["target"]["vocab_size"])
    assert out["present_kv"].shape[4] == window  # only the window's rows come back
    np.testing.assert_allclose(out["logits"], logits.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(out["hidden"], hidden.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(out["present_kv"], present_kv.numpy(), atol=ATOL, rtol=0)
    assert out["probs"].shape == (batch, window, manifest.models["target"]["vocab_size"])
    assert out["draws"].shape == (batch, window) and out["draws"].dtype == np.int32


def _step_feeds(manifest: Manifest, batch: int, window: int, length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    entry = manifest.models["target"]
    capacity = entry["capacity"]
    ids = rng.integers(0, entry["vocab_size"], size=(batch, window)).astype(np.int32)
    positions = np.broadcast_to(length + np.arange(window), (batch, window)).astype(np.int32)
    mask = np.zeros((batch, window, capacity + window), dtype=bool)
    mask[:, :, :length] = True
    mask[:, :, capacity:] = np.tril(np.ones((window, window), dtype=bool))
    graph = manifest.graph("target_step")
    past_kv = rng.standard_normal(stacked_shape(graph, "max", batch=batch)).astype(np.float32)
    return {"input_ids": ids, "positions": positions, "attention_mask": mask, **past_feeds(graph, past_kv)}


@pytest.mark.parametrize("images, cfg_scale, temperature", [(1, CFG_SCALE, 1.0), (2, CFG_SCALE, 0.5), (3, None, 1.0),
                                                            (2, None, 0.7)])
def test_step_head_probs_are_the_softmax_of_the_mixed_logits(bundle, images, cfg_scale, temperature):
    """CFG [[s, 1 - s]] at T = 1 (and two images at T = 0.5), and the identity without CFG."""
    manifest, _ = bundle
    graph = manifest.graph("target_step")
    rng = np.random.default_rng(images * 10 + int(temperature * 10))
    batch = 2 * images if cfg_scale is not None else images
    mix = contract_mix(images, cfg_scale, temperature)
    feeds = _step_feeds(manifest, batch, 4, 6, rng)
    if cfg_scale is not None:  # the uncond rows see the cond rows' image tokens
        feeds["input_ids"][images:] = feeds["input_ids"][:images]
    out = _run(_session(manifest, "target_step"), graph,
               {**feeds, "mix": mix, "uniforms": rng.random((images, 4)).astype(np.float32)})
    expected, _ = contract_head(out["logits"], mix)
    assert out["probs"].shape == (images, 4, manifest.models["target"]["vocab_size"])
    np.testing.assert_allclose(out["probs"], expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(out["probs"].sum(-1), 1.0, atol=1e-5)
    if cfg_scale is not None:  # guidance really moved the distribution away from the cond rows alone
        plain, _ = contract_head(out["logits"][:images], np.eye(images) / temperature)
        assert np.abs(expected - plain).max() > 1e-3


@pytest.mark.parametrize("graph_name", ["target_step", "draft_prefill"])
def test_head_draws_are_the_inverse_cdf_of_the_uniforms(bundle, graph_name):
    """A uniform in the middle of token t's CDF bin draws t; u = 0 draws the first token with
    non-zero mass, and u = 1 (which counts every CDF entry) is clamped to vocab - 1."""
    manifest, _ = bundle
    graph = manifest.graph(graph_name)
    rng = np.random.default_rng(5)
    mix = contract_mix(2, CFG_SCALE)
    if graph.kind == "step":
        feeds = _step_feeds(manifest, 4, 6, 3, rng)
        window = 6
    else:
        null = manifest.models["draft"]["null_class"]
        feeds = {"class_ids": np.array([1, 3, null, null], dtype=np.int32)}
        window = 1
    session = _session(manifest, graph_name)
    first = _run(session, graph, {**feeds, "mix": mix, "uniforms": np.full((2, window), 0.5, np.float32)})
    _, cdf = contract_head(first["logits"], mix)
    uniforms, tokens = mid_bin_uniforms(cdf, rng)
    out = _run(session, graph, {**feeds, "mix": mix, "uniforms": uniforms})
    assert out["draws"].dtype == np.int32 and out["draws"].shape == (2, window)
    np.testing.assert_array_equal(out["draws"], tokens)
    edges = _run(session, graph, {**feeds, "mix": mix, "uniforms": np.array([[0.0] * window, [1.0] * window], np.float32)})
    vocab = cdf.shape[-1]
    assert (edges["draws"][0] == (cdf[0] <= 0).sum(-1)).all()
    assert (edges["draws"][1] == vocab - 1).all()


def test_graph_io_dtypes_and_symbolic_dims_follow_the_contract(bundle):
    manifest, _ = bundle
    step = onnx.load(str(manifest.graph_path("target_step")))
    io = {v.name: v.type.tensor_type for v in list(step.graph.input) + list(step.graph.output)}
    dims = {name: [d.dim_param or d.dim_value for d in t.shape.dim] for name, t in io.items()}
    assert io["input_ids"].elem_type == io["positions"].elem_type == onnx.TensorProto.INT32
    assert io["attention_mask"].elem_type == onnx.TensorProto.BOOL
    assert dims["input_ids"] == ["batch", "window"]
    assert dims["attention_mask"] == ["batch", "window", "total_len"]
    past = past_names(manifest.graph("target_step"))  # past_kv, or per layer (`export --kv-inputs`)
    for name in past:
        assert (dims[name][2], dims[name][4]) == ("batch", "cache_len") if name == "past_kv" else \
            (dims[name][0], dims[name][2]) == ("batch", "cache_len")
    assert dims["present_kv"][4] == "window"
    assert [i.name for i in step.graph.input] == ["input_ids", "positions", "attention_mask", *past, "mix", "uniforms"]
    assert [o.name for o in step.graph.output] == ["logits", "hidden", "present_kv", "probs", "draws"]
    assert io["mix"].elem_type == io["uniforms"].elem_type == io["probs"].elem_type == onnx.TensorProto.FLOAT
    assert io["draws"].elem_type == onnx.TensorProto.INT32
    assert dims["mix"] == ["images", "batch"] and dims["uniforms"] == ["images", "window"]
    assert dims["probs"] == ["images", "window", VOCAB] and dims["draws"] == ["images", "window"]
    # the draft is exported without `hidden`; prefill takes int32 class ids and ends in the head too
    assert manifest.graph("draft_step").output_names == ("logits", "present_kv", "probs", "draws")
    prefill = manifest.graph("target_prefill")
    assert prefill.input_names == ("class_ids", "mix", "uniforms")
    assert prefill.input("class_ids").dtype == "int32"
    assert prefill.input("uniforms").shape == ("images", 1) and prefill.output("draws").shape == ("images", 1)
    assert prefill.output_names[-2:] == ("probs", "draws") and prefill.output("probs").shape == ("images", 1, VOCAB)
    for graph in manifest.graphs.values():
        if graph.kind != "decode":
            assert graph.profile["images"] == {"min": 1, "opt": 1, "max": TINY_OPTIONS.max_batch}
    assert manifest.graph("vq_decode").input("codes").shape == ("batch", 4, 4)


def test_default_export_is_opset_18_without_control_flow_or_attention_op(bundle):
    manifest, _ = bundle
    for name in manifest.graphs:
        model = onnx.load(str(manifest.graph_path(name)))
        opset = {o.domain: o.version for o in model.opset_import}
        assert opset.get("", opset.get("ai.onnx")) == 18, name
        ops = {n.op_type for n in model.graph.node}
        assert not ops & {"If", "Loop", "Scan", "Attention"}, (name, ops)
        if name.endswith("_step"):
            assert {"MatMul", "Softmax"} <= ops
        if not name.startswith("vq"):  # the sampling head, as exported from specrt.runtime.head
            assert {"CumSum", "LessOrEqual", "ReduceSum"} <= ops, (name, ops)


def test_vq_decode_graph_matches_torch(bundle):
    manifest, models = bundle
    graph = manifest.graph("vq_decode")
    codes = np.random.default_rng(1).integers(0, manifest.models["vq"]["codebook_size"], size=(3, 4, 4))
    out = _run(_session(manifest, "vq_decode"), graph, {"codes": codes})
    with torch.no_grad():
        image = models.vq.decode_codes(torch.from_numpy(codes).long()).numpy()
    assert out["image"].shape == (3, 3, 8, 8)
    np.testing.assert_allclose(out["image"], image, atol=1e-4, rtol=0)


def test_max_window_is_in_the_profile(bundle):
    manifest, _ = bundle
    profile = manifest.graph("target_step").profile
    assert profile["window"]["max"] == MAX_WINDOW
    for level in ("min", "opt", "max"):
        assert profile["total_len"][level] == profile["cache_len"][level] + profile["window"][level]
