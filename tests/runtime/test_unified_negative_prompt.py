"""A per-call negative prompt and the recipe's positive suffix for unified-vocabulary models
(runtime.families.unified: PromptEncoder, UnifiedPipeline.generate, `specrt generate
--negative-prompt / --no-prompt-suffix`).

Rows are spelled out token by token over tiny word-level tokenizers that carry each model's
special-token names; the chameleon demo shows the negative prompt reaching the image tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

from cli_helpers import one_line, run
from specrt.errors import SpecrtError
from specrt.export.unified import recipes as R
from specrt.runtime.families.unified.prompts import PromptEncoder

tokenizers = pytest.importorskip("tokenizers")

UNK = "<unk>"
WORDS = ["a", "red", "cat", "blurry", "dog", "<|User|>:", "<|Assistant|>:", "masterpiece,", "film", "grained,",
         "best", "quality.", "4*6", "Generate", "an", "image", "of", "96x64", "according", "to", "the", "following",
         "prompt:", *R.EMU3_NEGATIVE.split()]
COND_LEN = 64


def _tokenizer(special: list[str]):
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {UNK: 6, **{w: 7 + i for i, w in enumerate(dict.fromkeys(WORDS))}}
    vocab.update({s: 200 + i for i, s in enumerate(special)})
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    return tok


def _ids(tok, tokens: list[str]) -> list[int]:
    return [tok.token_to_id(t) for t in tokens]


def _rows(conditions) -> tuple[list[int], list[int]]:
    """(cond, uncond) token ids of the first image, padding dropped."""
    both = conditions.with_uncond(0)
    ids, mask = both.prompt_ids, both.caption_mask
    n = len(ids) // 2
    return [int(i) for i in ids[0][mask[0]]], [int(i) for i in ids[n][mask[n]]]


@pytest.fixture
def emu3():
    tok = _tokenizer([R.EMU3_BOS, R.EMU3_PAD, R.EMU3_BOI, R.EMU3_IMAGE_WRAPPER])
    recipe = R.recipe_for("emu3", {}, tok, grid=(4, 6))
    suffix = _ids(tok, [R.EMU3_BOI, "4*6", R.EMU3_IMAGE_WRAPPER])
    return PromptEncoder(recipe.prompt, COND_LEN, tok), tok, suffix


def test_emu3_default_rows_are_the_recipe_s_own(emu3):
    encoder, tok, suffix = emu3
    cond, uncond = _rows(encoder.encode(["a red cat"]))
    assert cond == _ids(tok, [R.EMU3_BOS, "a", "red", "cat", *R.EMU3_POSITIVE.split()]) + suffix
    assert uncond == _ids(tok, [R.EMU3_BOS, *R.EMU3_NEGATIVE.split()]) + suffix


def test_emu3_negative_prompt_replaces_the_unconditional_row_only(emu3):
    encoder, tok, suffix = emu3
    default_cond, _ = _rows(encoder.encode(["a red cat"]))
    cond, uncond = _rows(encoder.encode(["a red cat"], negative_prompt="blurry dog"))
    assert cond == default_cond
    assert uncond == _ids(tok, [R.EMU3_BOS, "blurry", "dog"]) + suffix
    _, empty = _rows(encoder.encode(["a red cat"], negative_prompt=""))
    assert empty == _ids(tok, [R.EMU3_BOS]) + suffix  # the row without words


def test_emu3_without_prompt_suffix_drops_the_fixed_words(emu3):
    encoder, tok, suffix = emu3
    cond, uncond = _rows(encoder.encode(["a red cat"], prompt_suffix=False))
    assert cond == _ids(tok, [R.EMU3_BOS, "a", "red", "cat"]) + suffix
    assert uncond == _ids(tok, [R.EMU3_BOS, *R.EMU3_NEGATIVE.split()]) + suffix  # the negative never had it
    with pytest.raises(SpecrtError, match="prompt_ids are used as given"):
        encoder.encode(prompt_ids=[cond], prompt_suffix=False)


def test_negative_prompt_of_unknown_words_is_refused(emu3):
    encoder, _, _ = emu3
    with pytest.raises(SpecrtError, match="the negative prompt .*no word of it is known"):
        encoder.encode(["a red cat"], negative_prompt="zzz qqq")


def test_lumina_negative_prompt_goes_through_its_template_and_has_no_suffix_to_drop():
    tok = _tokenizer([R.LUMINA_BOS, R.LUMINA_PAD, R.LUMINA_TURN_END, R.LUMINA_IMAGE_START,
                      R.lumina_size_token(2), R.lumina_size_token(3)])
    recipe = R.recipe_for("chameleon", {}, tok, grid=(4, 6), downsample=16)
    encoder = PromptEncoder(recipe.prompt, COND_LEN, tok)
    image_start = _ids(tok, [R.LUMINA_IMAGE_START, R.lumina_size_token(2), R.lumina_size_token(3)])
    _, default = _rows(encoder.encode(["a red cat"]))
    assert default == image_start
    _, uncond = _rows(encoder.encode(["a red cat"], negative_prompt="blurry dog"))
    words = "Generate an image of 96x64 according to the following prompt: blurry dog".split()
    assert uncond == _ids(tok, [R.LUMINA_BOS, *words, R.LUMINA_TURN_END]) + image_start
    with pytest.raises(SpecrtError, match="no fixed suffix"):
        encoder.encode(["a red cat"], prompt_suffix=False)


def test_janus_negative_prompt_replaces_the_padded_prompt():
    tok = _tokenizer([R.JANUS_BOS, R.JANUS_PAD, R.JANUS_BOI])
    encoder = PromptEncoder(R.recipe_for("janus", {}, tok, grid=(4, 4)).prompt, COND_LEN, tok)
    cond, default = _rows(encoder.encode(["a red cat"]))
    assert default == [cond[0]] + [tok.token_to_id(R.JANUS_PAD)] * (len(cond) - 2) + [cond[-1]]
    _, uncond = _rows(encoder.encode(["a red cat"], negative_prompt="blurry dog"))
    assert uncond == _ids(tok, [R.JANUS_BOS, "<|User|>:", "blurry", "dog", "<|Assistant|>:", R.JANUS_BOI])


# ---- the chameleon demo: the row reaches the image tokens ---------------------------------------------


@pytest.fixture(scope="module")
def chameleon():
    pytest.importorskip("torch")
    from specrt.export.demo.registry import get_demo

    return get_demo("chameleon").hook("torch_pipeline")(None, threads=1)


def test_negative_prompt_changes_the_demo_s_image_tokens(chameleon):
    default = chameleon.conditions(prompts=["a thin two"]).with_uncond(0)
    negative = chameleon.conditions(prompts=["a thin two"], negative_prompt="a thick seven").with_uncond(0)
    np.testing.assert_array_equal(default.prompt_ids[0], negative.prompt_ids[0])  # the prompt's row is kept
    assert not np.array_equal(default.prompt_ids[1], negative.prompt_ids[1])
    base = chameleon.generate(prompts=["a thin two"], seed=0, decode=False).tokens
    again = chameleon.generate(prompts=["a thin two"], seed=0, decode=False, negative_prompt=None).tokens
    steered = chameleon.generate(prompts=["a thin two"], seed=0, decode=False, negative_prompt="a thick seven").tokens
    np.testing.assert_array_equal(base, again)
    assert not np.array_equal(base, steered)


def test_cli_passes_the_negative_prompt(chameleon, tmp_path, capsys):
    want = chameleon.generate(prompts=["a thin two"], seed=0, decode=False, negative_prompt="a thick seven").tokens
    out = tmp_path / "t.npy"
    code, err = run(["generate", "--demo", "chameleon", "--prompt", "a thin two", "--negative-prompt", "a thick seven",
                     "--tokens-only", "--save-tokens", str(out)], capsys)
    assert code == 0, err
    np.testing.assert_array_equal(np.load(out), np.asarray(want))


@pytest.mark.parametrize("argv, flag", [
    (["--demo", "c2i", "--negative-prompt", "blurry"], "--negative-prompt"),
    (["--demo", "t2i", "--prompt", "a thin two", "--negative-prompt", "blurry"], "--negative-prompt"),
    (["--demo", "t2i", "--prompt", "a thin two", "--no-prompt-suffix"], "--no-prompt-suffix"),
    (["--demo", "mar", "--negative-prompt", "blurry"], "--negative-prompt"),
    (["--demo", "mar", "--no-prompt-suffix"], "--no-prompt-suffix"),
])
def test_flags_are_refused_where_the_unconditional_row_is_no_prompt(argv, flag, tmp_path, capsys, monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded although the flag should have been refused")

    from specrt.commands import generate
    from specrt.export.mar import hooks as mar_hooks

    monkeypatch.setattr(generate, "build_pipeline", loaded)
    monkeypatch.setattr(mar_hooks, "torch_pipeline", loaded)
    code, err = run(["generate", *argv, "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and one_line(err).startswith(f"specrt: error: {flag} ")
