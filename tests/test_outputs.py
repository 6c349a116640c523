"""generate's outputs appear whole or not at all (temporary name + rename)."""
from __future__ import annotations

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
