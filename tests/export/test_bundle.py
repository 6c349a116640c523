"""Bundle writing: manifest content and validation, neighbour table, atomic write, bad input."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from specrt.cli import main
from specrt.errors import SpecrtError
from specrt.export import onnx_export
from specrt.export.bundle import ExportOptions, check_compatible, write_bundle
from specrt.export.verify import verify_bundle
from specrt.manifest import VERSION, read_manifest
from specrt.models.llamagen_gpt import GPT
from specrt.models.llamagen_vq import VQModel
from specrt.models.neighbours import codebook_neighbours
from tiny_export import NEIGHBOURS_K, VOCAB, tiny_bundle, tiny_draft_config, tiny_models, tiny_vq_config


@pytest.fixture(scope="module")
def bundle():
    return tiny_bundle()


def _copy(manifest, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(manifest.root, copy)
    return copy


# ---- manifest -------------------------------------------------------------------------


def test_manifest_lists_every_graph_and_hashes_every_file(bundle):
    manifest, _ = bundle
    assert list(manifest.graphs) == ["target_prefill", "target_step", "draft_prefill", "draft_step", "draft_chain",
                                     "vq_decode"]
    on_disk = {p.name for p in manifest.root.iterdir()} - {"manifest.json"}
    assert set(manifest.files) == on_disk
    assert all(len(r["sha256"]) == 64 and r["bytes"] > 0 for r in manifest.files.values())
    target = manifest.models["target"]
    assert target["capacity"] == target["cond_len"] + target["grid_size"] ** 2 + manifest.limits["max_window"]
    assert manifest.models["draft"]["kind"] == "independent"
    assert manifest.models["vq"]["codebook_size"] == target["vocab_size"]
    assert set(manifest.sampling_defaults) == {"cfg_scale", "temperature", "top_k", "top_p"}
    for graph in manifest.graphs.values():
        for tensor in graph.inputs + graph.outputs:
            assert set(tensor.symbolic_dims) <= set(graph.profile)


def test_read_manifest_rejects_a_modified_file(bundle, tmp_path):
    manifest, _ = bundle
    copy = _copy(manifest, tmp_path)
    path = copy / "target_step.onnx"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SpecrtError, match="sha256 of target_step.onnx"):
        read_manifest(copy)
    (copy / "neighbours.npy").unlink()
    with pytest.raises(SpecrtError, match="missing"):
        read_manifest(copy, check_hashes=False)


def _edit_copy(manifest, tmp_path: Path, edit) -> Path:
    copy = _copy(manifest, tmp_path)
    raw = json.loads((copy / "manifest.json").read_text())
    edit(raw)
    (copy / "manifest.json").write_text(json.dumps(raw))
    return copy


def test_a_version_1_bundle_is_refused_with_one_line(bundle, tmp_path):
    manifest, _ = bundle
    assert manifest.raw["version"] == VERSION == 2
    copy = _edit_copy(manifest, tmp_path, lambda m: m.update(version=1))
    with pytest.raises(SpecrtError) as info:
        read_manifest(copy)
    message = str(info.value)
    assert message.startswith(f"bundle {copy} uses manifest version 1;")
    assert "re-export it with this specrt (`specrt export" in message and "\n" not in message


def test_inspect_of_a_version_1_bundle_exits_2_with_one_line(bundle, tmp_path, capsys):
    manifest, _ = bundle
    copy = _edit_copy(manifest, tmp_path, lambda m: m.update(version=1))
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(copy)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "uses manifest version 1" in err and "\n" not in err


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(version=3), "version 3; this specrt reads version 2: it was written by a newer specrt"),
    (lambda m: m.update(format="other"), "not a specrt bundle manifest"),
    (lambda m: m["graphs"]["draft_step"]["inputs"].pop(), "draft_step does not end in the sampling head .no input 'uniforms'"),
    (lambda m: m["graphs"]["target_prefill"]["outputs"][-1].update(dtype="int64"), "output 'draws' is int64, not int32"),
    (lambda m: m["graphs"]["target_step"]["profile"]["total_len"].update(max=1000), "total_len"),
    (lambda m: m["graphs"]["target_step"]["profile"].pop("window"), "no profile"),
])
def test_read_manifest_rejects_bad_manifests(bundle, tmp_path, edit, message):
    manifest, _ = bundle
    copy = _edit_copy(manifest, tmp_path, edit)
    with pytest.raises(SpecrtError, match=message):
        read_manifest(copy)


def test_manifest_reader_imports_without_torch_or_onnx():
    import subprocess
    import sys

    code = ("import sys; import specrt.manifest; "
            "bad = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- neighbours -----------------------------------------------------------------------


def test_neighbour_table_is_nearest_first_without_self(bundle):
    manifest, models = bundle
    table = np.load(manifest.neighbours_path)
    assert table.dtype == np.int32 and table.shape == (VOCAB, NEIGHBOURS_K)
    assert manifest.neighbours["k"] == NEIGHBOURS_K
    codebook = torch.nn.functional.normalize(models.vq.quantize.embedding.weight.detach(), dim=-1).double().numpy()
    distances = np.linalg.norm(codebook[:, None] - codebook[None], axis=-1)
    np.fill_diagonal(distances, np.inf)
    brute = np.argsort(distances, axis=1, kind="stable")[:, :NEIGHBOURS_K]
    assert (table != np.arange(VOCAB)[:, None]).all()
    np.testing.assert_array_equal(table, brute)


def test_neighbours_list_a_duplicate_codeword_but_never_the_token_itself():
    codebook = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    table = codebook_neighbours(codebook, k=2)
    assert table[0].tolist() == [1, 2] and table[1].tolist() == [0, 2]
    with pytest.raises(SpecrtError, match="neighbour count"):
        codebook_neighbours(codebook, k=4)


# ---- verification ---------------------------------------------------------------------


def test_verify_passes_on_the_exported_models_and_fails_on_different_ones(bundle):
    manifest, models = bundle
    report = verify_bundle(manifest, models, threads=1)
    assert report.passed, report.format()
    worst = report.worst()
    assert worst[("target_step", "logits")].max_abs_diff < 1e-4
    cases = {c.case for c in report.comparisons if c.graph == "target_step"}
    assert {"W=1 past=1", "W=3 past=1", "W=16 past=1", "W=20 past=1"} <= cases
    assert any(c.startswith("tree") for c in cases) and any(c.startswith("CFG") for c in cases)
    for graph in ("target_prefill", "target_step", "draft_prefill", "draft_step"):  # the head is checked too
        assert worst[(graph, "probs")].max_abs_diff < 1e-5
        differ, compared = report.draw_counts(graph)
        assert differ == 0 and compared >= (3 if graph.endswith("prefill") else 40), (graph, compared)
    assert any(c.startswith("CFG") for c in {c.case for c in report.comparisons if c.graph == "draft_prefill"})
    assert "draws" in report.format()

    other = tiny_models(seed=1)
    other.vq = models.vq
    broken = verify_bundle(manifest, other, threads=1)
    assert not broken.passed
    assert "SOME ABOVE TOLERANCE" in broken.format()
    assert broken.draw_counts("target_step")[0] > 0  # other weights draw other tokens


def test_uniforms_are_kept_off_cdf_boundaries():
    from specrt.export.verify import uniforms_off_boundaries

    probs = np.array([[0.5, 0.25, 0.25], [1e-9, 1 - 2e-9, 1e-9], [0.4, 0.6, 0.0]], dtype=np.float32)
    rng = np.random.default_rng(0)
    for _ in range(50):
        uniforms, usable = uniforms_off_boundaries(probs, rng, margin=0.01)
        assert uniforms.dtype == np.float32 and usable.all()
        edges = np.cumsum(probs.astype(np.float64), -1)[:, :-1]
        assert (np.abs(edges - uniforms[:, None].astype(np.float64)).min(-1) >= 0.01).all()
    # every bin narrower than twice the margin: the row cannot be compared
    flat = np.full((1, 200), 1 / 200, dtype=np.float32)
    _, usable = uniforms_off_boundaries(flat, rng, margin=0.01)
    assert not usable.any()


# ---- bad input ------------------------------------------------------------------------


def test_incompatible_models_are_refused():
    models = tiny_models()
    models.draft = GPT(tiny_draft_config(vocab_size=VOCAB + 1))
    with pytest.raises(SpecrtError, match="draft vocab size 97 != target vocab size 96"):
        check_compatible(models)
    models = tiny_models()
    models.vq = VQModel(tiny_vq_config(codebook_size=VOCAB * 2))
    with pytest.raises(SpecrtError, match="VQ codebook size 192 != GPT vocab size 96"):
        check_compatible(models)


def test_existing_output_is_refused_without_force(tmp_path):
    (tmp_path / "bundle").mkdir()
    with pytest.raises(SpecrtError, match="already exists; pass --force"):
        write_bundle(tiny_models(), tmp_path / "bundle")


@pytest.mark.parametrize("argv, message", [
    (["--max-window", "0"], "--max-window must be an integer in [1, 1048576], got 0"),
    (["--max-batch", "-2"], "--max-batch must be an integer in [1, 1048576], got -2"),
    (["--threads", "0"], "CPU(s), got 0"),
    (["--opset", "21"], "--opset must be one of"),
    (["--target", "t.pt"], "missing --vq"),
    (["--draft", "d.pt"], "missing --target, --vq"),
])
def test_cli_bad_arguments_exit_2_with_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--out", str(tmp_path / "b"), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "b").exists()


def test_checkpoint_not_matching_arch_exits_2(tmp_path, capsys):
    from safetensors.torch import save_file

    models = tiny_models()
    models.vq = VQModel(tiny_vq_config(ch=32, norm_groups=32))  # loadable with the default 32 GroupNorm groups
    for role in ("target", "draft", "vq"):
        save_file(getattr(models, role).state_dict(), str(tmp_path / f"{role}.safetensors"))
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--out", str(tmp_path / "b"), "--arch", "GPT-B", "--image-size", "8",
              "--target", str(tmp_path / "target.safetensors"), "--draft", str(tmp_path / "draft.safetensors"),
              "--vq", str(tmp_path / "vq.safetensors")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrt: error:") and "GPT-B" in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft.safetensors", "target.safetensors", "vq.safetensors"]


# ---- atomic write ---------------------------------------------------------------------


def test_failure_mid_export_leaves_nothing(tmp_path, monkeypatch):
    written_before_crash = []

    def export_step_crashes(gpt, role, limits, work_dir, *args, **kwargs):
        written_before_crash.extend(p.name for p in Path(work_dir).iterdir())
        raise RuntimeError("simulated crash while exporting target_step")

    monkeypatch.setattr(onnx_export, "export_step", export_step_crashes)
    with pytest.raises(RuntimeError, match="simulated crash"):
        write_bundle(tiny_models(), tmp_path / "bundle", ExportOptions(max_window=2, neighbours_k=2))
    assert written_before_crash == ["target_prefill.onnx"]
    assert list(tmp_path.iterdir()) == []  # no bundle, no partial directory


def test_failed_forced_export_keeps_the_old_bundle(tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.txt").write_text("previous export")
    (out / "manifest.json").write_text("{}")  # a bundle: what --force may replace

    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(onnx_export, "export_prefill", fail)
    with pytest.raises(RuntimeError, match="boom"):
        write_bundle(tiny_models(), out, ExportOptions(max_window=2, neighbours_k=2), force=True)
    assert (out / "old.txt").read_text() == "previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
