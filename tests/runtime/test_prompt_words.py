"""Prompts the model cannot read are said, never drawn silently: a prompt with no word its
tokenizer knows is refused (one line, exit 2, no image), since the model would draw the same
picture for any such prompt; unknown words among known ones, and a prompt longer than the text
encoder reads, are one warning line each and the image is still made."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from cli_helpers import one_line, run
from specrt.errors import SpecrtError, SpecrtWarning

pytest.importorskip("torch")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

NONSENSE = "zzz qqq"
LONG = " ".join(["a thick seven"] * 1700)  # 5,100 words


@pytest.fixture(scope="module")
def t2i_encoder():
    """The t2i demo's own text encoder (a word-level tokenizer over its caption words), reading
    the demo GPTs' 12 caption tokens."""
    from specrt.export.demo.t2i import packaged_weights_dir
    from specrt.runtime.text import T5TextEncoder

    return T5TextEncoder(packaged_weights_dir() / "text_encoder", max_length=12)


def _specrt_warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("specrt: warning: ")]


# ---- the CLI ---------------------------------------------------------------------------------------

def test_a_t2i_prompt_with_no_known_word_is_refused_and_writes_no_image(tmp_path, capsys):
    out = tmp_path / "img.png"
    code, err = run(["generate", "--demo", "t2i", "--prompt", NONSENSE, "--out", str(out)], capsys)
    assert code == 2
    assert "no word of it is known to this model's tokenizer" in one_line(err)
    assert "seven" in err or "digit" in err  # the demo's closed vocabulary: words it does know
    assert list(tmp_path.iterdir()) == []


def test_the_chameleon_demo_refuses_a_prompt_with_no_known_word(tmp_path, capsys):
    out = tmp_path / "img.png"
    code, err = run(["generate", "--demo", "chameleon", "--prompt", NONSENSE, "--out", str(out)], capsys)
    assert code == 2
    assert "no word of it is known to this model's tokenizer" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_a_t2i_prompt_cut_to_the_encoder_length_is_one_warning_naming_both_counts(tmp_path, capsys):
    out = tmp_path / "img.png"
    code, err = run(["generate", "--demo", "t2i", "--prompt", LONG, "--out", str(out)], capsys)
    assert code == 0, err
    assert _specrt_warnings(err) == ["specrt: warning: prompt 0 is 5101 tokens; the text encoder reads its first 12 "
                                     "and the rest is cut"], err
    assert out.is_file()


def test_a_prompt_that_fits_with_known_words_gets_no_warning(tmp_path, capsys):
    code, err = run(["generate", "--demo", "t2i", "--prompt", "a thick seven", "--out", str(tmp_path / "i.png")],
                    capsys)
    assert code == 0 and err == "", err


# ---- the Python API, serving, and the unified family ------------------------------------------------

def test_unknown_words_among_known_ones_are_named_in_a_warning(t2i_encoder):
    with pytest.warns(SpecrtWarning, match=r"prompt 1: 1 word\(s\) unknown .*'zzz'"):
        t2i_encoder.check(["a thick seven", "a zzz seven"])


def test_the_bundle_text_encoder_checks_prompts_as_the_torch_one_does(t2i_encoder):
    from specrt.runtime.text import OnnxTextEncoder

    folder = t2i_encoder.directory
    encoder = OnnxTextEncoder(None, folder / "tokenizer.json", max_length=12, pad_id=0, dim=64, session=object())
    with pytest.raises(SpecrtError, match="no word of it is known"):
        encoder.check([NONSENSE])
    with pytest.warns(SpecrtWarning, match="is 5101 tokens; the text encoder reads its first 12"):
        encoder.check([LONG])


def test_a_served_row_with_no_known_word_is_refused_on_its_own(t2i_encoder):
    from specrt.runtime.families.llamagen import FAMILY

    pipeline = SimpleNamespace(text_encoder=t2i_encoder, sampling_defaults={})
    with pytest.raises(SpecrtError, match="no word of it is known"):
        FAMILY.check_request(pipeline, "ar", {}, prompt=NONSENSE)


def test_the_unified_prompt_encoder_refuses_no_known_word_and_warns_about_unknown_ones():
    from specrt.export.demo.unified.vocabulary import build_tokenizer
    from specrt.runtime.families.unified.prompts import PromptEncoder

    encoder = PromptEncoder({"template": "{prompt}"}, cond_len=32, tokenizer=build_tokenizer())
    with pytest.raises(SpecrtError, match=r"prompt 1 \('zzz qqq'\): no word of it is known"):
        encoder.encode(["a seven", NONSENSE])
    with pytest.warns(SpecrtWarning, match="'zzz'"):
        encoder.encode(["a zzz seven"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecrtWarning)
        encoder.encode(["a thick seven"])  # every word known: silent
