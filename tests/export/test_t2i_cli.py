"""`specrt generate` on a text-to-image bundle: --prompt (repeatable), --captions FILE, and
one-line refusals of class ids and missing captions."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from specrt.runtime.pipeline import Pipeline
from tiny_export import cli_exit_code
from tiny_t2i import t2i_bundle, t5_style_captions

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bundle():
    return t2i_bundle()[0].root


def test_generate_from_prompts(bundle, tmp_path):
    out = tmp_path / "img.png"
    argv = ["generate", str(bundle), "--prompt", "a thick seven", "--prompt", "a thin two", "--method", "sjd",
            "--seed", "2", "--out", str(out)]
    assert cli_exit_code(argv) == 0
    expected = Pipeline.from_bundle(bundle).generate(prompts=["a thick seven", "a thin two"], method="sjd", seed=2)
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / f"img_{i}.png")), expected.images[i])


def test_generate_from_a_caption_file(bundle, tmp_path):
    embeddings, mask = t5_style_captions([2, 5], seed=3)
    np.savez(tmp_path / "captions.npz", embeddings=embeddings, mask=mask)
    out = tmp_path / "cap.png"
    assert cli_exit_code(["generate", str(bundle), "--captions", str(tmp_path / "captions.npz"), "--out", str(out)]) == 0
    expected = Pipeline.from_bundle(bundle).generate(captions=(embeddings, mask))
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "cap_1.png")), expected.images[1])


@pytest.mark.parametrize("args,message", [
    (["--class", "3"], "text-to-image: give --prompt or --captions, not --class"),
    ([], "give --prompt"),
])
def test_user_mistakes_are_one_line(bundle, tmp_path, capsys, args, message):
    assert cli_exit_code(["generate", str(bundle), "--out", str(tmp_path / "x.png"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
