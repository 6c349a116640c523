"""Sampling defaults per model family (specrt.runtime.defaults) and how flags override them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from specrt.errors import SpecrtError
from specrt.runtime.defaults import defaults_of, describe, family_defaults
from specrt.runtime.sampling import SamplingParams


def gpt(model_type: str, **attributes) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(model_type=model_type), **attributes)


def test_llamagen_families_as_their_sample_scripts_set_them():
    assert defaults_of(gpt("c2i")) == SamplingParams(cfg_scale=4.0, temperature=1.0, top_k=2000, top_p=1.0)
    assert defaults_of(gpt("t2i")) == SamplingParams(cfg_scale=7.5, temperature=1.0, top_k=1000, top_p=1.0)
    with pytest.raises(SpecrtError, match="known: llamagen-c2i"):
        family_defaults("mar")


def test_a_models_own_defaults_win_over_its_family():
    own = SamplingParams(cfg_scale=2.0, top_k=0)
    assert defaults_of(gpt("c2i", sampling_defaults=own)) is own
    assert describe(own) == "cfg 2, temperature 1, top-k 0, top-p 1"


def test_top_k_that_keeps_the_whole_vocabulary_is_no_filter():
    assert SamplingParams(top_k=2000).for_vocab(512).top_k == 0
    assert SamplingParams(top_k=2000).for_vocab(4096).top_k == 2000


def test_generate_help_shows_the_defaults_that_apply():
    from click.testing import CliRunner

    from specrt.cli import cli

    out = CliRunner().invoke(cli, ["generate", "--help"], terminal_width=200).output
    assert "--target llamagen-c2i: cfg 4, temperature 1, top-k 2000, top-p 1 (LlamaGen sample_c2i.py)" in out
    assert "--target llamagen-t2i: cfg 7.5, temperature 1, top-k 1000, top-p 1 (LlamaGen sample_t2i.py)" in out
    assert "--demo c2i: cfg 2, temperature 1, top-k 0, top-p 1" in out
    assert "--demo mar: cfg 2, temperature 1, cfg schedule constant" in out
    assert "--threads" in out and "--tokens-only" in out and "--save-tokens" in out
