"""generate's outputs appear whole or not at all (temporary name + rename)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from specrt.commands._outputs import image_output, save_images, save_tokens
from specrt.errors import SpecrtError


def test_outputs_are_written_whole(tmp_path):
    images = np.zeros((2, 4, 4, 3), dtype=np.uint8)
    paths = save_images(images, tmp_path / "img.png", 2)
    assert [p.name for p in paths] == ["img_0.png", "img_1.png"] and all(p.is_file() for p in paths)
    save_tokens(np.arange(6).reshape(1, 2, 3), tmp_path / "t.tokens")
    assert np.load(tmp_path / "t.tokens").dtype == np.int64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img_0.png", "img_1.png", "t.tokens"]


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    from PIL import Image

    def fail(self, fp, *args, **kwargs):
        with open(fp, "wb") as f:
            f.write(b"half a png")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", fail)
    with pytest.raises(OSError, match="disk full"):
        save_images(np.zeros((1, 4, 4, 3), dtype=np.uint8), tmp_path / "img.png", 1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, magic", [("a.jpg", b"\xff\xd8\xff"), ("a.JPEG", b"\xff\xd8\xff"),
                                         ("a.png", b"\x89PNG"), ("a.webp", b"RIFF"), ("a.bmp", b"BM")])
def test_each_image_is_written_in_the_type_its_suffix_names(tmp_path, name, magic):
    images = np.full((2, 4, 4, 3), 200, dtype=np.uint8)
    for count in (1, 2):
        for path in save_images(images[:count], tmp_path / name, count):
            assert path.read_bytes().startswith(magic), path


def test_out_without_a_suffix_gets_png_and_an_unknown_suffix_is_refused(tmp_path):
    assert image_output(tmp_path / "noext") == tmp_path / "noext.png"
    assert image_output(tmp_path / "a.jpg") == tmp_path / "a.jpg"
    for bad in ("a.foo", "a.gif", "a.npy"):
        with pytest.raises(SpecrtError, match=r"is not an image type specrt writes; use one of .png, .jpg"):
            image_output(tmp_path / bad)


# ---- names that are no file, a dot with no type, modes -------------------------------------------


@pytest.mark.parametrize("argv", [["--out", ""], ["--sheet", ""], ["--tokens-only", "--out", ""], ["--out", " "],
                                  ["--stats", ""], ["--save-tokens", ""]])
def test_an_empty_output_name_is_one_line_before_any_model_loads(argv, tmp_path, capsys, monkeypatch):
    from cli_helpers import one_line, run
    from specrt.commands import generate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(generate, "build_pipeline", lambda *a, **k: pytest.fail("a model loaded"))
    code, err = run(["generate", *argv], capsys)
    assert code == 2 and "names no file or folder" in one_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["export", "--eagle", ""], ["export", "--draft-tree", " "],
                                  ["bench", "--serve", "--serve-url", ""]])
def test_an_empty_name_on_a_text_flag_is_one_line_not_the_default(argv, tmp_path, capsys, monkeypatch):
    """--eagle "" once read as "no EAGLE head" and went on: an unset variable must not pick the default."""
    from cli_helpers import one_line, run

    monkeypatch.chdir(tmp_path)
    code, err = run([*argv, "--out", str(tmp_path / "o")] if argv[0] == "export" else argv, capsys)
    assert code == 2 and "names nothing" in one_line(err) and argv[-2] in one_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["", " ", ".", "..", "sub/", "./"])
def test_the_python_api_refuses_names_that_are_no_file(name, tmp_path, monkeypatch):
    from specrt.paths import output_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(SpecrtError, match="names no file or folder|names a folder|is a folder"):
        output_file("--out", name)
    if name != "sub/":  # a Path has lost the slash: sub.png is a fine name
        with pytest.raises(SpecrtError, match="names no file or folder|names a folder"):
            image_output(Path(name) if name.strip() else name)


def test_a_trailing_dot_is_no_second_dot(tmp_path):
    from specrt.commands._outputs import tokens_output

    assert image_output(tmp_path / "x.") == tmp_path / "x.png"  # not x..png
    assert image_output(tmp_path / "x..") == tmp_path / "x.png"
    assert tokens_output(tmp_path / "x.") == tmp_path / "x.npy"
    assert tokens_output(tmp_path / "x.png") == tmp_path / "x.npy"


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_every_output_writer_gives_the_mode_open_gives(tmp_path):
    """0666 less the umask, as a file made with open() (tempfile.mkstemp's 0600 was what the bench's
    JSON and plot got); checked under umask 022 and 002."""
    from specrt.bench.report import MethodResult, write_json, write_plot
    from specrt.runtime.tree_plan import TreePlan
    from specrt.runtime.tree_plan_file import write_plan

    result = MethodResult(method="ar", params={}, label="ar", images=1, mean_accepted_length=1.0,
                          target_forwards_per_image=4.0, draft_forwards_per_image=0.0, latency_s={"median": 0.1},
                          speedup_vs_ar=1.0, breakdown_s={})
    for umask in (0o022, 0o002):
        previous = os.umask(umask)
        try:
            folder = tmp_path / f"u{umask:o}"
            folder.mkdir()
            with open(folder / "plain.txt", "w") as handle:
                handle.write("x")
            written = [*save_images(np.zeros((1, 4, 4, 3), np.uint8), folder / "img.png", 1),
                       save_tokens(np.zeros((1, 2, 2)), folder / "t.npy")]
            write_json(str(folder / "b.json"), {"results": []})
            write_plot(str(folder / "b.png"), [result], "title")
            written += [folder / "b.json", folder / "b.png", write_plan(folder / "plan.json", TreePlan([(0,)], [0.5]))]
        finally:
            os.umask(previous)
        assert _mode(folder / "plain.txt") == 0o666 & ~umask
        assert {p.name: _mode(p) for p in written} == {p.name: 0o666 & ~umask for p in written}
        assert sorted(p.name for p in folder.iterdir()) == sorted(["plain.txt", *(p.name for p in written)])
