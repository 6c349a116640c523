"""`specrt export` end to end from checkpoint files: bundle, --verify, inspect, --force, bad input."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from specrt.manifest import read_manifest
from specrt.models.llamagen_gpt import GPT, GPTConfig
from specrt.models.llamagen_vq import VQModel
from tiny_export import cli_exit_code as _exit_code, CLASSES, NO_METHOD_GRAPHS, VOCAB, tiny_vq_config

HEADS = ["--n-head", "2", "--draft-n-head", "1"]  # custom sizes: the head counts are not in the weights


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """LlamaGen-layout files whose sizes the loaders can infer (head_dim 64, 32 GroupNorm groups)."""
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    gpt = dict(vocab_size=VOCAB, num_classes=CLASSES, grid_size=4)
    models = {"target": GPT(GPTConfig(dim=128, n_layer=2, n_head=2, **gpt)),
              "draft": GPT(GPTConfig(dim=64, n_layer=1, n_head=1, **gpt)),
              "vq": VQModel(tiny_vq_config(ch=32, norm_groups=32))}
    paths = {}
    for role, model in models.items():
        paths[role] = root / f"{role}.safetensors"
        save_file(model.state_dict(), str(paths[role]))
    return paths


@pytest.mark.slow
def test_export_checkpoints_verify_and_inspect(checkpoints, tmp_path, capsys):
    out = tmp_path / "bundle"
    argv = ["export", "--out", str(out), "--image-size", "8", *HEADS, "--max-window", "6", "--neighbours", "4", "--threads", "2",
            "--target", str(checkpoints["target"]), "--draft", str(checkpoints["draft"]), "--vq", str(checkpoints["vq"])]
    assert _exit_code(argv + ["--verify"]) == 0
    printed = capsys.readouterr().out
    for step in ("[1/8] target_prefill.onnx", "[5/8] draft_chain.onnx", "[6/8] vq_decode.onnx", "[8/8] manifest.json"):
        assert step in printed
    assert "all within tolerance" in printed
    assert "draft_chain" in printed.split("verifying graphs")[1]  # the chain checked against DraftChain too
    manifest = read_manifest(out)
    assert manifest.models["target"]["dim"] == 128 and manifest.models["draft"]["dim"] == 64
    assert manifest.models["target"]["source"] == str(checkpoints["target"])
    assert manifest.sampling_defaults["top_k"] == 2000  # LlamaGen's c2i default for checkpoints

    assert _exit_code(["inspect", str(out)]) == 0
    assert _exit_code(argv) == 2  # exists, no --force
    assert "already exists" in capsys.readouterr().err


def test_force_replaces_the_bundle_and_no_hidden_reaches_the_exporter(checkpoints, tmp_path, monkeypatch):
    """The graph exporters are stubbed (they write placeholder files) to test the CLI plumbing fast."""
    from specrt.export import onnx_export

    seen_hidden = []

    def placeholder(spec, out_dir):
        (out_dir / spec.file).write_bytes(b"placeholder")
        return spec

    def gpt_stub(kind, spec_fn):
        def export(gpt, role, limits, out_dir, opset, with_hidden, *kv_inputs):  # a step's KV form after
            seen_hidden.append((f"{role}_{kind}", with_hidden))
            return placeholder(spec_fn(f"{role}_{kind}", role, gpt.config, limits, opset, with_hidden, *kv_inputs),
                               out_dir)
        return export

    def vq_stub(vq, grid, limits, out_dir, opset):
        return placeholder(onnx_export.vq_decode_spec(grid, grid * vq.config.downsample, limits, opset), out_dir)

    monkeypatch.setattr(onnx_export, "export_prefill", gpt_stub("prefill", onnx_export.prefill_spec))
    monkeypatch.setattr(onnx_export, "export_step", gpt_stub("step", onnx_export.step_spec))
    monkeypatch.setattr(onnx_export, "export_vq_decode", vq_stub)
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.txt").write_text("previous")
    (out / "manifest.json").write_text("{}")  # a bundle: --force replaces only a bundle or an empty folder
    code = _exit_code(["export", "--out", str(out), "--force", "--no-hidden", "--image-size", "8", *HEADS, "--neighbours", "4",
                       "--target", str(checkpoints["target"]), "--draft", str(checkpoints["draft"]),
                       "--vq", str(checkpoints["vq"]), *NO_METHOD_GRAPHS])
    assert code == 0
    assert not (out / "old.txt").exists() and (out / "manifest.json").is_file()
    assert ("target_step", False) in seen_hidden and ("target_prefill", False) in seen_hidden
    assert read_manifest(out).graph("target_step").output_names == ("logits", "present_kv", "probs", "draws")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no temporary or old directory left


def test_draft_with_another_vocabulary_exits_2(checkpoints, tmp_path, capsys):
    torch.manual_seed(1)
    other = GPT(GPTConfig(dim=64, n_layer=1, n_head=1, vocab_size=VOCAB + 4, num_classes=CLASSES, grid_size=4))
    save_file(other.state_dict(), str(tmp_path / "draft.safetensors"))
    code = _exit_code(["export", "--out", str(tmp_path / "b"), "--image-size", "8", *HEADS, "--target", str(checkpoints["target"]),
                       "--draft", str(tmp_path / "draft.safetensors"), "--vq", str(checkpoints["vq"])])
    assert code == 2
    assert "draft vocab size 100 != target vocab size 96" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
