"""Prompt recipes of the unified-vocabulary models (specrt.export.unified.recipes).

Tiny word-level tokenizers carry each model's special-token names at ids unlike the real
models', so a hard-coded id fails. Expected rows are spelled out token by token; Janus's
[cond; uncond] rows are also compared with what transformers' own
JanusForConditionalGeneration.generate(generation_mode="image") builds from the same prompt.
"""
from __future__ import annotations

import numpy as np
import pytest

from specrt.errors import SpecrtError
from specrt.export.unified import recipes as R

tokenizers = pytest.importorskip("tokenizers")

UNK = "<unk>"
WORDS = ["a", "red", "cat", "<|User|>:", "<|Assistant|>:", "masterpiece,", "film", "grained,", "best", "quality.",
         "4*6", "Generate", "an", "image", "of", "96x64", "according", "to", "the", "following", "prompt:"]


def _tokenizer(special: list[str], first_special: int = 40):
    """Word-level over WORDS (ids from 7, so no id coincides with a real model's) plus `special`
    as added tokens from id `first_special` on."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {UNK: 6, **{w: 7 + i for i, w in enumerate(WORDS)}}
    vocab.update({s: first_special + i for i, s in enumerate(special)})
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    return tok


def _ids(tok, tokens: list[str]) -> list[int]:
    return [tok.token_to_id(t) if tok.token_to_id(t) is not None else tok.token_to_id(UNK) for t in tokens]


def _left_padded(rows: list[list[int]], cond_len: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(rows), cond_len), pad, np.int32)
    mask = np.zeros((len(rows), cond_len), bool)
    for r, row in enumerate(rows):
        ids[r, cond_len - len(row):], mask[r, cond_len - len(row):] = row, True
    return ids, mask


JANUS_SPECIAL = [R.JANUS_BOS, R.JANUS_PAD, R.JANUS_BOI]
EMU3_SPECIAL = [R.EMU3_BOS, R.EMU3_PAD, R.EMU3_BOI, R.EMU3_IMAGE_WRAPPER]
LUMINA_SPECIAL = [R.LUMINA_BOS, R.LUMINA_PAD, R.LUMINA_TURN_END, R.LUMINA_IMAGE_START,
                  R.lumina_size_token(2), R.lumina_size_token(3)]


# ---- Janus ----------------------------------------------------------------------------------------


def test_janus_rows_and_pad_uncond():
    tok = _tokenizer(JANUS_SPECIAL)
    recipe = R.recipe_for("JanusForConditionalGeneration", {"vq_config": {"num_patches": 4}}, tok)
    assert recipe.grid == (4, 4) and recipe.sampling_defaults["cfg_scale"] == 5.0
    ids, mask = R.encode_prompts(recipe.prompt, tok, [" a red cat ", "cat"], cond_len=9)
    bos, pad, boi = _ids(tok, JANUS_SPECIAL)
    cond = [_ids(tok, [R.JANUS_BOS, "<|User|>:", "a", "red", "cat", "<|Assistant|>:", R.JANUS_BOI]),
            _ids(tok, [R.JANUS_BOS, "<|User|>:", "cat", "<|Assistant|>:", R.JANUS_BOI])]
    uncond = [[bos] + [pad] * (len(c) - 2) + [boi] for c in cond]
    want_ids, want_mask = _left_padded(cond + uncond, 9, pad)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(mask, want_mask)
    assert ids.dtype == np.int32 and mask.dtype == bool


def test_janus_uncond_equals_transformers_generate():
    """The [cond; uncond] token rows and masks transformers' image generation embeds."""
    pytest.importorskip("transformers")
    import torch
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig

    torch.manual_seed(0)
    tok = _tokenizer(JANUS_SPECIAL)
    bos, pad, boi = _ids(tok, JANUS_SPECIAL)
    text = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, pad_token_id=pad, bos_token_id=bos, eos_token_id=0)
    config = JanusConfig(text_config=text,
                         vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                                            patch_size=8, num_image_tokens=4, intermediate_size=32, projection_dim=32),
                         vq_config=dict(base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1, latent_channels=32,
                                        embed_dim=8, num_embeddings=16, projection_dim=32, image_token_embed_dim=32))
    model = JanusForConditionalGeneration(config).eval()
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = bos
    model.generation_config.generation_kwargs = {"boi_token_id": boi}

    recipe = R.recipe_for("janus", config.to_dict(), tok)
    ids, mask = R.encode_prompts(recipe.prompt, tok, ["a red cat", "cat"], cond_len=8)
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    captured = {}
    original = model.prepare_inputs_for_generation

    def spy(*args, **kwargs):  # the 2-d mask generate doubled for the [cond; uncond] rows
        captured.setdefault("mask", kwargs["attention_mask"].clone())
        return original(*args, **kwargs)

    model.prepare_inputs_for_generation = spy
    try:
        model.generate(input_ids=torch.from_numpy(ids[:2]).long(), attention_mask=torch.from_numpy(mask[:2]).long(),
                       generation_mode="image", do_sample=False, guidance_scale=5.0)
    finally:
        hook.remove()
    np.testing.assert_array_equal(seen[0].numpy(), ids)
    np.testing.assert_array_equal(captured["mask"].numpy()[:, :8].astype(bool), mask)


# ---- Emu3 -----------------------------------------------------------------------------------------


def test_emu3_rows_and_negative_prompt_uncond():
    tok = _tokenizer(EMU3_SPECIAL)
    recipe = R.recipe_for("emu3", {}, tok, grid=(4, 6))
    assert R.recipe_for("emu3", {}, tok, grid=None).grid == (90, 90)  # 720 x 720 / 8
    assert recipe.sampling_defaults == {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2048, "top_p": 1.0}
    cond_len = 40
    ids, mask = R.encode_prompts(recipe.prompt, tok, ["a red cat"], cond_len)
    suffix = _ids(tok, [R.EMU3_BOI, "4*6", R.EMU3_IMAGE_WRAPPER])
    cond = _ids(tok, [R.EMU3_BOS, "a", "red", "cat", *R.EMU3_POSITIVE.split()]) + suffix
    uncond = _ids(tok, [R.EMU3_BOS, *R.EMU3_NEGATIVE.split()]) + suffix
    want_ids, want_mask = _left_padded([cond, uncond], cond_len, tok.token_to_id(R.EMU3_PAD))
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(mask, want_mask)


def test_without_uncond_gives_cond_rows_only():
    tok = _tokenizer(EMU3_SPECIAL)
    recipe = R.recipe_for("emu3", {}, tok, grid=(4, 6))
    ids, mask = R.encode_prompts(recipe.prompt, tok, ["a", "cat"], 40, with_uncond=False)
    both, _ = R.encode_prompts(recipe.prompt, tok, ["a", "cat"], 40)
    assert ids.shape == (2, 40) and mask.shape == (2, 40)
    np.testing.assert_array_equal(ids, both[:2])


# ---- Lumina-mGPT (Chameleon) ------------------------------------------------------------------------


def test_lumina_rows_and_image_start_uncond():
    tok = _tokenizer(LUMINA_SPECIAL)
    recipe = R.recipe_for("ChameleonForConditionalGeneration", {}, tok, grid=(4, 6))
    assert recipe.sampling_defaults == {"cfg_scale": 4.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}
    assert "96x64" in recipe.prompt["template"]  # W x H in pixels: 6 and 4 tokens of 16 px
    ids, mask = R.encode_prompts(recipe.prompt, tok, ["a red cat"], 20)
    start = _ids(tok, [R.LUMINA_IMAGE_START, "<reserved08802>", "<reserved08803>"])
    cond = _ids(tok, [R.LUMINA_BOS, "Generate", "an", "image", "of", "96x64", "according", "to", "the", "following",
                      "prompt:", "a", "red", "cat", R.LUMINA_TURN_END]) + start
    want_ids, want_mask = _left_padded([cond, start], 20, tok.token_to_id(R.LUMINA_PAD))
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(mask, want_mask)


def test_lumina_grid_must_be_whole_patches():
    with pytest.raises(SpecrtError, match="even"):
        R.recipe_for("chameleon", {}, _tokenizer(LUMINA_SPECIAL), grid=(5, 6))


# ---- refusals ---------------------------------------------------------------------------------------


def test_too_long_prompt_is_one_line():
    tok = _tokenizer(JANUS_SPECIAL)
    recipe = R.recipe_for("janus", {}, tok)
    with pytest.raises(SpecrtError, match="prompt 1 is 9 tokens") as err:
        R.encode_prompts(recipe.prompt, tok, ["cat", "a red cat a red"], cond_len=8)
    assert "\n" not in str(err.value)


def test_missing_token_name_is_one_line():
    tok = _tokenizer([R.EMU3_BOS, R.EMU3_PAD, R.EMU3_BOI])  # no <|image token|>
    with pytest.raises(SpecrtError, match="image token") as err:
        R.recipe_for("emu3", {}, tok, grid=(4, 6))
    assert "\n" not in str(err.value)


def test_config_vocabulary_map_supplies_names():
    """Emu3 / Chameleon configs carry `vocabulary_map`; a name missing from tokenizer.json is found there."""
    tok = _tokenizer([R.EMU3_BOS, R.EMU3_PAD, R.EMU3_BOI])
    recipe = R.recipe_for("emu3", {"vocabulary_map": {R.EMU3_IMAGE_WRAPPER: 63}}, tok, grid=(4, 6))
    assert recipe.prompt["suffix_ids"][-1] == 63


def test_prompt_block_is_json_ready():
    import json

    for arch, special in (("janus", JANUS_SPECIAL), ("emu3", EMU3_SPECIAL), ("chameleon", LUMINA_SPECIAL)):
        recipe = R.recipe_for(arch, {}, _tokenizer(special), grid=(4, 6) if arch != "janus" else None)
        assert json.loads(json.dumps(recipe.prompt)) == recipe.prompt
        assert {"template", "prefix_ids", "suffix_ids", "pad_id", "uncond"} <= set(recipe.prompt)
        assert set(recipe.sampling_defaults) == {"cfg_scale", "temperature", "top_k", "top_p"}
        assert {"template", "uncond", "sampling_defaults"} <= set(recipe.sources)
