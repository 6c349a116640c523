"""LlamaGen-layout checkpoints at sizes the loaders cannot guess, through the CLI as a user runs it.

The target has dim 128 with 4 heads of 32 and 2 kv heads (a head_dim-64 guess would read 2
heads and give wrong logits silently); the VQ downsamples ×8 (VQ-8's ch_mult), so the grid is
image size ÷ 8, not ÷ 16. Greedy tokens and pixels must equal the independent reference route
(tests/export/llamagen_reference.py: LlamaGen's forward and VQ decode written from the state
dicts), or the command must stop with one line naming the missing flag.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch

from specrt.errors import SpecrtError
from specrt.models.llamagen_vq import VQConfig, VQModel
from specrt.runtime.pipeline import Pipeline, to_uint8

from llamagen_reference import ReferenceLlamaGen, llamagen_gpt_shapes, random_state_dict, reference_vq_decode
from tiny_export import NO_METHOD_GRAPHS, cli_exit_code

VOCAB, CLASSES, GRID, DOWNSAMPLE = 64, 5, 4, 8
IMAGE = GRID * DOWNSAMPLE
TARGET = dict(dim=128, n_layer=2, n_head=4, n_kv_head=2)
DRAFT = dict(dim=64, n_layer=1, n_head=2, n_kv_head=2)
VQ8 = VQConfig(codebook_size=VOCAB, codebook_embed_dim=8, ch=32, ch_mult=(1, 2, 2, 4), z_channels=32)
CFG = 2.0


def _gpt_state(seed: int, **shape) -> dict[str, torch.Tensor]:
    return random_state_dict(llamagen_gpt_shapes(vocab_size=VOCAB, num_classes=CLASSES, **shape), seed=seed)


def _vq_state() -> dict[str, torch.Tensor]:
    """VQ-8 layout, every parameter perturbed so no GroupNorm or conv is an identity."""
    torch.manual_seed(0)
    model = VQModel(VQ8)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen) if name.endswith("weight")
                        else 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.state_dict()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """LlamaGen-style files: weights under "model", names without a resolution."""
    torch.set_num_threads(1)  # tiny models: more threads only spin on a busy machine
    root = tmp_path_factory.mktemp("llamagen")
    states = {"gpt": _gpt_state(0, **TARGET), "draft": _gpt_state(1, **DRAFT), "vq": _vq_state(),
              "t2i": random_state_dict(llamagen_gpt_shapes(vocab_size=VOCAB, model_type="t2i", caption_dim=32,
                                                           cond_len=7, **TARGET))}
    paths = {}
    for name, state in states.items():
        paths[name] = root / f"{name}.pt"
        torch.save({"model": state, "args": None}, paths[name])
    return paths, states


def reference_route(target_state, vq_state, class_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [GRID, GRID], uint8 pixels [IMAGE, IMAGE, 3]) of greedy CFG decoding as LlamaGen does it."""
    ref = ReferenceLlamaGen(target_state, TARGET["n_head"], TARGET["n_kv_head"], GRID, cond_len=1)
    n = GRID * GRID
    ref.setup_caches(2, 1 + n)
    with torch.no_grad():
        logits = ref.forward(cond=torch.tensor([class_id, CLASSES]), input_pos=torch.arange(1))[:, -1]
        tokens = []
        for i in range(n):
            cond, uncond = logits[0], logits[1]
            tokens.append(int(torch.argmax(uncond + (cond - uncond) * CFG)))
            if len(tokens) < n:
                logits = ref.forward(idx=torch.tensor([[tokens[-1]]] * 2), input_pos=torch.tensor([1 + i]))[:, -1]
        codes = torch.tensor(tokens).reshape(1, GRID, GRID)
        image = reference_vq_decode(vq_state, codes, levels=len(VQ8.ch_mult), res_per_level=VQ8.num_res_blocks + 1)
    return codes[0].numpy(), to_uint8(image.numpy())[0]


@pytest.fixture
def spy(monkeypatch):
    """Records the tokens of every Pipeline.generate the CLI runs (behaviour unchanged)."""
    seen = []
    original = Pipeline.generate

    def generate(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        seen.append(result.tokens)
        return result

    monkeypatch.setattr(Pipeline, "generate", generate)
    return seen


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrt: error:") and "\n" not in err, err
    return err


def test_generate_reads_heads_and_the_vq_downsampling_and_matches_the_reference(files, tmp_path, spy):
    from PIL import Image

    paths, states = files
    out = tmp_path / "img.png"
    argv = ["generate", "--target", str(paths["gpt"]), "--vq", str(paths["vq"]), "--n-head", "4",
            "--image-size", str(IMAGE), "--class", "3", "--temperature", "0", "--cfg-scale", str(CFG), "--out", str(out)]
    assert cli_exit_code(argv) == 0
    tokens, pixels = reference_route(states["gpt"], states["vq"], class_id=3)
    np.testing.assert_array_equal(spy[-1][0], tokens)
    image = np.asarray(Image.open(out))
    assert image.shape == (IMAGE, IMAGE, 3)  # grid 32 / 8 = 4, not 32 / 16 = 2
    assert np.abs(image.astype(int) - pixels.astype(int)).max() <= 1  # fp32 rounding at a uint8 boundary at most

    # The kv heads may be given instead of the heads (the weights then fix the rest); sd with
    # the draft is lossless at temperature 0, so it lands on the same tokens.
    spy.clear()
    argv = ["generate", "--target", str(paths["gpt"]), "--vq", str(paths["vq"]), "--n-kv-head", "2",
            "--draft", str(paths["draft"]), "--draft-n-head", "2", "--method", "sd", "--image-size", str(IMAGE),
            "--class", "3", "--temperature", "0", "--cfg-scale", str(CFG), "--out", str(out)]
    assert cli_exit_code(argv) == 0
    np.testing.assert_array_equal(spy[-1][0], tokens)


@pytest.mark.parametrize("change,message", [
    ({"--n-head": None}, "head count is not in the weights and dim 128 with 2 layers is no named LlamaGen size: "
                         "give --n-head"),
    ({"--draft": "draft", "--draft-n-head": None}, "give --draft-n-head"),
    ({"--n-head": "3"}, "--n-head 3 does not fit the weights"),
    ({"--n-kv-head": "4"}, "--n-kv-head 4 disagrees with the weights"),
    ({"--image-size": None}, "give --image-size"),
    ({"--image-size": "36"}, "multiple of the VQ's downsampling 8, got 36"),
    ({"--arch": "GPT-B", "--n-head": None}, "does not fit GPT-B"),
    ({"--vq-arch": "VQ-16"}, "does not fit VQ"),
])
@pytest.mark.parametrize("command", ["generate", "export"])
def test_what_the_weights_cannot_say_is_asked_for_in_one_line(files, tmp_path, capsys, command, change, message):
    paths, _ = files
    flags = {"--target": "gpt", "--vq": "vq", "--n-head": "4", "--image-size": str(IMAGE)}
    if command == "export":
        flags.update({"--draft": "draft", "--draft-n-head": "2"})
    flags.update(change)
    argv = [command, "--out", str(tmp_path / ("bundle" if command == "export" else "x.png"))]
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, str(paths[value]) if value in paths else value]
    assert cli_exit_code(argv) == 2
    assert message.replace("specrt generate", f"specrt {command}") in _one_line_error(capsys)
    assert not (tmp_path / "bundle").exists() and not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command,message", [
    ("generate", "this model is text-to-image: give --prompt"),
    ("export", "the draft is c2i but the target is t2i: both must take the same condition"),
])
def test_a_t2i_target_needs_captions_and_a_t2i_draft(files, tmp_path, capsys, command, message):
    paths, _ = files
    argv = [command, "--out", str(tmp_path / ("bundle" if command == "export" else "x.png")), "--target", str(paths["t2i"]),
            "--vq", str(paths["vq"]), "--n-head", "4", "--image-size", str(IMAGE)]
    if command == "export":
        argv += ["--draft", str(paths["draft"]), "--draft-n-head", "2"]
    assert cli_exit_code(argv) == 2
    assert message in _one_line_error(capsys)
    assert not (tmp_path / "bundle").exists() and not (tmp_path / "x.png").exists()


def test_export_reads_the_same_way_and_clamps_neighbours_like_the_torch_path(files, tmp_path, capsys, monkeypatch):
    """Graph exporters stubbed (placeholder files): this is about what the manifest and table say."""
    from specrt.export import onnx_export
    from specrt.export.checkpoints import load_vq
    from specrt.manifest import read_manifest
    from specrt.runtime.backends.torch_backend import TorchVQ

    def placeholder(spec, out_dir):
        (out_dir / spec.file).write_bytes(b"placeholder")
        return spec

    monkeypatch.setattr(onnx_export, "export_prefill", lambda gpt, role, limits, d, opset, hidden: placeholder(
        onnx_export.prefill_spec(f"{role}_prefill", role, gpt.config, limits, opset, hidden), d))
    monkeypatch.setattr(onnx_export, "export_step", lambda gpt, role, limits, d, opset, hidden, kv: placeholder(
        onnx_export.step_spec(f"{role}_step", role, gpt.config, limits, opset, hidden, kv), d))
    monkeypatch.setattr(onnx_export, "export_vq_decode", lambda vq, grid, limits, d, opset: placeholder(
        onnx_export.vq_decode_spec(grid, grid * vq.config.downsample, limits, opset), d))
    paths, _ = files
    out = tmp_path / "bundle"
    argv = ["export", "--out", str(out), "--target", str(paths["gpt"]), "--draft", str(paths["draft"]),
            "--vq", str(paths["vq"]), "--n-kv-head", "2", "--draft-n-head", "2",
            "--image-size", str(IMAGE), "--neighbours", "100", *NO_METHOD_GRAPHS]
    assert cli_exit_code(argv) == 0
    assert f"note: 100 neighbours asked, a {VOCAB}-entry codebook has {VOCAB - 1} other codewords" in capsys.readouterr().out
    manifest = read_manifest(out, check_hashes=False)
    target = manifest.models["target"]
    assert (target["n_head"], target["n_kv_head"], target["head_dim"], target["grid_size"]) == (4, 2, 32, GRID)
    assert manifest.models["draft"]["n_head"] == 2
    assert {k: manifest.models["vq"][k] for k in ("downsample", "image_size", "grid_size")} == \
        {"downsample": DOWNSAMPLE, "image_size": IMAGE, "grid_size": GRID}
    assert manifest.neighbours["k"] == VOCAB - 1
    table = np.load(manifest.neighbours_path)
    np.testing.assert_array_equal(table, TorchVQ.neighbours_of(load_vq(paths["vq"], decoder_only=True), k=100))


def test_from_torch_refuses_what_it_cannot_run_in_one_line(files):
    from specrt.export.checkpoints import load_gpt, load_vq

    paths, _ = files
    vq = load_vq(paths["vq"], decoder_only=True)
    t2i = load_gpt(paths["t2i"], grid_size=GRID, n_head=4)
    with pytest.raises(SpecrtError, match="the draft is c2i but the target is t2i"):
        Pipeline.from_torch(t2i, load_gpt(paths["draft"], grid_size=GRID, n_head=2), vq)
    small_vq = VQModel(VQConfig(codebook_size=32, codebook_embed_dim=8, ch=32, ch_mult=(1, 2), z_channels=32))
    with pytest.raises(SpecrtError, match="VQ codebook size 32 != GPT vocab size 64"):
        Pipeline.from_torch(load_gpt(paths["gpt"], grid_size=GRID, n_head=4), None, small_vq)


def test_cli_names_every_llamagen_size():
    from specrt.commands._checkpoint_flags import GPT_ARCH_NAMES
    from specrt.models.llamagen_gpt import GPT_ARCHS

    assert GPT_ARCH_NAMES == ", ".join(GPT_ARCHS)
