"""The exported graphs compute what the PyTorch model computes, driven only by manifest.json.

The decoding test is deliberately independent of specrt.export.verify: it allocates the KV
buffer from the manifest's dims, runs prefill + steps in onnxruntime the way the runtime
will, and compares with the model's plain teacher-forcing forward pass (no KV cache, no
step API), token by token and by windows, with a CFG batch.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from specrt.manifest import GraphSpec, Manifest
from tiny_export import MAX_WINDOW, tiny_bundle

ATOL = 1e-4


@pytest.fixture(scope="module")
def bundle():
    return tiny_bundle()


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
        kv_spec = self.step_graph.input("past_kv")
        shape = self.step_graph.shape_at(kv_spec, "max", batch=batch, cache_len=self.capacity)
        self.kv = np.zeros(shape, dtype=np.dtype(kv_spec.dtype))
        self.batch, self.length = batch, 0

    def prefill(self, class_ids: np.ndarray) -> np.ndarray:
        out = _run(self.prefill_session, self.prefill_graph, {"class_ids": class_ids})
        cond_len = self.model["cond_len"]
        self.kv[:, :, :, :, :cond_len] = out["present_kv"]
        self.length = cond_len
        return out["logits"][:, 0]

    def step(self, tokens: np.ndarray, first_image_index: int) -> np.ndarray:
        """Feed image tokens [B, W] (causal window) and commit all of them."""
        window = tokens.shape[1]
        positions = np.broadcast_to(self.model["cond_len"] + first_image_index + np.arange(window), tokens.shape)
        mask = np.zeros((self.batch, window, self.capacity + window), dtype=bool)
        mask[:, :, : self.length] = True
        mask[:, :, self.capacity:] = np.tril(np.ones((window, window), dtype=bool))
        out = _run(self.step_session, self.step_graph,
                   {"input_ids": tokens, "positions": positions, "attention_mask": mask, "past_kv": self.kv})
        self.kv[:, :, :, :, self.length: self.length + window] = out["present_kv"]
        self.length += window
        return out["logits"]


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

    decoder = ManifestDecoder(manifest, role, batch=2)
    streamed = [decoder.prefill(class_ids)[:, None]]
    fed = 0
    for window in schedule:
        streamed.append(decoder.step(tokens[:, fed: fed + window], fed))
        fed += window
    streamed = np.concatenate(streamed, axis=1)

    reference = _teacher_forcing_logits(getattr(models, role), class_ids, tokens)
    assert streamed.shape == reference.shape == (2, n_image, model_entry["vocab_size"])
    np.testing.assert_allclose(streamed, reference, atol=ATOL, rtol=0)
    assert np.abs(streamed[0] - streamed[1]).max() > 1e-3  # cond and uncond rows really differ


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
    past_kv = rng.standard_normal(graph.shape_at(graph.input("past_kv"), "max", batch=batch)).astype(np.float32)
    out = _run(_session(manifest, "target_step"), graph,
               {"input_ids": ids, "positions": positions, "attention_mask": mask, "past_kv": past_kv})
    with torch.no_grad():
        logits, hidden, present_kv = models.target.step(torch.from_numpy(ids).long(), torch.from_numpy(positions).long(),
                                                        torch.from_numpy(mask), torch.from_numpy(past_kv))
    assert out["logits"].shape == (batch, window, manifest.models["target"]["vocab_size"])
    assert out["present_kv"].shape[4] == window  # only the window's rows come back
    np.testing.assert_allclose(out["logits"], logits.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(out["hidden"], hidden.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(out["present_kv"], present_kv.numpy(), atol=ATOL, rtol=0)


def test_graph_io_dtypes_and_symbolic_dims_follow_the_contract(bundle):
    manifest, _ = bundle
    step = onnx.load(str(manifest.graph_path("target_step")))
    io = {v.name: v.type.tensor_type for v in list(step.graph.input) + list(step.graph.output)}
    dims = {name: [d.dim_param or d.dim_value for d in t.shape.dim] for name, t in io.items()}
    assert io["input_ids"].elem_type == io["positions"].elem_type == onnx.TensorProto.INT32
    assert io["attention_mask"].elem_type == onnx.TensorProto.BOOL
    assert dims["input_ids"] == ["batch", "window"]
    assert dims["attention_mask"] == ["batch", "window", "total_len"]
    assert dims["past_kv"][2] == "batch" and dims["past_kv"][4] == "cache_len"
    assert dims["present_kv"][4] == "window"
    assert [o.name for o in step.graph.output] == ["logits", "hidden", "present_kv"]
    # the draft is exported without `hidden`; prefill takes int32 class ids
    assert manifest.graph("draft_step").output_names == ("logits", "present_kv")
    assert manifest.graph("target_prefill").input("class_ids").dtype == "int32"
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
