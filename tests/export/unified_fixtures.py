"""Tiny random-weight unified-vocabulary checkpoints, made with transformers' own classes.

Each function writes a Hugging Face checkpoint directory (config.json, model.safetensors,
generation_config.json, tokenizer.json) the way `save_pretrained` writes a real one, so
specrt's loader and exporter see exactly the layout and naming of Janus-Pro, Emu3-Gen and
Lumina-mGPT (Chameleon) checkpoints — only smaller. The vocabularies follow each model's
own token names (Emu3's `<|visual token NNNNNN|>` and `<|extra_200|>` row end; Chameleon's
`IMGIMG…Z` image tokens, `<racm3:break>`, `<reserved08799>` row end and `<eoss>`; Janus's
`<begin_of_image>`), but at ids unlike the real models', so nothing that hard-codes a real
id can pass. Seeded: the same call writes the same weights.

Other tests import these (`from unified_fixtures import tiny_emu3`); the ids and grids they
need are in the returned directory's config.json / tokenizer.json and in the constants here.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

WORDS = ["a", "thin", "two", "one", "bold", "red", "digit", "seven", "blue", "the"]

# image grids the fixtures are made for (Janus's is fixed by its config; Emu3's and
# Chameleon's are the caller's choice at load time, these are what the tests use)
JANUS_GRID = (4, 4)
EMU3_CODES = 24
CHAMELEON_CODES = 20


def _tokenizer(path: Path, vocab: dict[str, int], special: list[str], unk: str) -> None:
    """A word-level tokenizer.json over `vocab` (runs with `tokenizers` alone)."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel(vocab=dict(vocab), unk_token=unk))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    tok.save(str(path / "tokenizer.json"))


def _save(model, path: Path, generation: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation, indent=1))
    return path


def _small_text(**overrides) -> dict:
    fields = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    fields.update(overrides)
    return fields


def tiny_janus(path) -> Path:
    """Janus-Pro layout: a Llama language model, SigLIP-style vision tower, VQ with a 32-code
    codebook and the separate generation embedding / aligner / head; a 4x4 image grid."""
    import torch
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig

    path = Path(path)
    names = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<unk>",
             "<begin_of_image>", "<end_of_image>", "<image_placeholder>", "<|User|>", "<|Assistant|>"]
    vocab = {name: i for i, name in enumerate(names)}
    for word in WORDS:
        vocab[word] = len(vocab)
    vocab_size = len(vocab) + 3  # a few unused rows, like real padded vocabularies
    text = LlamaConfig(vocab_size=vocab_size, head_dim=8, bos_token_id=vocab[names[0]],
                       eos_token_id=vocab[names[1]], pad_token_id=vocab[names[2]],
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       **_small_text())
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8,
                  projection_dim=32, num_image_tokens=JANUS_GRID[0] * JANUS_GRID[1], mlp_ratio=2.0)
    vq = dict(embed_dim=8, num_embeddings=32, latent_channels=32, base_channels=32, channel_multiplier=[1, 2],
              num_res_blocks=1, projection_dim=32, image_token_embed_dim=32, num_hidden_layers=2)
    config = JanusConfig(text_config=text.to_dict(), vision_config=vision, vq_config=vq,
                         image_token_id=vocab["<image_placeholder>"])
    torch.manual_seed(0)
    model = JanusForConditionalGeneration(config).eval()
    _save(model, path, {
        "bos_token_id": vocab[names[0]], "eos_token_id": vocab[names[1]], "pad_token_id": vocab[names[2]],
        "generation_kwargs": {"boi_token_id": vocab["<begin_of_image>"]}, "guidance_scale": 5.0,
    })
    _tokenizer(path, vocab, names, "<unk>")
    return path


def tiny_emu3(path, codes: int = EMU3_CODES, seed: int = 0) -> Path:
    """Emu3-Gen layout: visual tokens `<|visual token NNNNNN|>` at permuted ids inside the
    text vocabulary, `<|extra_200|>` ends every image row, `<|extra_201|>` the frame. `codes`:
    the VQ codebook's size; `seed`: the weights' (a draft for a target: the same vocabulary)."""
    import torch
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    path = Path(path)
    names = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|image start|>", "<|image end|>",
             "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<image>", "<unk>", "*"]
    vocab = {name: i for i, name in enumerate(names)}
    for word in WORDS + [str(n) for n in range(10)]:
        vocab[word] = len(vocab)
    start = len(vocab)
    order = np.random.default_rng(1).permutation(codes)  # code n at id start + order[n]
    for code in range(codes):
        vocab[f"<|visual token {code:06d}|>"] = start + int(order[code])
    vocab_size = len(vocab) + 2
    text = _small_text(vocab_size=vocab_size, pad_token_id=vocab["<|endoftext|>"],
                       bos_token_id=vocab["<|extra_203|>"], eos_token_id=vocab["<|extra_204|>"],
                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, attention_dropout=0.0)
    vq = dict(codebook_size=codes, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
              num_res_blocks=1, attn_resolutions=[], hidden_size=64, num_attention_heads=1,
              temporal_downsample_factor=4)
    special = [n for n in names if n not in ("*",)] + [n for n in vocab if n.startswith("<|visual")]
    config = Emu3Config(text_config=text, vq_config=vq, vocabulary_map=dict(vocab))
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    _save(model, path, {"bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"],
                        "pad_token_id": text["pad_token_id"]})
    _tokenizer(path, vocab, special, "<unk>")
    return path


def tiny_chameleon(path) -> Path:
    """Lumina-mGPT / Chameleon layout: image tokens `IMGIMG…Z` (digits spelt A..J) right after
    the four base specials as in Chameleon, then text and Lumina-mGPT's structural tokens
    `<racm3:break>` (image start), `<reserved08799>` (row end), `<reserved08800+n>` (size),
    `<eoss>`; qk-norm and swin_norm on, as Lumina-mGPT-7B sets them."""
    import torch
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    path = Path(path)
    names = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {name: i for i, name in enumerate(names)}
    order = np.random.default_rng(2).permutation(CHAMELEON_CODES)
    start = len(vocab)
    for code in range(CHAMELEON_CODES):
        spelt = "".join(chr(ord("A") + int(d)) for d in str(code))
        vocab[f"IMGIMG{spelt}Z"] = start + int(order[code])
    structural = ["<racm3:break>", "<eoss>", "<reserved08799>", "<image>", "<reserved08706>"]
    structural += [f"<reserved{8800 + n:05d}>" for n in range(1, 9)]
    for name in structural:
        vocab[name] = len(vocab)
    for word in WORDS:
        vocab[word] = len(vocab)
    vocab_size = len(vocab) + 3
    vq = dict(embed_dim=8, num_embeddings=CHAMELEON_CODES, latent_channels=32, base_channels=32,
              channel_multiplier=[1, 2], num_res_blocks=1, resolution=32, attn_resolutions=[])
    config = ChameleonConfig(vocab_size=vocab_size, bos_token_id=0, pad_token_id=1, eos_token_id=2,
                             vocabulary_map=dict(vocab), vq_config=vq, swin_norm=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                             **_small_text())
    torch.manual_seed(0)
    model = ChameleonForConditionalGeneration(config).eval()
    with torch.no_grad():  # transformers initialises qk-norm to the identity: make it matter
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.normal_(1.0, 0.2)
                norm.bias.normal_(0.0, 0.2)
    _save(model, path, {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1})
    _tokenizer(path, vocab, names + structural + [n for n in vocab if n.startswith("IMGIMG")], "<unk>")
    return path


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models on a shared 2-core machine: torch's thread pool only adds synchronisation.
    Importing this fixture into a test module makes it apply to the whole module."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
