"""generate --num-images N makes N images of each class or prompt (image i of the call with seed +
i, the image that condition alone gives with that seed), bounded in one line; --sheet lays every
image of the call on one grid, a row per condition."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from cli_helpers import one_line, run
from specrt.commands._outputs import SHEET_GAP, save_sheet

pytest.importorskip("torch")


@pytest.fixture
def no_model_loads(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded although the flags should have been refused")

    from specrt.commands import generate

    monkeypatch.setattr(generate, "build_pipeline", loaded)


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_n_images_of_each_class_are_the_images_each_seed_gives_alone(tmp_path, capsys):
    code, err = run(["generate", "--class", "1", "--class", "7", "--num-images", "2", "--seed", "10",
                     "--out", str(tmp_path / "img.png"), "--save-tokens", str(tmp_path / "all.npy")], capsys)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.npy"] + [f"img_{i}.png" for i in range(4)]
    every = np.load(tmp_path / "all.npy")
    # classes 1, 1, 7, 7 with seeds 10..13
    for i, (label, seed) in enumerate([(1, 10), (1, 11), (7, 12), (7, 13)]):
        code, err = run(["generate", "--class", str(label), "--seed", str(seed), "--out", str(tmp_path / "alone.png"),
                         "--save-tokens", str(tmp_path / "alone.npy")], capsys)
        assert code == 0, err
        np.testing.assert_array_equal(every[i], np.load(tmp_path / "alone.npy")[0])
    assert not np.array_equal(every[0], every[1])  # two images of one class, not one image twice


def test_the_sheet_holds_every_image_a_row_per_class(tmp_path, capsys):
    code, err = run(["generate", "--class", "1", "--class", "7", "-n", "3", "--out", str(tmp_path / "img.png"),
                     "--sheet", str(tmp_path / "sheet.png")], capsys)
    assert code == 0, err
    sheet = Image.open(tmp_path / "sheet.png")
    assert sheet.format == "PNG"
    tile = 32 + SHEET_GAP
    assert sheet.size == (3 * tile + SHEET_GAP, 2 * tile + SHEET_GAP)  # 3 columns (n), 2 rows (classes)
    pixels = np.asarray(sheet.convert("RGB"))
    for i in range(6):
        row, column = divmod(i, 3)
        top, left = SHEET_GAP + row * tile, SHEET_GAP + column * tile
        np.testing.assert_array_equal(pixels[top:top + 32, left:left + 32], _pixels(tmp_path / f"img_{i}.png"))


def test_the_closing_line_names_a_long_run_by_its_ends(tmp_path, capsys):
    from specrt.cli import main

    main(["generate", "-n", "5", "--out", str(tmp_path / "img.png"), "--sheet", str(tmp_path / "s.png")])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"wrote {tmp_path / 'img_0.png'} ... {tmp_path / 'img_4.png'}, {tmp_path / 's.png'}  "
                           "(5 images 32x32, ar:"), line


def test_another_family_takes_num_images_too(tmp_path, capsys):
    code, err = run(["generate", "--demo", "mar", "--class", "3", "-n", "2", "--out", str(tmp_path / "m.png"),
                     "--save-tokens", str(tmp_path / "t.npy")], capsys)
    assert code == 0, err
    assert (tmp_path / "m_0.png").is_file() and (tmp_path / "m_1.png").is_file()
    assert np.load(tmp_path / "t.npy").shape[0] == 2


@pytest.mark.parametrize("argv, message", [
    (["-n", "0"], "--num-images must be an integer in [1, 1024], got 0"),
    (["-n", "2000"], "--num-images must be an integer in [1, 1024], got 2000"),
    (["-n", "600", "--class", "1", "--class", "2"], "--num-images 600 of 2 classes is 1200 images; one call makes "
                                                    "at most 1024"),
    (["--demo", "mar", "-n", "600", "--class", "1", "--class", "2"], "is 1200 images"),
    (["-n", "2", "--sheet", "{tmp}/img_1.png"], "is a name the images of --out"),
    (["--sheet", "{tmp}/img.png"], "is a name the images of --out"),
    (["--sheet", "{tmp}/s.gif"], "'.gif' is not an image type"),
    (["--sheet", "{tmp}/no/such/s.png"], "--sheet"),
    (["--tokens-only", "--sheet", "{tmp}/s.png"], "--tokens-only makes none"),
])
def test_bad_counts_and_sheets_are_one_line_before_any_model_loads(argv, message, tmp_path, capsys, no_model_loads):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, err = run(["generate", *argv, "--out", str(tmp_path / "img.png")], capsys)
    assert code == 2 and message in one_line(err), err
    assert list(tmp_path.iterdir()) == []


def test_a_sheet_too_large_shrinks_its_tiles_by_a_whole_factor(tmp_path, monkeypatch):
    from specrt.commands import _outputs

    monkeypatch.setattr(_outputs, "SHEET_MAX_SIDE", 64)
    images = np.full((4, 40, 40, 3), 200, dtype=np.uint8)
    save_sheet(images, tmp_path / "s.png", columns=2)
    sheet = Image.open(tmp_path / "s.png")
    assert max(sheet.size) <= 64 and sheet.size == (2 * (20 + SHEET_GAP) + SHEET_GAP,) * 2  # tiles 40 -> 20
