"""The shipped continuous demo ("mar"): its weights load, the CLI exports and verifies it (the
tokenizer decoder included), and `specrt generate` makes images with ar and cspd from the demo
and from the exported bundle through its manifest alone. Kept to a few images: CI time is shared."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from tiny_export import cli_exit_code  # noqa: E402

from specrt.export.mar.demo import load_mar_demo  # noqa: E402
from specrt.export.mar.hooks import packaged_sampling_defaults, packaged_weights_dir  # noqa: E402


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("mar") / "bundle"
    assert cli_exit_code(["export", "--demo", "mar", "--out", str(out), "--verify"]) == 0
    return out


def test_the_packaged_weights_load_and_stay_small():
    demo = load_mar_demo()
    size = sum(p.stat().st_size for p in packaged_weights_dir().iterdir() if p.suffix == ".safetensors")
    assert size < 3e6
    assert demo.target.cfg.token_dim == demo.autoencoder.cfg.latent_channels == demo.draft.cfg.token_dim
    assert sum(p.numel() for p in demo.draft.parameters()) < sum(p.numel() for p in demo.target.parameters()) / 3
    assert packaged_sampling_defaults() == demo.sampling_defaults


def test_export_verifies_every_graph_with_the_decoder(demo_bundle, capsys):
    manifest = json.loads((demo_bundle / "manifest.json").read_text())
    assert manifest["family"] == "continuous" and manifest["decoder"]["graph"] == "decoder.onnx"
    assert manifest["sampling_defaults"] == packaged_sampling_defaults()
    assert cli_exit_code(["export", "--demo", "mar", "--out", str(demo_bundle)]) == 2  # exists: refused
    assert "already exists" in capsys.readouterr().err


def test_generate_from_the_demo_and_from_its_bundle(demo_bundle, tmp_path, capsys):
    from PIL import Image

    capsys.readouterr()
    # ar on the demo's PyTorch modules, cspd on its bundle through the manifest alone (onnxruntime)
    for argv, name in [(["--demo", "mar", "--method", "ar"], "ar"),
                       ([str(demo_bundle), "--method", "cspd", "--class", "7", "--param", "draft_len=3",
                         "--param", "cfg_schedule=linear"], "bundle")]:
        out = tmp_path / f"{name}.png"
        stats = tmp_path / f"{name}.json"
        assert cli_exit_code(["generate", *argv, "--out", str(out), "--stats", str(stats)]) == 0
        assert np.asarray(Image.open(out)).shape == (32, 32, 3)
        summary = json.loads(stats.read_text())
        assert summary["tokens"] == 64 and summary["method"] == argv[argv.index("--method") + 1]
        if summary["method"] == "cspd":
            assert summary["drafted"] > 0
    assert "cfg schedule linear" in capsys.readouterr().out  # the closing line names the schedule
    assert cli_exit_code(["generate", str(demo_bundle), "--method", "sd"]) == 2
    assert cli_exit_code(["generate", "--demo", "mar", "--top-k", "5"]) == 2
    assert "does not apply to a continuous" in capsys.readouterr().err


def test_training_code_path_on_a_tiny_subset(tmp_path):
    """`specrt demo train --demo mar`'s function with tiny models: trains, saves, loads back exactly."""
    import torch

    from specrt.export.demo.dataset import load_split
    from specrt.export.demo.pipeline import subset_split
    from specrt.export.mar.demo import train_mar_demo
    from specrt.models.mar.autoencoder import AEConfig
    from specrt.models.mar.model import MARConfig

    ae = AEConfig(latent_channels=2, ch=8, ch_mult=(1, 2, 2), z_channels=8, num_res_blocks=1, norm_groups=4)
    mar = MARConfig(token_dim=2, seq_len=64, dim=16, n_layer=1, n_head=2, head_width=16, head_depth=1, diffusion_steps=4)
    models = train_mar_demo(tmp_path, steps_scale=0.005, progress=False, split=subset_split(load_split(), 24, 8),
                            evaluate=False, configs=(ae, mar, mar))
    config = json.loads((tmp_path / "mar.json").read_text())
    assert config["autoencoder"]["scale_factor"] == models.autoencoder.cfg.scale_factor > 0
    assert config["dataset"]["encoded_sequences"] == 24 * 9
    loaded = load_mar_demo(tmp_path)
    tokens = torch.randn(1, 64, 2)
    with torch.no_grad():  # fp16 storage: what is saved is what was trained and measured
        assert torch.equal(loaded.autoencoder.decoder_only()(tokens), models.autoencoder.decoder_only()(tokens))
        past = loaded.target.transformer.empty_cache(1)
        args = (tokens[:, :3], torch.tensor([4]), torch.arange(3), *past)
        assert torch.equal(loaded.target.transformer.step(*args)[0], models.target.transformer.step(*args)[0])


def test_bench_measures_ar_and_cspd_on_a_continuous_bundle(demo_bundle, tmp_path, capsys):
    out, markdown = tmp_path / "bench.json", tmp_path / "bench.md"
    assert cli_exit_code(["bench", str(demo_bundle), "--images", "2", "--methods", "ar,cspd", "--sweep",
                          "cspd:draft_len=2", "--json", str(out), "--markdown", str(markdown), "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(printed) if line.startswith("setting "))  # the plain table
    assert set(printed[header + 1].replace(" ", "")) == {"-"} and not any(line.startswith("|") for line in printed)
    assert markdown.read_text().startswith("| setting | tokens / target pass |")  # Markdown only in the file
    rows = json.loads(out.read_text())["results"]
    assert [r["label"] for r in rows] == ["ar", "cspd(draft_len=2)"]
    assert rows[0]["tokens_per_target_pass"] == 1.0 and rows[1]["target_passes_per_image"] <= 64
    assert 0 <= rows[1]["quality"]["class_accuracy"] <= 1
    assert cli_exit_code(["bench", str(demo_bundle), "--methods", "sd"]) == 2
