"""Unified-vocabulary bundles end to end: Hugging Face checkpoint directories (tiny random models
made with transformers' own classes, tests/export/unified_fixtures.py) -> `specrt export` ->
Pipeline.from_bundle on onnxruntime and the same modules on PyTorch -> every method.

What is checked here and not at the module level (test_unified_model.py): the CLI route picks
the architecture from config.json, the bundle's prompt recipe builds the unconditional row the
model's own generate builds, greedy CFG generation through the whole pipeline (recipe, left
padding, graphs, head, host argmax) is token-identical to transformers' generate, the grammar's
row ends come out where Emu3 puts them and the grid comes back without them, onnxruntime and
PyTorch give the same images from the same seed, and every method runs on the bundle.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from unified_fixtures import tiny_chameleon, tiny_emu3, tiny_janus, one_torch_thread  # noqa: F401 (autouse)
from cli_helpers import exit_code
from specrt.runtime.pipeline import Pipeline

pytest.importorskip("transformers")
MAX_WINDOW = 12
PROMPT_TOKENS = 40  # Emu3's unconditional row is its long negative prompt


def _export(args: list[str]) -> None:
    assert exit_code("export", *args, "--max-window", MAX_WINDOW, "--max-batch", 4, "--max-prompt-tokens", PROMPT_TOKENS) == 0


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """(checkpoint dir, bundle dir) per architecture; Emu3's with itself as the draft (sd runs)."""
    root = tmp_path_factory.mktemp("unified")
    out = {}
    # Emu3 picks its grid per bundle: 3 rows of 4 + row ends; its draft grows dynamic trees of depth 3, top-k 2 in one
    # call (no chain graph: no test here reads it, and it is the slowest export)
    emu3 = ["--draft", str(root / "emu3"), "--grid", "3x4", "--draft-growth", "3,2", "--draft-chain", "0"]
    for name, make, extra in (("janus", tiny_janus, []), ("emu3", tiny_emu3, emu3)):
        checkpoint = make(root / name)
        _export(["--target", str(checkpoint), *extra, "--out", str(root / f"{name}-bundle")])
        out[name] = (checkpoint, root / f"{name}-bundle")
    return out


def test_the_manifest_names_the_family_and_the_grammar(bundles):
    manifest = json.loads((bundles["emu3"][1] / "manifest.json").read_text())
    target = manifest["models"]["target"]
    assert manifest["family"] == "unified" and target["architecture"] == "emu3"
    assert target["row_end"] is True and target["stream_len"] == target["grid_size"] * (target["grid_cols"] + 1)
    assert manifest["prompt"]["tokenizer"] == "tokenizer.json" and (bundles["emu3"][1] / "tokenizer.json").is_file()
    janus = json.loads((bundles["janus"][1] / "manifest.json").read_text())
    assert janus["models"]["target"]["row_end"] is False and janus["prompt"]["uncond"]["kind"] == "pad"


def _reference_greedy(arch: str, checkpoint: Path, pipe, cond: list[int], scale: float) -> list[int]:
    """transformers' own greedy CFG generation of one image, as head indices."""
    import transformers

    grammar = pipe.grammar
    prompt = torch.tensor([cond])
    if arch == "janus":
        model = transformers.JanusForConditionalGeneration.from_pretrained(str(checkpoint)).eval()
        with torch.no_grad():
            return model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_mode="image",
                                  guidance_scale=scale, do_sample=False)[0].tolist()
    from specrt.export.unified import read_config

    config = read_config(checkpoint, grid=(grammar.rows, grammar.cols))
    model = transformers.Emu3ForConditionalGeneration.from_pretrained(str(checkpoint)).eval()
    forced, image_ids = grammar.forced(), list(config.image_token_ids)

    def allowed(_batch, sequence):
        return [config.row_end_id] if forced[sequence.shape[-1] - len(cond)] >= 0 else image_ids

    uncond = pipe.prompts.null_ids(cond)  # the recipe's negative prompt, as the bundle builds it
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=grammar.stream_len,
                             do_sample=False, guidance_scale=scale, negative_prompt_ids=torch.tensor([uncond]),
                             prefix_allowed_tokens_fn=allowed, pad_token_id=config.pad_id)[0, len(cond):]
    to_head = {int(i): h for h, i in enumerate([*image_ids, config.row_end_id])}
    return [to_head[int(t)] for t in out]


@pytest.mark.parametrize("arch", ["janus", "emu3"])
def test_greedy_cfg_through_the_bundle_equals_transformers_generate(bundles, arch):
    checkpoint, bundle = bundles[arch]
    pipe = Pipeline.from_bundle(bundle)
    cond = pipe.prompts.ids("a thin two")
    expected = _reference_greedy(arch, checkpoint, pipe, cond, scale=3.0)
    for method, params in (("ar", {}), ("sjd", {"window": 4})):  # lossless at T = 0: the same greedy tokens
        result = pipe.generate(prompt_ids=[cond], method=method, temperature=0, cfg_scale=3.0, **params)
        assert result.stream[0].tolist() == expected, method
    assert np.array_equal(result.tokens[0], pipe.grammar.grid(np.array(expected)))


def test_row_ends_where_the_model_puts_them(bundles):
    pipe = Pipeline.from_bundle(bundles["emu3"][1])
    result = pipe.generate(prompts=["a thin two", "one"], method="sd", seed=1, draft_len=3)
    grammar = pipe.grammar
    assert grammar.is_valid(result.stream).all()
    assert (result.stream[:, grammar.cols::grammar.row_len] == grammar.row_end_index).all()
    assert result.tokens.shape == (2, grammar.rows, grammar.cols) and result.tokens.max() < grammar.image_vocab
    assert result.images.shape == (2, *pipe.image_size, 3)


@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 4}), ("cool-sd", {"relaxation_budget": 2.0}),
                                           ("lantern", {"tvd_budget": 0.3}), ("sjd", {"window": 6}),
                                           ("sjd-pac", {"window": 8, "branching": 2}),
                                           ("sd", {"tree": "dynamic", "total_tokens": 8, "depth": 3, "tree_top_k": 2})])
def test_every_method_runs_on_the_bundle(bundles, method, params):
    pipe = Pipeline.from_bundle(bundles["emu3"][1])
    result = pipe.generate(prompts=["a thin two", "a thick one", "seven"], method=method, seed=0, **params)
    assert pipe.grammar.is_valid(result.stream).all()
    assert result.stats.tokens == 3 * pipe.grammar.stream_len


def test_a_dynamic_tree_grown_in_one_call_gives_the_per_pass_tokens(bundles):
    """Forced row ends are point-mass rows: the growth graph ranks them as the host does."""
    pipe = Pipeline.from_bundle(bundles["emu3"][1])
    settings = dict(prompts=["a thin two", "a thick one", "seven"], method="sd", seed=4, tree="dynamic",
                    total_tokens=8, depth=3, tree_top_k=2, decode=False)
    fused = pipe.generate(**settings)
    calls = pipe.draft.forwards
    per_pass = pipe.generate(**settings, fused_drafting=False)
    assert calls < 0.6 * pipe.draft.forwards
    np.testing.assert_array_equal(fused.stream, per_pass.stream)
    assert pipe.grammar.is_valid(fused.stream).all()


def test_onnxruntime_and_pytorch_give_the_same_images(bundles):
    from specrt.export.unified.sources import unified_models
    from specrt.runtime.families.unified.pipeline import UnifiedPipeline

    checkpoint, bundle = bundles["janus"]
    on_ort = Pipeline.from_bundle(bundle)
    models = unified_models(checkpoint, cond_len=PROMPT_TOKENS)
    on_torch = UnifiedPipeline.from_torch(models.target, None, models.vq, prompts=on_ort.prompts,
                                          max_window=MAX_WINDOW, sampling_defaults=models.sampling_defaults)
    for method, params in (("ar", {}), ("sjd", {"window": 4})):
        a = on_ort.generate(prompts=["a thin two", "seven"], method=method, seed=5, **params)
        b = on_torch.generate(prompts=["a thin two", "seven"], method=method, seed=5, **params)
        assert np.array_equal(a.tokens, b.tokens), method
        assert np.abs(a.images.astype(int) - b.images.astype(int)).max() <= 1


def test_cli_generate_and_inspect(bundles, tmp_path, capsys):
    bundle = bundles["emu3"][1]
    assert exit_code("generate", bundle, "--prompt", "a thin two", "--method", "sd", "--out", tmp_path / "a.png",
                "--save-tokens", tmp_path / "t.npy") == 0
    assert (tmp_path / "a.png").is_file() and np.load(tmp_path / "t.npy").ndim == 3
    capsys.readouterr()
    assert exit_code("generate", bundle, "--class", "3") == 2
    assert "--class does not apply" in capsys.readouterr().err
    assert exit_code("generate", bundle) == 2
    assert "give --prompt" in capsys.readouterr().err
    assert exit_code("inspect", bundle) == 0
    assert "a row-end token after every row" in capsys.readouterr().out


def test_a_prompt_longer_than_the_bundle_takes_is_one_line(bundles):
    pipe = Pipeline.from_bundle(bundles["janus"][1])
    with pytest.raises(Exception, match=f"reads at most {PROMPT_TOKENS}"):
        pipe.generate(prompts=["two " * 40])


def test_an_unsupported_architecture_is_one_line(tmp_path, capsys):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    assert exit_code("export", "--target", folder, "--out", tmp_path / "b") == 2
    err = capsys.readouterr().err
    assert "unsupported architecture" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


def test_served_and_embedded_like_any_prompt_model(bundles):
    """Triton's request handler and the C API's Python side take the bundle through its family:
    prompts served row by row (a class id refused alone), RGB pixels from prompts."""
    from specrt.runtime import embedding
    from specrt.runtime.serving.handler import RequestHandler

    pipe = Pipeline.from_bundle(bundles["emu3"][1])
    handler = RequestHandler(pipe)
    assert handler.family.name == "unified"
    served, refused = handler([{"prompt": np.array([[b"a thin two"], [b"one"]], dtype=object),
                                "method": np.array([[b"sjd"], [b"ar"]], dtype=object),
                                "params": np.array([[b'{"window": 4}'], [b"{}"]], dtype=object)},
                               {"class_id": np.array([[3]])}])
    assert served["tokens"].shape == (2, pipe.grammar.rows * pipe.grammar.cols)
    assert [e for e in served["error"].ravel()] == [b"", b""] and len(served["image"][0, 0]) > 0
    assert b"give prompt, not class_id" in refused["error"][0, 0]
    handle = embedding.open_handle(str(bundles["emu3"][1]), None)
    assert handle.info[0] == "unified" and handle.info[3:] == pipe.image_size
    pixels, stats = embedding.generate_rgb8_prompts(handle, [b"a thin two"], "ar", None, 0)[:2]
    assert len(pixels) == pipe.image_size[0] * pipe.image_size[1] * 3 and stats["tokens"] == pipe.grammar.stream_len


def test_a_chameleon_checkpoint_without_its_vqgan_exports_tokens_only(tmp_path, capsys):
    """transformers' Chameleon weights carry no image decoder (Lumina-mGPT decodes with Chameleon's
    VQGAN, vqgan.ckpt + vqgan.yaml): without them the export says so and writes a tokens-only
    bundle that generates streams with the row ends in place; asking it for images is one line."""
    checkpoint = tiny_chameleon(tmp_path / "chameleon")
    bundle = tmp_path / "bundle"
    assert exit_code("export", "--target", checkpoint, "--grid", "2x4", "--out", bundle, "--max-window", MAX_WINDOW,
                "--max-batch", 2, "--max-prompt-tokens", PROMPT_TOKENS) == 0
    assert "tokens-only bundle" in capsys.readouterr().out
    pipe = Pipeline.from_bundle(bundle)
    result = pipe.generate(prompts=["a thin two"], method="sjd", window=4, decode=False)
    assert result.images is None and pipe.grammar.is_valid(result.stream).all()
    assert exit_code("generate", bundle, "--prompt", "a thin two", "--tokens-only", "--out", tmp_path / "t.npy") == 0
    assert np.load(tmp_path / "t.npy").shape == (1, 2, 4)
    capsys.readouterr()
    assert exit_code("generate", bundle, "--prompt", "a thin two", "--out", tmp_path / "a.png") == 2
    assert "no image decoder" in capsys.readouterr().err


def test_generate_runs_a_checkpoint_directory_on_pytorch_as_its_bundle(bundles, tmp_path):
    """`specrt generate --target HF_DIR` (PyTorch, no export) gives the tokens the exported bundle gives."""
    checkpoint, bundle = bundles["janus"]
    for source, name in ((["--target", checkpoint, "--max-window", MAX_WINDOW], "torch"), ([bundle], "ort")):
        assert exit_code("generate", *source, "--prompt", "a thin two", "--method", "sjd", "--param", "window=4",
                         "--tokens-only", "--save-tokens", tmp_path / f"{name}.npy", "--seed", 3) == 0
    assert np.array_equal(np.load(tmp_path / "torch.npy"), np.load(tmp_path / "ort.npy"))


@pytest.mark.parametrize("bad,message", [([[1, 5, 99999]], r"prompt_ids\[0\]\[2\] must be an integer in \[0, "),
                                         ([[1, -2]], r"prompt_ids\[0\]\[1\] must be"), ([[1.5, 2]], "must be an integer"),
                                         ("abc", "prompt_ids must be a list"), (7, "prompt_ids must be a list")])
def test_prompt_ids_are_checked_against_the_vocabulary(bundles, bad, message):
    from specrt.errors import SpecrtError

    with pytest.raises(SpecrtError, match=message):
        Pipeline.from_bundle(bundles["janus"][1]).generate(prompt_ids=bad)
