"""Unified-vocabulary VQ decoders (specrt.export.unified.vq) against independent references.

Janus and Emu3: transformers' own decode on tiny random models saved with save_pretrained.
Chameleon's VQGAN: a taming-layout checkpoint made from our LlamaGen VQ (tested on its own,
tests/export/test_llamagen_vq.py) through taming's key names, decoded by both. Each decoder
also exports through export_vq_decode and runs on onnxruntime.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from specrt.errors import SpecrtError
from specrt.export.onnx_export import GraphLimits, export_vq_decode
from specrt.export.unified import vq as uvq
from specrt.models.llamagen_vq import VQConfig, VQModel

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _jitter(module: nn.Module, seed: int) -> None:
    """Move every parameter off its init (GroupNorm's 1/0 would hide a misplaced norm)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="module")
def janus_dir(tmp_path_factory) -> tuple[Path, nn.Module]:
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig

    torch.manual_seed(0)
    config = JanusConfig(
        text_config=LlamaConfig(**TEXT),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8,
                           num_image_tokens=16, intermediate_size=32, projection_dim=32),
        vq_config=dict(base_channels=32, channel_multiplier=[1, 2, 2], num_res_blocks=1, latent_channels=32,
                       embed_dim=8, num_embeddings=16, projection_dim=32, image_token_embed_dim=32))
    model = JanusForConditionalGeneration(config).eval()
    _jitter(model.model.vqmodel, 1)
    path = tmp_path_factory.mktemp("janus")
    model.save_pretrained(path)
    return path, model.model.vqmodel


@pytest.fixture(scope="module")
def emu3_dir(tmp_path_factory) -> tuple[Path, nn.Module]:
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    torch.manual_seed(0)
    vocab = {f"<|visual token {i:06d}|>": 30 + i for i in range(16)}
    vocab.update({"<|extra_200|>": 60, "<image>": 61})
    vq = dict(codebook_size=16, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
              num_res_blocks=1, attn_resolutions=[1], hidden_size=64, num_attention_heads=1, temporal_downsample_factor=4)
    model = Emu3ForConditionalGeneration(Emu3Config(text_config=TEXT, vq_config=vq, vocabulary_map=vocab)).eval()
    _jitter(model.model.vqmodel, 2)
    path = tmp_path_factory.mktemp("emu3")
    model.save_pretrained(path)
    return path, model.model.vqmodel


def _codes(shape: tuple[int, ...], vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _onnx_matches(module: nn.Module, grid: int, out_dir: Path) -> None:
    import onnxruntime as ort

    spec = export_vq_decode(module, grid, GraphLimits(capacity=grid * grid + 8, max_batch=4), out_dir)
    session = ort.InferenceSession(str(out_dir / spec.file), providers=["CPUExecutionProvider"])
    codes = _codes((3, grid, grid), module.config.codebook_size, seed=5)
    (onnx_image,) = session.run(None, {"codes": codes.numpy().astype(np.int32)})
    with torch.no_grad():
        torch_image = module.decode_codes(codes).numpy()
    assert onnx_image.shape == (3, 3, grid * module.config.downsample, grid * module.config.downsample)
    np.testing.assert_allclose(onnx_image, torch_image, atol=1e-4, rtol=0)


# ---- Janus ----------------------------------------------------------------------------------------


def test_janus_decode_matches_transformers(janus_dir):
    path, reference = janus_dir
    module = uvq.load_unified_vq(path, "JanusForConditionalGeneration")
    assert module.config.downsample == 4 and module.config.codebook_size == 16
    codes = _codes((2, 4, 4), 16)
    with torch.no_grad():
        ours = module.decode_codes(codes)
        theirs = reference.decode(codes.view(2, -1))
    assert ours.shape == theirs.shape == (2, 3, 16, 16)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_janus_decodes_rectangular_grids(janus_dir):
    """transformers' decode insists on its square num_patches; ours is fully convolutional."""
    module = uvq.load_unified_vq(janus_dir[0], "janus")
    with torch.no_grad():
        assert module.decode_codes(_codes((1, 3, 5), 16)).shape == (1, 3, 12, 20)


def test_janus_preprocessor_normalisation_maps_to_minus_one_one(janus_dir, tmp_path):
    """A checkpoint normalised with other mean/std still decodes into the [-1, 1] convention."""
    path, reference = janus_dir
    for item in path.iterdir():
        (tmp_path / item.name).symlink_to(item)
    mean, std = [0.48, 0.46, 0.41], [0.27, 0.26, 0.28]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": mean, "image_std": std}))
    module = uvq.load_unified_vq(tmp_path, "janus")
    codes = _codes((1, 4, 4), 16)
    with torch.no_grad():
        raw = reference.decode(codes.view(1, -1))
        expected = 2 * (raw * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1)) - 1
        torch.testing.assert_close(module.decode_codes(codes), expected, atol=1e-4, rtol=0)


def test_janus_exports_to_onnx(janus_dir, tmp_path):
    _onnx_matches(uvq.load_unified_vq(janus_dir[0], "janus"), 4, tmp_path)


# ---- Emu3 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 4, 4), (1, 3, 5)])
def test_emu3_decode_matches_transformers(emu3_dir, shape):
    path, reference = emu3_dir
    module = uvq.load_unified_vq(path, "emu3")
    assert module.config.downsample == 2 and module.config.codebook_size == 16
    codes = _codes(shape, 16)
    with torch.no_grad():
        ours = module.decode_codes(codes)
        theirs = reference.decode(codes)
    assert ours.shape == theirs.shape == (shape[0], 3, shape[1] * 2, shape[2] * 2)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_emu3_exports_to_onnx(emu3_dir, tmp_path):
    _onnx_matches(uvq.load_unified_vq(emu3_dir[0], "emu3"), 4, tmp_path)


# ---- Chameleon's VQGAN (Lumina-mGPT) ---------------------------------------------------------------


def _taming_key(llamagen_key: str, levels: int) -> str:
    """LlamaGen VQModel key -> taming VQModel key. LlamaGen's decoder.conv_blocks[j] is level
    levels-1-j (lowest resolution first); taming's decoder.up[level]; res -> block; mid list ->
    block_1 / attn_1 / block_2."""
    parts = llamagen_key.split(".")
    if parts[0] == "decoder" and parts[1] == "conv_blocks":
        parts[1], parts[2] = "up", str(levels - 1 - int(parts[2]))
        parts[3] = {"res": "block"}.get(parts[3], parts[3])
    if parts[0] == "decoder" and parts[1] == "mid":
        parts[2] = ("block_1", "attn_1", "block_2")[int(parts[2])]
    return ".".join(parts)


def _write_vqgan(folder: Path, with_attention: bool) -> VQModel:
    """A taming-layout vqgan.ckpt (Lightning-style {'state_dict': ...} with encoder and loss keys
    the decoder must ignore) + vqgan.yaml, from a random LlamaGen VQ without l2 normalisation."""
    config = VQConfig(codebook_size=24, codebook_embed_dim=6, codebook_l2_norm=False, codebook_show_usage=False,
                      ch=32, ch_mult=(1, 2, 2), z_channels=32, num_res_blocks=1)
    torch.manual_seed(3)
    model = VQModel(config).eval()
    _jitter(model, 4)
    if not with_attention:  # taming with attn_resolutions [] has no attention in the up blocks
        model.decoder.conv_blocks[0].attn = nn.ModuleList()
    levels = len(config.ch_mult)
    state = {_taming_key(k, levels): v for k, v in model.state_dict().items()}
    state["loss.discriminator.main.0.weight"] = torch.zeros(2, 2)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "global_step": 7}, folder / "vqgan.ckpt")
    resolution = 64
    attn = [resolution // 2 ** (levels - 1)] if with_attention else []
    (folder / "vqgan.yaml").write_text(
        "model:\n  target: taming.models.vqgan.VQModel\n  params:\n    embed_dim: 6\n    n_embed: 24\n"
        "    ddconfig:\n      double_z: false\n      z_channels: 32\n      resolution: 64\n      in_channels: 3\n"
        "      out_ch: 3\n      ch: 32\n      ch_mult:\n      - 1\n      - 2\n      - 2\n      num_res_blocks: 1\n"
        f"      attn_resolutions: {attn}\n      dropout: 0.0\n    lossconfig:\n      target: x.Loss\n")
    return model


@pytest.mark.parametrize("with_attention", [True, False])
def test_chameleon_vqgan_matches_llamagen_decoder(tmp_path, with_attention):
    reference = _write_vqgan(tmp_path, with_attention)
    module = uvq.load_chameleon_vqgan(tmp_path / "vqgan.ckpt", tmp_path / "vqgan.yaml")
    assert module.config.downsample == 4 and module.config.codebook_size == 24
    assert module.config.attn_levels == ((2,) if with_attention else ())
    codes = _codes((2, 3, 5), 24)
    with torch.no_grad():
        torch.testing.assert_close(module.decode_codes(codes), reference.decode_codes(codes), atol=1e-4, rtol=0)


def test_chameleon_yaml_without_pyyaml(tmp_path, monkeypatch):
    """The fallback parser reads vqgan.yaml into the same config as PyYAML."""
    _write_vqgan(tmp_path, True)
    with_yaml = uvq.chameleon_vq_config(tmp_path / "vqgan.yaml")
    monkeypatch.setitem(__import__("sys").modules, "yaml", None)  # import yaml -> ImportError
    assert uvq.chameleon_vq_config(tmp_path / "vqgan.yaml") == with_yaml


def test_chameleon_dir_finds_vqgan_and_exports(tmp_path):
    _write_vqgan(tmp_path / "ckpt" / "tokenizer", True)
    module = uvq.load_unified_vq(tmp_path / "ckpt", "ChameleonForConditionalGeneration")
    _onnx_matches(module, 4, tmp_path)


def test_chameleon_without_vqgan_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SpecrtError) as err:
        uvq.load_unified_vq(tmp_path, "chameleon")
    assert "vqgan.ckpt" in str(err.value) and "vqgan.yaml" in str(err.value) and "\n" not in str(err.value)


def test_unsupported_architecture_is_one_line(tmp_path):
    with pytest.raises(SpecrtError, match="supported: janus, emu3, chameleon"):
        uvq.load_unified_vq(tmp_path, "LlavaForConditionalGeneration")
