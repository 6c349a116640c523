"""generate's outputs appear whole or not at all (temporary name + rename)."""
from __future__ import annotations

import numpy as np
import pytest

from specrt.commands._outputs import save_images, save_tokens


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
