"""`specrt generate` on a text-to-image bundle: --prompt (repeatable), --captions FILE, and
one-line refusals of class ids and missing captions."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from specrt.runtime.pipeline import Pipeline
from tiny_export import NO_METHOD_GRAPHS, cli_exit_code
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


def test_export_cli_with_a_text_encoder_takes_prompts_like_the_torch_route(tmp_path):
    """`specrt export --target --draft --vq --text-encoder` from LlamaGen-layout t2i checkpoints:
    the bundle's own text encoder and GPTs give the tokens the same checkpoints give on PyTorch
    with the same T5 directory (sd: target and draft both on the line)."""
    import torch

    from specrt.export.sources import GPTChoice, checkpoint_models
    from specrt.models.llamagen_vq import VQConfig, VQModel
    from specrt.runtime.text import T5TextEncoder
    from tiny_export import GRID, VOCAB
    from tiny_t2i import t2i_checkpoints, t5_directory

    torch.manual_seed(0)
    vq = tmp_path / "vq.pt"  # 32 GroupNorm groups (the loader's assumption), downsampling ×2
    torch.save({"model": VQModel(VQConfig(codebook_size=VOCAB, codebook_embed_dim=4, ch=32, ch_mult=(1, 2),
                                          z_channels=32, num_res_blocks=1)).state_dict()}, vq)
    ckpt, t5, out = t2i_checkpoints(), t5_directory(), tmp_path / "bundle"
    flags = ["--n-head", "4", "--draft-n-head", "2", "--image-size", str(2 * GRID)]
    assert cli_exit_code(["export", "--out", str(out), "--target", str(ckpt["target"]), "--draft", str(ckpt["draft"]),
                          "--vq", str(vq), "--text-encoder", str(t5), "--max-batch", "2", *flags,
                          *NO_METHOD_GRAPHS]) == 0
    tokens = tmp_path / "tokens.npy"
    prompts = ["a thick slanted seven", "the nine"]
    argv = ["generate", str(out), "--method", "sd", "--seed", "4", "--save-tokens", str(tokens), "--tokens-only"]
    assert cli_exit_code(argv + [arg for p in prompts for arg in ("--prompt", p)]) == 0
    models = checkpoint_models(ckpt["target"], ckpt["draft"], vq, GPTChoice(n_head=4),
                               GPTChoice(n_head=2, flag_prefix="draft-"), image_size=2 * GRID)
    expected = Pipeline.from_torch(models.target, models.draft, models.vq,
                                   text_encoder=T5TextEncoder(t5, max_length=models.target.config.cond_len))
    np.testing.assert_array_equal(np.load(tokens), expected.generate(prompts=prompts, method="sd", seed=4).tokens)
