"""`specrt generate` on checkpoint files (torch backend): a PNG, stats, one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from specrt.cli import main

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from specrt.models.llamagen_gpt import GPT, GPTConfig
    from specrt.models.llamagen_vq import VQConfig, VQModel

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("ckpt")
    target = GPT(GPTConfig(dim=64, n_layer=2, n_head=1, vocab_size=64, num_classes=10, grid_size=4, initializer_range=0.2))
    draft = GPT(GPTConfig(dim=64, n_layer=1, n_head=1, vocab_size=64, num_classes=10, grid_size=4, initializer_range=0.2))
    vq = VQModel(VQConfig(codebook_size=64, ch=32, ch_mult=(1, 2), z_channels=32, codebook_show_usage=False))
    for name, model in (("t.pt", target), ("d.pt", draft), ("v.pt", vq)):
        torch.save({"model": model.state_dict()}, root / name)
    return root


# What the weights cannot say: heads of a custom size, and the image size (grid 4 x the VQ's 2).
SIZES = ["--n-head", "1", "--draft-n-head", "1", "--image-size", "8"]


def run(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr()


def test_generate_writes_png_and_stats(checkpoints, tmp_path, capsys):
    from PIL import Image

    args = ["generate", "--target", str(checkpoints / "t.pt"), "--draft", str(checkpoints / "d.pt"),
            "--vq", str(checkpoints / "v.pt"), *SIZES, "--method", "cool-sd", "--class", "3",
            "--seed", "0", "--out", str(tmp_path / "img.png"), "--stats", str(tmp_path / "s.json"),
            "--param", "relaxation_budget=2", "--param", "draft_len=3", "--cfg-scale", "2"]
    try:
        main(args)
    except SystemExit as exc:  # click may exit 0 after a successful command
        assert exc.code in (0, None)
    image = np.asarray(Image.open(tmp_path / "img.png"))
    assert image.shape == (8, 8, 3) and image.dtype == np.uint8
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["tokens"] == 16 and stats["target_forwards"] >= 16 / 4
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("extra,message", [
    (["--param", "relaxation_budget=0.5", "--method", "cool-sd"], "relaxation_budget"),
    (["--param", "bogus=1", "--method", "sd"], "no parameter bogus"),
    (["--param", "nokey", "--method", "sd"], "key=value"),
    (["--class", "10"], "out of range"),
    (["--method", "sjd", "--param", "window=65"], "at most 65"),  # L = 65 drafts + the pending token
])
def test_user_mistakes_exit_2_with_one_line(checkpoints, tmp_path, capsys, extra, message):
    code, out = run(["generate", "--target", str(checkpoints / "t.pt"), "--draft", str(checkpoints / "d.pt"),
                     "--vq", str(checkpoints / "v.pt"), *SIZES, "--out", str(tmp_path / "x.png"), *extra],
                    capsys)
    assert code == 2
    assert message in out.err and len(out.err.strip().splitlines()) == 1
