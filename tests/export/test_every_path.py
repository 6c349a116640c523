"""One behaviour on every path: a LlamaGen-layout checkpoint with no draft, exported and run.

The vocabulary (4096) is above LlamaGen's c2i top-k (2000), so a path that forgot the family's
sampling defaults samples a different distribution and the token comparison catches it.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specrt.manifest import read_manifest
from specrt.models.llamagen_gpt import GPT, GPTConfig
from specrt.models.llamagen_vq import VQModel
from specrt.runtime.pipeline import Pipeline
from tiny_export import cli_exit_code, tiny_vq_config

VOCAB, CLASSES = 4096, 10
SIZES = ["--n-head", "1", "--image-size", "8"]  # VQ downsample 2 -> grid 4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A LlamaGen-layout target and VQ as torch pickles under 'model' (no draft: LlamaGen ships none)."""
    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    target = GPT(GPTConfig(dim=64, n_layer=1, n_head=1, vocab_size=VOCAB, num_classes=CLASSES, grid_size=4))
    vq = VQModel(tiny_vq_config(codebook_size=VOCAB, ch=32, norm_groups=32))
    for name, model in (("gpt.pt", target), ("vq.pt", vq)):
        torch.save({"model": model.state_dict()}, root / name)
    return root


@pytest.fixture(scope="module")
def bundle(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "bundle"
    code = cli_exit_code(["export", "--out", str(out), *SIZES, "--max-batch", "4",
                          "--neighbours", "4", "--threads", "1", "--target", str(checkpoints / "gpt.pt"),
                          "--vq", str(checkpoints / "vq.pt")])
    assert code == 0
    return out


def cli_tokens(argv: list[str], out) -> np.ndarray:
    """Run `specrt generate ARGV --save-tokens OUT` and read the tokens back."""
    assert cli_exit_code(["generate", *argv, "--out", str(out.with_suffix(".png")), "--save-tokens", str(out)]) == 0
    return np.load(out)


def torch_route(checkpoints) -> Pipeline:
    """What `specrt generate --target gpt.pt --vq vq.pt` builds."""
    from specrt.commands._checkpoint_flags import CheckpointFlags
    from specrt.commands._generate_flags import ModelFlags
    from specrt.commands.generate import build_pipeline

    return build_pipeline(None, ModelFlags(target=checkpoints / "gpt.pt", vq=checkpoints / "vq.pt"),
                          CheckpointFlags(n_head=1, image_size=8))


@pytest.mark.slow
def test_export_without_a_draft_writes_a_draftless_bundle_with_llamagen_defaults(bundle):
    manifest = read_manifest(bundle)
    assert sorted(manifest.graphs) == ["target_prefill", "target_step", "vq_decode"]
    assert "draft" not in manifest.models and manifest.models["target"]["vocab_size"] == VOCAB
    assert manifest.sampling_defaults == {"cfg_scale": 4.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}
    from specrt.runtime.families.llamagen.describe import format_manifest

    shown = format_manifest(manifest)  # what `specrt inspect` prints
    assert "cfg_scale 4.0, temperature 1.0, top_k 2000, top_p 1.0" in shown and "max_images 4" in shown


@pytest.mark.slow
def test_same_checkpoint_and_seed_give_the_same_tokens_on_pytorch_and_the_bundle(checkpoints, bundle):
    on_torch = torch_route(checkpoints)
    on_ort = Pipeline.from_bundle(bundle, threads=1)
    assert on_torch.sampling_defaults == on_ort.sampling_defaults
    for method in ("ar", "sjd"):
        a = on_torch.generate([3, 7], method=method, seed=5)
        b = on_ort.generate([3, 7], method=method, seed=5)
        np.testing.assert_array_equal(a.tokens, b.tokens)
    # the defaults decide the tokens: top-k 0 (the old PyTorch-route default) samples otherwise
    unfiltered = on_torch.generate([3, 7], method="ar", seed=5, top_k=0)
    assert not np.array_equal(unfiltered.tokens, on_torch.generate([3, 7], method="ar", seed=5).tokens)
    # an explicit flag overrides one key the same way on both
    np.testing.assert_array_equal(unfiltered.tokens, on_ort.generate([3, 7], method="ar", seed=5, top_k=0).tokens)


@pytest.mark.slow
def test_generate_cli_same_tokens_on_both_routes_with_threads_and_tokens_only(checkpoints, bundle, tmp_path):
    """No sampling flags, same seed: `generate --target/--vq` (PyTorch) and `generate BUNDLE`
    (onnxruntime) save the same tokens; --threads 1 is accepted on both; --tokens-only skips the
    decode and the PNG and saves the same tokens."""
    common = ["--class", "3", "--class", "7", "--seed", "5", "--threads", "1"]
    checkpoint_args = ["--target", str(checkpoints / "gpt.pt"), "--vq", str(checkpoints / "vq.pt"), *SIZES]
    on_torch = cli_tokens([*checkpoint_args, *common], tmp_path / "torch.npy")
    on_ort = cli_tokens([str(bundle), *common], tmp_path / "ort.npy")
    assert on_torch.shape == (2, 4, 4) and on_torch.dtype == np.int64
    np.testing.assert_array_equal(on_torch, on_ort)
    from PIL import Image

    for i in (0, 1):  # and the same pixels, up to a float rounding landing on a grey-level boundary
        a, b = (np.asarray(Image.open(tmp_path / f"{route}_{i}.png"), dtype=np.int16) for route in ("torch", "ort"))
        assert np.abs(a - b).max() <= 1

    only = tmp_path / "only"
    only.mkdir()  # specrt creates no parent folders (specrt.paths)
    assert cli_exit_code(["generate", str(bundle), *common, "--tokens-only", "--out", str(only / "img.png")]) == 0
    assert sorted(p.name for p in only.iterdir()) == ["img.npy"]  # tokens, no PNG
    np.testing.assert_array_equal(np.load(only / "img.npy"), on_ort)


@pytest.mark.slow
def test_decode_false_skips_the_vq_and_threads_mean_intra_op_threads(checkpoints, bundle):
    pipe = Pipeline.from_bundle(bundle, threads=1)
    full = pipe.generate([1], seed=2)
    pipe.vq.decode = lambda codes: pytest.fail("decode=False ran the VQ decoder")
    tokens_only = pipe.generate([1], seed=2, decode=False)
    assert tokens_only.images is None
    np.testing.assert_array_equal(tokens_only.tokens, full.tokens)
    previous = torch.get_num_threads()
    try:
        from specrt.commands._checkpoint_flags import CheckpointFlags
        from specrt.commands._generate_flags import ModelFlags, RunFlags
        from specrt.commands.generate import build_pipeline

        build_pipeline(None, ModelFlags(target=checkpoints / "gpt.pt", vq=checkpoints / "vq.pt"),
                       CheckpointFlags(n_head=1, image_size=8), RunFlags(threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
    from specrt.errors import SpecrtError

    with pytest.raises(SpecrtError, match="threads must be an integer"):
        Pipeline.from_bundle(bundle, threads=0)


@pytest.mark.slow
def test_max_batch_counts_images_under_cfg(bundle, tmp_path, capsys):
    """--max-batch 4: the manifest holds 4 images and 8 CFG rows; 5 images run in passes of 4 and 1."""
    manifest = read_manifest(bundle)
    assert manifest.limits["max_images"] == 4 and manifest.limits["max_batch"] == 8
    assert manifest.graph("target_step").profile["images"]["max"] == 4
    assert manifest.graph("target_step").profile["batch"]["max"] == 8
    four = [arg for c in range(4) for arg in ("--class", str(c))]
    assert cli_exit_code(["generate", str(bundle), *four, "--tokens-only", "--out", str(tmp_path / "x.png")]) == 0
    capsys.readouterr()
    assert cli_exit_code(["generate", str(bundle), *four, "--class", "4", "--tokens-only",
                          "--out", str(tmp_path / "y.png")]) == 0


@pytest.mark.slow
def test_draft_free_methods_run_on_the_bundle_and_drafted_ones_say_how_to_get_a_draft(bundle, tmp_path, capsys):
    stats = tmp_path / "s.json"
    for method in ("sjd", "sjd-pac"):
        assert cli_exit_code(["generate", str(bundle), "--method", method, "--param", "window=8", "--class", "3",
                              "--out", str(tmp_path / f"{method}.png"), "--stats", str(stats)]) == 0
        assert json.loads(stats.read_text())["tokens"] == 16
    capsys.readouterr()
    for method in ("sd", "cool-sd", "lantern"):
        assert cli_exit_code(["generate", str(bundle), "--method", method, "--out", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--draft" in err and "specrt export" in err


@pytest.mark.slow
def test_bench_on_a_draftless_bundle_measures_the_draft_free_methods(bundle, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli_exit_code(["bench", str(bundle), "--images", "2", "--threads", "1", "--no-progress", "--tokens",
                          "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    labels = [r["label"] for r in payload["results"]]
    # the default methods a bundle without a draft can run: sjd at each coupling, and auto's choice among them
    assert labels[:5] == ["ar", *(f"sjd(coupling={c})" for c in ("independent", "maximal", "gumbel")), "sjd-pac"]
    assert len(labels) == 6 and labels[5].startswith("auto:")
    for result in payload["results"]:  # --tokens: each image's [grid][grid] tokens
        assert np.asarray(result["tokens"]).shape == (2, 4, 4)
    assert payload["settings"]["sampling"]["top_k"] == 2000
    assert "draft-free methods only" in capsys.readouterr().err
    assert cli_exit_code(["bench", str(bundle), "--methods", "ar,sd", "--images", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sd need a draft model" in err and "--draft" in err


@pytest.mark.slow
def test_c_api_takes_its_threads_from_specrt_threads(bundle, monkeypatch):
    from specrt.errors import SpecrtError
    from specrt.runtime.embedding import open_pipeline

    monkeypatch.setenv("SPECRT_THREADS", "1")
    pipe = open_pipeline(str(bundle), None)
    assert pipe.target.step_session.get_session_options().intra_op_num_threads == 1
    monkeypatch.setenv("SPECRT_THREADS", "0")
    with pytest.raises(SpecrtError, match="SPECRT_THREADS must be an integer"):
        open_pipeline(str(bundle), None)
