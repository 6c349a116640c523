"""Checkpoint loading: file formats and wrappings, and one-line errors that say what is wrong."""
import argparse

import pytest
import torch
from safetensors.torch import save_file

from specrt.errors import SpecrtError
from specrt.export.checkpoints import (MAX_MESSAGE, image_size_from_name, infer_gpt_config, load_gpt, load_state_dict,
                                       load_vq)
from specrt.models.llamagen_gpt import GPTConfig
from specrt.models.llamagen_vq import VQConfig, VQModel

from llamagen_reference import llamagen_gpt_shapes, random_state_dict

SMALL = dict(dim=64, n_layer=2, n_head=4, vocab_size=100, num_classes=10, grid_size=4)


def _small_state(**overrides) -> dict[str, torch.Tensor]:
    fields = dict(dim=64, n_layer=2, n_head=4, n_kv_head=4, vocab_size=100, num_classes=10)
    fields.update(overrides)
    return random_state_dict(llamagen_gpt_shapes(**fields))


def _empty_state(shapes) -> dict[str, torch.Tensor]:
    """Right shapes, uninitialised memory: enough for shape checks of big architectures."""
    return {k: torch.empty(s) for k, s in shapes.items()}


def _one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and len(message) <= MAX_MESSAGE
    return message


@pytest.mark.parametrize("wrap", ["model", "module", "state_dict", "ema", None])
def test_sections_and_prefixes_are_unwrapped(tmp_path, wrap):
    state = _small_state()
    prefixed = {f"module._orig_mod.{k}": v for k, v in state.items()}
    prefixed["layers.0.attention.kv_cache.k_cache"] = torch.zeros(1)  # left behind by setup_caches
    payload = prefixed if wrap is None else {wrap: prefixed, "steps": 10, "args": argparse.Namespace(lr=1e-4)}
    path = tmp_path / "ckpt.pth"
    torch.save(payload, path)
    loaded = load_state_dict(path)
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_explicit_section_and_safetensors(tmp_path):
    state = _small_state()
    path = tmp_path / "both.pt"
    torch.save({"model": _small_state(dim=32, n_head=2), "ema": state}, path)
    assert torch.equal(load_state_dict(path, section="ema")["norm.weight"], state["norm.weight"])
    with pytest.raises(SpecrtError, match="no section 'average'") as exc:
        load_state_dict(path, section="average")
    _one_line(exc)
    st_path = tmp_path / "w.safetensors"
    save_file(state, str(st_path))
    model = load_gpt(st_path, GPTConfig(**SMALL))
    assert torch.equal(model.tok_embeddings.weight, state["tok_embeddings.weight"])


class _Opaque:
    pass


def test_unreadable_files_raise_one_line_errors(tmp_path):
    with pytest.raises(SpecrtError, match="not found"):
        load_state_dict(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(SpecrtError, match="cannot read") as exc:
        load_state_dict(garbage)
    _one_line(exc)
    pickled = tmp_path / "objects.pt"
    torch.save({"model": _small_state(), "thing": _Opaque()}, pickled)
    with pytest.raises(SpecrtError, match="Python objects") as exc:
        load_state_dict(pickled)
    _one_line(exc)
    assert "norm.weight" in load_state_dict(pickled, allow_pickle=True)
    listing = tmp_path / "list.pt"
    torch.save([1, 2], listing)
    with pytest.raises(SpecrtError, match="not a state_dict"):
        load_state_dict(listing)
    nothing = tmp_path / "nothing.pt"
    torch.save({"optimizer": {"lr": 1.0}}, nothing)
    with pytest.raises(SpecrtError, match="no model weights.*optimizer"):
        load_state_dict(nothing)


def test_infer_gpt_config_reads_shapes():
    gpt_b = infer_gpt_config(_empty_state(llamagen_gpt_shapes(768, 12, 12, 12, 16384)), grid_size=24)
    assert (gpt_b.dim, gpt_b.n_layer, gpt_b.n_head, gpt_b.num_classes, gpt_b.grid_size) == (768, 12, 12, 1000, 24)
    gqa = _small_state(n_head=4, n_kv_head=2, dim=256)
    for given in (dict(n_head=4), dict(n_kv_head=2), dict(n_head=4, n_kv_head=2)):
        config = infer_gpt_config(gqa, grid_size=4, **given)
        assert (config.n_head, config.n_kv_head, config.head_dim) == (4, 2, 64)
    t2i = infer_gpt_config(_small_state(model_type="t2i", caption_dim=32, cond_len=7), grid_size=4, n_head=4)
    assert (t2i.model_type, t2i.cond_len, t2i.caption_dim) == ("t2i", 7, 32)


def test_head_count_of_a_custom_size_is_asked_for_never_guessed():
    state = _small_state(dim=128, n_head=4, n_kv_head=4)  # head_dim 32: a head_dim-64 guess would say 2 heads
    with pytest.raises(SpecrtError, match="head count is not in the weights.*dim 128 with 2 layers.*give --n-head") as exc:
        infer_gpt_config(state, grid_size=4)
    _one_line(exc)
    with pytest.raises(SpecrtError, match="give --draft-n-head"):
        load_gpt(state, grid_size=4, flag_prefix="draft-")
    assert load_gpt(state, grid_size=4, n_head=4).config.n_head == 4
    for bad, message in ((dict(n_head=3), "--n-head 3 does not fit the weights"),
                         (dict(n_head=4, n_kv_head=2), "--n-kv-head 2 disagrees with the weights.*4 kv heads"),
                         (dict(n_kv_head=3), "--n-kv-head 3 does not fit")):
        with pytest.raises(SpecrtError, match=message) as exc:
            load_gpt(state, grid_size=4, **bad)
        _one_line(exc)
    gpt_b = _empty_state(llamagen_gpt_shapes(768, 12, 12, 12, 16384))
    with pytest.raises(SpecrtError, match="--n-head 6 disagrees with --arch GPT-B \\(12 heads\\)"):
        load_gpt(gpt_b, "GPT-B", grid_size=16, n_head=6)


def test_conditioning_comes_from_the_keys():
    from specrt.runtime.compatibility import conditioning_from_keys

    assert conditioning_from_keys(_small_state()) == "c2i"
    assert conditioning_from_keys(_small_state(model_type="t2i", caption_dim=32, cond_len=7)) == "t2i"
    state = {k: v for k, v in _small_state().items() if not k.startswith("cls_embedding")}
    with pytest.raises(SpecrtError, match="cannot tell the GPT's conditioning: it has neither") as exc:
        infer_gpt_config(state, grid_size=4, n_head=4)
    _one_line(exc)


def test_wrong_arch_names_the_arch_the_weights_point_to():
    gpt_b = _empty_state(llamagen_gpt_shapes(768, 12, 12, 12, 16384))
    with pytest.raises(SpecrtError) as exc:
        load_gpt(gpt_b, GPTConfig(dim=128, n_layer=2, n_head=2))
    message = _one_line(exc)
    assert "does not fit custom GPT c2i (dim 128, 2 layers" in message
    assert "18 shape mismatches (cls_embedding.embedding_table.weight: file [1001, 768] vs model [1001, 128]" in message
    assert "unexpected keys (layers.2." in message
    assert "look like GPT-B c2i (dim 768, 12 layers, 12 heads, vocab 16384, 1000 classes)" in message


def test_arch_name_takes_vocab_and_classes_from_the_weights(tmp_path):
    state = _small_state()
    with pytest.raises(SpecrtError, match="does not fit GPT-B.*look like custom GPT c2i \\(dim 64, 2 layers"):
        load_gpt(state, "GPT-B", grid_size=4)
    with pytest.raises(SpecrtError, match="unknown GPT arch 'GPT-Q'"):
        load_gpt(state, "GPT-Q", grid_size=4)


def test_missing_and_unexpected_keys_are_listed():
    state = _small_state()
    state = {k: v for k, v in state.items() if not k.startswith("layers.1.feed_forward")}
    state["extra.head.weight"] = torch.zeros(3)
    with pytest.raises(SpecrtError) as exc:
        load_gpt(state, GPTConfig(**SMALL))
    message = _one_line(exc)
    assert "3 missing keys (layers.1.feed_forward.w1.weight" in message
    assert "1 unexpected keys (extra.head.weight)" in message


def test_vq_mismatch_reports_inferred_config():
    source = VQModel(VQConfig(codebook_size=32, codebook_embed_dim=4, ch=16, ch_mult=(1, 2), z_channels=16, norm_groups=8))
    with pytest.raises(SpecrtError) as exc:
        load_vq(source.state_dict(), VQConfig(codebook_size=64, codebook_embed_dim=4, ch=16, ch_mult=(1, 2),
                                               z_channels=16, norm_groups=8))
    message = _one_line(exc)
    assert "quantize.embedding.weight: file [32, 4] vs model [64, 4]" in message
    assert "codebook 32x4" in message
    with pytest.raises(SpecrtError, match="not a LlamaGen VQ checkpoint"):
        load_vq(_small_state())


def test_image_size_comes_from_the_flag_or_the_file_name_else_one_line_error(tmp_path):
    from specrt.export.checkpoints import image_grid
    from specrt.export.sources import checkpoint_image_size

    assert image_size_from_name("/ckpt/c2i_XL_384.pt") == 384
    assert image_size_from_name("t2i_XL_stage2_512.pt") == 512
    assert image_size_from_name("gpt_b.pt") is None
    assert checkpoint_image_size(None, tmp_path / "c2i_custom_384.pt") == 384
    assert checkpoint_image_size(256, tmp_path / "c2i_custom_384.pt") == 256
    with pytest.raises(SpecrtError, match="give --image-size") as exc:
        checkpoint_image_size(None, tmp_path / "gpt.pt")
    _one_line(exc)
    assert (image_grid(384, 16), image_grid(256, 8)) == (24, 32)
    with pytest.raises(SpecrtError, match="multiple of the VQ's downsampling 8, got 100"):
        image_grid(100, 8)
    with pytest.raises(SpecrtError, match="image grid is not in a GPT's weights"):
        load_gpt(_small_state(), n_head=4)
    assert load_gpt(_small_state(), GPTConfig(**SMALL)).config.grid_size == 4


def test_half_precision_checkpoints_load_into_float32(tmp_path):
    state = {k: v.to(torch.bfloat16) for k, v in _small_state().items()}
    path = tmp_path / "bf16.pt"
    torch.save(state, path)
    model = load_gpt(path, GPTConfig(**SMALL))
    assert model.output.weight.dtype == torch.float32
    assert torch.equal(model.output.weight, state["output.weight"].float())


def test_decoder_only_vq_file_loads_without_encoder():
    config = VQConfig(codebook_size=32, codebook_embed_dim=4, ch=16, ch_mult=(1, 2), z_channels=16, norm_groups=8)
    state = {k: v for k, v in VQModel(config).state_dict().items() if not k.startswith(("encoder.", "quant_conv."))}
    decoder = load_vq(state, decoder_only=True, norm_groups=8)
    assert decoder.config == config
    with pytest.raises(SpecrtError, match="missing keys \\(encoder"):
        load_vq(state, norm_groups=8)


class _WritesAFile:
    """Unpickling this calls exec, which would create `target`: what a hostile checkpoint does."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (exec, (f"open({self.target!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_a_crafted_pickle_is_refused_and_never_run(tmp_path, writer, capfd):
    import pickle

    from specrt.cli import main

    marker = tmp_path / "pwned.txt"
    evil = tmp_path / "evil.pt"
    payload = {"model": {**_small_state(), "x": _WritesAFile(marker)}}
    if writer == "torch.save":
        torch.save(payload, evil)
    else:
        evil.write_bytes(pickle.dumps(payload, protocol=4))
    with pytest.raises(SpecrtError, match="refusing to unpickle anything but tensors") as exc:
        load_state_dict(evil)
    _one_line(exc)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--target", str(evil), "--vq", str(evil), "--image-size", "256",
              "--out", str(tmp_path / "x.png")])
    err = capfd.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "refusing to unpickle" in err, err
    assert not marker.exists()


def test_safetensors_content_is_read_as_safetensors_whatever_the_name(tmp_path):
    from safetensors.torch import save_file

    named_pt = tmp_path / "weights.pt"
    save_file(_small_state(), str(named_pt))
    assert set(load_state_dict(named_pt)) == set(_small_state())
