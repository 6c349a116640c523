"""specrt train-draft: a few steps write a head in LANTERN's layout that loads back; an
interrupted run resumes from its checkpoint to the weights of an uninterrupted one; user
mistakes are one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_export import cli_exit_code, tiny_target_config  # noqa: E402

from specrt.export.eagle import train  # noqa: E402
from specrt.export.eagle.checkpoint import load_eagle_head  # noqa: E402
from specrt.models.llamagen_gpt import GPT  # noqa: E402

RECIPE = train.Recipe(steps=4, batch_size=2, checkpoint_every=2, warmup=1, seed=3)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    target = GPT(tiny_target_config()).eval()
    rng = np.random.default_rng(0)
    data = train.TrainingData(rng.integers(0, target.config.vocab_size, (12, target.config.grid_size ** 2)),
                              rng.integers(0, target.config.num_classes, 12), "random tokens")
    return target, data


def test_an_interrupted_run_resumes_to_the_uninterrupted_weights(setup, tmp_path, monkeypatch):
    target, data = setup
    torch.set_num_threads(1)
    full, metrics = train.train_eagle_head(target, data, tmp_path / "full", RECIPE, progress=False)
    assert {"final_smooth_l1", "final_ce", "final_top1"} <= set(metrics)
    assert not (tmp_path / "full" / train.STATE_FILE).exists()  # removed once training ends

    loss, calls = train.eagle_loss, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the third step: after the checkpoint at step 2
            raise KeyboardInterrupt
        return loss(*args, **kwargs)

    monkeypatch.setattr(train, "eagle_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train.train_eagle_head(target, data, tmp_path / "cut", RECIPE, progress=False)
    assert (tmp_path / "cut" / train.STATE_FILE).is_file()
    monkeypatch.setattr(train, "eagle_loss", loss)
    resumed, _ = train.train_eagle_head(target, data, tmp_path / "cut", RECIPE, resume=True, progress=False)
    for key, value in full.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    loaded = load_eagle_head(tmp_path / "cut", target)  # what the exporter and from_torch read
    for key, value in full.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    config = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert config["hidden_size"] == target.config.dim and config["num_hidden_layers"] == 1


def test_resuming_with_other_settings_is_one_line(setup, tmp_path, monkeypatch):
    from specrt.errors import SpecrtError

    target, data = setup
    monkeypatch.setattr(train, "eagle_loss", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    (tmp_path / "o").mkdir()
    with pytest.raises(SpecrtError, match="--resume: .* not found"):
        train.train_eagle_head(target, data, tmp_path / "o", RECIPE, resume=True, progress=False)


def test_the_cli_trains_a_demo_head_and_refuses_mistakes_in_one_line(tmp_path, capsys):
    grid = 8  # the demo's
    np.save(tmp_path / "t.npy", np.random.default_rng(0).integers(0, 512, (6, grid * grid)))
    np.save(tmp_path / "l.npy", np.arange(6) % 10)
    out = tmp_path / "head"
    argv = ["train-draft", "--out", str(out), "--data", "tokens", "--tokens", str(tmp_path / "t.npy"),
            "--labels", str(tmp_path / "l.npy"), "--steps", "2", "--batch-size", "2", "--threads", "1", "--no-progress"]
    assert cli_exit_code(argv) == 0
    assert (out / "model.safetensors").is_file() and "wrote" in capsys.readouterr().out
    for bad in (["train-draft", "--out", str(tmp_path / "x"), "--data", "tokens"],
                ["train-draft", "--out", str(tmp_path / "y"), "--resume", "--data", "tokens", "--tokens",
                 str(tmp_path / "t.npy"), "--labels", str(tmp_path / "l.npy"), "--no-progress"],
                ["train-draft", "--out", str(tmp_path / "z"), "--steps", "0"],
                ["export", "--eagle", str(tmp_path / "missing"), "--out", str(tmp_path / "b")]):
        assert cli_exit_code(bad) == 2, bad
        err = capsys.readouterr().err.strip()
        assert err.startswith("specrt: error:") and "\n" not in err, err
