"""Flags that cannot work here are refused in one line (exit 2) before a model loads, never
ignored: --device against the installed torch, checkpoint flags on the embedded demo or a
BUNDLE, an empty --prompt.

The model loaders are replaced with a function that fails the test, so a flag that slipped
through to loading (or was ignored) shows as that failure instead of exit 2.
"""
from __future__ import annotations

import pytest

from cli_helpers import one_line, run
from specrt.errors import SpecrtError
from specrt.validation import torch_device

torch = pytest.importorskip("torch")


@pytest.fixture
def no_model_loads(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded although a flag should have been refused")

    from specrt.bench import models as bench_models
    from specrt.commands import bench, export, generate, train_draft
    from specrt.export.mar import hooks as mar_hooks

    monkeypatch.setattr(generate, "build_pipeline", loaded)
    monkeypatch.setattr(export, "_models", loaded)
    monkeypatch.setattr(bench_models, "open_models", loaded)
    monkeypatch.setattr(bench, "_profile", loaded)
    monkeypatch.setattr(train_draft, "_target", loaded)
    monkeypatch.setattr(mar_hooks, "torch_pipeline", loaded)


@pytest.fixture
def cpu_only_torch(monkeypatch):
    """torch as a CPU-only wheel reports itself, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)


# ---- --device --------------------------------------------------------------------------------


def test_torch_device_values():
    assert torch_device(None) is None and torch_device("cpu") == "cpu" and torch_device(" CPU ") == "cpu"
    for bad in ("foo", "cuda:x", "cpu:0", "cuda:", "gpu"):
        with pytest.raises(SpecrtError, match="--device must be cpu, cuda or cuda:N"):
            torch_device(bad)


def test_cuda_on_a_cpu_only_torch_names_the_fix(cpu_only_torch):
    with pytest.raises(SpecrtError, match=r"CPU-only build; install a CUDA build of torch .* or use --device cpu"):
        torch_device("cuda")


def test_cuda_without_a_gpu_on_a_cuda_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(SpecrtError, match="finds no GPU .*nvidia-smi"):
        torch_device("cuda:0")


def test_gpu_index_beyond_the_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert torch_device("cuda:0") == "cuda:0"
    with pytest.raises(SpecrtError, match="has 1 GPU"):
        torch_device("cuda:3")


@pytest.mark.parametrize("argv, message", [
    (["generate", "--device", "foo"], "--device must be cpu, cuda or cuda:N, got 'foo'"),
    (["generate", "--device", "cuda"], "CPU-only build"),
    (["bench", "--backend", "torch", "--device", "cuda"], "CPU-only build"),
    (["bench", "--backend", "torch", "--device", "foo"], "--device must be cpu, cuda or cuda:N"),
    (["bench", "--profile-arch", "llamagen-c2i-B", "--device", "cuda"], "CPU-only build"),
    (["bench", "--precision", "fp32,int4", "--device", "cuda"], "applies to --backend torch"),
    (["bench", "--demo", "mar", "--device", "cuda"], "applies to --backend torch"),
    (["bench", "--demo", "mar", "--backend", "torch", "--device", "cuda"], "CPU-only build"),  # the demo's modules
    (["serve", "--device", "cuda"], "CPU-only build"),
    (["serve", "--device", "foo"], "--device must be cpu"),
    (["generate", "--demo", "mar", "--device", "cuda"], "CPU-only build"),  # the family's torch pipeline takes it
    (["generate", "--demo", "mar", "--device", "foo"], "--device must be cpu, cuda or cuda:N"),
    (["generate", "--demo", "chameleon", "--prompt", "a seven", "--device", "cuda"], "CPU-only build"),
])
def test_devices_this_torch_cannot_use_exit_2(argv, message, capsys, no_model_loads, cpu_only_torch):
    code, err = run(argv, capsys)
    assert code == 2 and message in one_line(err)


def llamagen_manifest(folder):
    """A manifest that names its family and nothing more: read_bundle takes it (the flags are
    checked before the LlamaGen reader looks further), so these tests load no model."""
    (folder / "manifest.json").write_text('{"family": "llamagen"}')
    return str(folder)


def test_device_with_a_bundle_is_refused(tmp_path, capsys, no_model_loads):
    code, err = run(["generate", llamagen_manifest(tmp_path), "--device", "cuda"], capsys)
    assert code == 2 and "a BUNDLE runs where --backend says" in one_line(err)


# ---- flags that do not apply -------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["generate", "--image-size", "33"], "--image-size describes LlamaGen checkpoints"),
    (["generate", "--arch", "GPT-XL"], "--arch describes LlamaGen checkpoints"),
    (["generate", "--demo", "t2i", "--n-head", "4", "--prompt", "a seven"], "the embedded demo (t2i)"),
    (["generate", "--demo", "mar", "--arch", "GPT-B"], "--arch does not apply to a continuous"),
    (["export", "--out", "{tmp}/b", "--image-size", "33"], "--image-size describes LlamaGen checkpoints"),
    (["export", "--out", "{tmp}/b", "--arch", "GPT-XL"], "the embedded demo (c2i) has a fixed architecture"),
    (["export", "--out", "{tmp}/b", "--random-weights", "--n-head", "3"], "--random-weights takes the named sizes"),
    (["train-draft", "--out", "{tmp}/h", "--image-size", "64"], "the demo target has a fixed architecture"),
    (["train-draft", "--out", "{tmp}/h", "--draft-arch", "GPT-B"], "train-draft trains a head for the --target"),
])
def test_flags_that_do_not_apply_exit_2(argv, message, tmp_path, capsys, no_model_loads):
    code, err = run([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2 and message in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_flags_on_a_bundle_and_draft_flags_without_a_draft(tmp_path, capsys, no_model_loads):
    code, err = run(["generate", llamagen_manifest(tmp_path), "--image-size", "256"], capsys)
    assert code == 2 and "a BUNDLE's architecture and image size were fixed" in one_line(err)
    for name in ("t.pt", "v.pt"):
        (tmp_path / name).write_bytes(b"")
    code, err = run(["generate", "--target", str(tmp_path / "t.pt"), "--vq", str(tmp_path / "v.pt"),
                     "--draft-n-head", "2"], capsys)
    assert code == 2 and "--draft-n-head describes the --draft checkpoint" in one_line(err)


def test_max_window_with_a_bundle_is_refused(tmp_path, capsys, no_model_loads):
    code, err = run(["generate", llamagen_manifest(tmp_path), "--max-window", "8"], capsys)
    assert code == 2 and "--max-window sizes the torch backend's windows" in one_line(err)


# ---- prompts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompts, message", [
    ([""], "--prompt is empty"),
    (["  "], "--prompt is empty"),
    (["a seven", ""], "--prompt (the 2nd) is empty"),
])
def test_empty_prompts_exit_2(prompts, message, capsys, no_model_loads):
    argv = ["generate", "--demo", "t2i"] + [a for p in prompts for a in ("--prompt", p)]
    code, err = run(argv, capsys)
    assert code == 2 and message in one_line(err)


# ---- thread counts ------------------------------------------------------------------------------


@pytest.fixture
def four_cpus(monkeypatch):
    """A machine with 4 CPUs, whatever this one has."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 4)


@pytest.mark.parametrize("argv", [
    ["generate"], ["generate", "--demo", "t2i", "--prompt", "a seven"], ["export", "--out", "{tmp}/b"],
    ["bench"], ["serve"], ["plan-tree", "{tmp}"], ["quantize", "{tmp}", "--out", "{tmp}/q", "--mode", "int4"],
    ["train-draft", "--out", "{tmp}/h"], ["demo", "train", "--out", "{tmp}/w"], ["demo", "report"],
    ["triton-repo", "{tmp}", "--out", "{tmp}/r"],
])
@pytest.mark.parametrize("threads", ["5", "100000", "0", "-1"])
def test_thread_counts_beyond_the_machine_exit_2(argv, threads, tmp_path, capsys, no_model_loads, four_cpus):
    """More threads than CPUs never runs faster, and a huge count starved the machine of processes."""
    if argv[0] == "triton-repo" and threads == "0":
        return  # 0 is onnxruntime's own default there
    code, err = run([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--threads", threads], capsys)
    assert code == 2 and f"--threads must be an integer in [" in one_line(err)
    assert f"this machine has 4 CPU(s), got {threads}" in err
    assert list(tmp_path.iterdir()) == []


def test_thread_counts_through_the_python_and_c_apis(demo_bundle, tmp_path, monkeypatch, four_cpus):
    from specrt.runtime.embedding import open_handle
    from specrt.runtime.pipeline import Pipeline
    from specrt.runtime.threads import resolve, set_torch_threads

    with pytest.raises(SpecrtError, match=r"^threads must be an integer in \[1, 4\]: this machine has 4 CPU"):
        Pipeline.from_bundle(demo_bundle, threads=100000)
    with pytest.raises(SpecrtError, match="this machine has 4 CPU"):
        set_torch_threads(5)
    with pytest.raises(SpecrtError, match=r"^--threads must be an integer in \[1, 4\]"):
        resolve(5)
    monkeypatch.setenv("SPECRT_THREADS", "100000")
    with pytest.raises(SpecrtError, match=r"^SPECRT_THREADS must be an integer in \[1, 4\]"):
        open_handle(str(demo_bundle), None)


# ---- --out ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["generate"], ["generate", "--demo", "t2i", "--prompt", "a seven"],
                                  ["generate", "--demo", "mar"]])
def test_an_out_suffix_that_is_no_image_type_exits_2(argv, tmp_path, capsys, no_model_loads):
    code, err = run(argv + ["--out", str(tmp_path / "x.foo")], capsys)
    assert code == 2 and "'.foo' is not an image type specrt writes" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_out_writes_the_type_its_suffix_names(tmp_path, capsys):
    from PIL import Image

    for name, kind, written in (("x.jpg", "JPEG", "x.jpg"), ("noext", "PNG", "noext.png")):
        code, _ = run(["generate", "--out", str(tmp_path / name)], capsys)
        assert code == 0
        with Image.open(tmp_path / written) as image:
            assert image.format == kind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noext.png", "x.jpg"]


@pytest.mark.parametrize("plot", ["p.txt", "p.json", "p.jpg"])
def test_bench_plot_that_is_no_png_exits_2(plot, tmp_path, capsys, no_model_loads):
    code, err = run(["bench", "--plot", str(tmp_path / plot)], capsys)
    assert code == 2 and "is not an image type specrt writes; use one of .png" in one_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["generate", "--method", "sd"], ["plan-tree"]])
def test_a_repeated_param_key_exits_2(argv, capsys, no_model_loads):
    code, err = run([*argv, "--param", "draft_len=2", "--param", "draft-len=5"], capsys)
    assert code == 2 and "--param draft_len given twice (draft_len=2 and draft_len=5)" in one_line(err)


# ---- messages that name what the user gave ----------------------------------------------------------


@pytest.mark.parametrize("command", [["generate"], ["export", "--vq", "VQ"]])
@pytest.mark.parametrize("content, message", [
    ({}, "is an empty folder: give a LlamaGen checkpoint file"),
    ({"manifest.json": "{}"}, "is a specrt bundle, not a checkpoint: it is exported already"),
    ({"notes.txt": "x"}, "is a folder without config.json: give a LlamaGen checkpoint file"),
])
def test_a_folder_that_is_no_checkpoint_as_target_says_what_it_is(command, content, message, tmp_path, capsys,
                                                                   no_model_loads):
    target = tmp_path / "folder"
    target.mkdir()
    for name, text in content.items():
        (target / name).write_text(text)
    (tmp_path / "vq.pt").write_bytes(b"PK\x03\x04")
    argv = [str(tmp_path / "vq.pt") if a == "VQ" else a for a in command]
    code, err = run([*argv, "--target", str(target), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and message in one_line(err) and "--prompt" not in err


@pytest.mark.parametrize("command", [["generate"], ["export"]])
def test_an_image_given_as_a_checkpoint_is_named_an_image(command, tmp_path, capsys, no_model_loads):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "img.png")
    code, err = run([*command, "--target", str(tmp_path / "img.png"), "--vq", str(tmp_path / "img.png"), "--out",
                     str(tmp_path / "out")], capsys)
    assert code == 2 and "--target" in err and "is not a checkpoint (a PNG image)" in one_line(err)
    assert "image size" not in err


def test_checkpoint_files_pass_the_first_bytes_check(tmp_path):
    from specrt.export.checkpoints import refuse_non_checkpoint

    torch.save({"w": torch.zeros(2)}, tmp_path / "a.pt")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    for name in ("a.pt", "a.safetensors"):
        refuse_non_checkpoint("--target", tmp_path / name)
    (tmp_path / "e.pt").write_bytes(b"")
    with pytest.raises(SpecrtError, match=r"is not a checkpoint \(empty\)"):
        refuse_non_checkpoint("--vq", tmp_path / "e.pt")


@pytest.mark.parametrize("argv, family", [
    (["generate", "--method", "cspd"], "continuous (MAR-style) models (--demo mar"),
    (["bench", "--methods", "cspd"], "continuous (MAR-style) models (--demo mar"),
    (["generate", "--demo", "mar", "--method", "lantern"], "LlamaGen-layout (VQ-token) models (the default demo"),
])
def test_a_method_of_another_family_names_the_family_that_has_it(argv, family, capsys, no_model_loads):
    code, err = run(argv, capsys)
    assert code == 2 and f"is a method of {family}" in one_line(err)


def test_a_bundle_names_the_family_that_has_the_method(demo_bundle, capsys, no_model_loads):
    code, err = run(["generate", str(demo_bundle), "--method", "cspd"], capsys)
    assert code == 2 and "cspd is a method of continuous (MAR-style) models" in one_line(err)


@pytest.mark.parametrize("ports", [["--http-port", "8005", "--grpc-port", "8005"],
                                   ["--grpc-port", "8002"], ["--http-port", "8002"]])
def test_serve_refuses_one_port_for_two_protocols(ports, capsys, no_model_loads):
    code, err = run(["serve", *ports], capsys)
    assert code == 2 and "each need a port of their own" in one_line(err)


@pytest.mark.parametrize("argv, message", [
    (["serve", "--groups", "0"], "--groups must be"), (["serve", "--groups", "17"], "--groups must be"),
    (["serve", "--slots", "0"], "--slots must be"), (["serve", "--slots", "100000"], "--slots must be"),
])
def test_serve_bounds_its_in_flight_flags_before_starting_anything(argv, message, capsys, no_model_loads):
    code, err = run(argv, capsys)
    assert code == 2 and message in one_line(err) and "starting Triton" not in err


def test_serve_without_the_serve_extra_says_so_before_starting_anything(monkeypatch, capsys, no_model_loads):
    import sys

    monkeypatch.setitem(sys.modules, "pytriton", None)  # as if nvidia-pytriton were not installed
    monkeypatch.setitem(sys.modules, "pytriton.triton", None)
    code, err = run(["serve"], capsys)
    assert code == 2 and "needs nvidia-pytriton, which is not installed" in one_line(err)
    assert "starting Triton" not in err
