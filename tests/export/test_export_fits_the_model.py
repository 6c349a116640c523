"""Export options are checked against the model they export: a default graph the model cannot
have (a tree wanting more children than the vocabulary has tokens) is left out with a note, a
value the user gave that cannot fit is one line, and a window longer than any method uses (it
sizes every KV buffer the runtime allocates) is refused before a graph is written."""
from __future__ import annotations

import pytest

from cli_helpers import one_line, run
from specrt.errors import SpecrtError
from specrt.export.bundle import ExportOptions, ModelSet, write_bundle
from specrt.models.llamagen_gpt import GPT
from specrt.models.llamagen_vq import VQModel
from specrt.runtime.methods import DEFAULT_MAX_WINDOW
from tiny_export import GRID, tiny_draft_config, tiny_target_config, tiny_vq_config


def small_vocab_models(vocab: int = 6) -> ModelSet:
    return ModelSet(target=GPT(tiny_target_config(vocab_size=vocab)).eval(),
                    draft=GPT(tiny_draft_config(vocab_size=vocab)).eval(),
                    vq=VQModel(tiny_vq_config(codebook_size=vocab)).eval(), sources={})


@pytest.mark.parametrize("vocab, left_out", [(6, ["draft_growth"]), (3, ["draft_growth", "draft_tree"])])
def test_default_trees_that_want_more_children_than_the_vocabulary_are_left_out_with_a_note(vocab, left_out):
    notes: list[str] = []
    fitted = ExportOptions().fitted(small_vocab_models(vocab).target.config, notes.append)
    assert (fitted.growth is None) and (fitted.tree_paths == []) == ("draft_tree" in left_out)
    assert [n.split(":")[0] for n in notes] == ["note"] * len(left_out)
    assert all(f"no {name} graph" in note and f"{vocab} tokens" in note for name, note in zip(left_out, notes))
    assert ExportOptions().fitted(tiny_target_config(vocab_size=96)) == ExportOptions()  # a larger vocabulary: unchanged


@pytest.mark.parametrize("options, message", [
    (dict(draft_growth="6,8"), "--draft-growth 6,8: top-k 8 is more than this model's 3 tokens"),
    (dict(draft_tree="mc_sim_7b_63", draft_growth=""), "--draft-tree mc_sim_7b_63: a node has 4 children"),
    (dict(max_window=100000), f"--max-window 100000: this model's images have {GRID * GRID} tokens"),
])
def test_values_the_model_cannot_hold_are_refused_before_any_graph(options, message, tmp_path):
    with pytest.raises(SpecrtError, match=message.replace("(", r"\(")):
        write_bundle(small_vocab_models(3), tmp_path / "b", ExportOptions(**options))
    assert list(tmp_path.iterdir()) == []


def test_the_longest_window_is_the_image_plus_one_or_the_default():
    config = tiny_target_config()  # 16 image tokens: the methods' default window still fits
    assert ExportOptions(max_window=DEFAULT_MAX_WINDOW).fitted(config).max_window == DEFAULT_MAX_WINDOW
    big = tiny_target_config(grid_size=16)  # 256 tokens: windows up to 257
    assert ExportOptions(max_window=257).fitted(big).max_window == 257
    with pytest.raises(SpecrtError, match="give at most 257"):
        ExportOptions(max_window=258).fitted(big)


def test_export_cli_refuses_a_window_no_method_uses(tmp_path, capsys):
    code, err = run(["export", "--out", str(tmp_path / "b"), "--max-window", "100000"], capsys)
    assert code == 2 and "--max-window 100000: this model's images have 64 tokens" in one_line(err)
    assert list(tmp_path.iterdir()) == []
