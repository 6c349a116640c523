"""generate's closing line has one shape for every model family (image count and size first,
the same counters, the sampling in the same words), and an explicit top-k the model's
vocabulary cannot hold is refused rather than echoed as something else."""
from __future__ import annotations

import re

import pytest

from cli_helpers import one_line, run

pytest.importorskip("torch")

LINE = re.compile(r"wrote (.+?)  \((\d+) images? (\d+)x(\d+), (\S+): \d+ tokens, \d+ target forwards, "
                  r"mean accepted length \d+\.\d\d, \d+\.\d\d s; sampling cfg [\d.]+, temperature [\d.]+"
                  r"(, top-k \d+, top-p [\d.]+|, cfg schedule \w+)\)")


@pytest.mark.parametrize("argv, images", [(["--class", "3", "--class", "4"], 2),
                                          (["--demo", "t2i", "--prompt", "a seven"], 1),
                                          (["--demo", "mar", "--class", "3"], 1),
                                          (["--demo", "chameleon", "--prompt", "a seven"], 1)])
def test_every_family_closes_with_the_same_line(argv, images, tmp_path, capsys):
    from specrt.cli import main

    main(["generate", *argv, "--out", str(tmp_path / "img.png")])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    match = LINE.fullmatch(out)
    assert match, out
    assert int(match.group(2)) == images == len(match.group(1).split(", "))
    assert (match.group(3), match.group(4)) == ("32", "32") and match.group(5) == "ar"
    assert "None" not in out


@pytest.mark.parametrize("argv", [[], ["--demo", "chameleon", "--prompt", "a seven"]])
def test_a_top_k_beyond_the_vocabulary_exits_2(argv, tmp_path, capsys):
    code, err = run(["generate", *argv, "--top-k", "999999", "--out", str(tmp_path / "img.png")], capsys)
    assert code == 2 and re.search(r"top_k \(0 disables it; this model has \d+ tokens\) must be an integer in "
                                   r"\[0, \d+\], got 999999", one_line(err))
    assert list(tmp_path.iterdir()) == []

