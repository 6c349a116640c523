"""Output paths are checked before any work (specrt.paths): a folder that does not exist, is not
a folder, or takes no files is one line and exit 2 before a model loads, and no folder is created.

The CLI tests replace the model loaders with a function that fails the test, so a check that
came after loading (or never) shows as that failure instead of exit 2.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cli_helpers import one_line, run
from specrt.errors import SpecrtError
from specrt.paths import cache_folder, output_file, output_folder

NOT_WRITABLE = [p for p in ("/proc/x.png", "/sys/x") if Path(p).parent.is_dir()]
as_root = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test: the checks under test must come first."""
    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the output path was checked")

    from specrt.commands import export, generate

    monkeypatch.setattr(generate, "build_pipeline", loaded)
    monkeypatch.setattr(export, "_models", loaded)


# ---- specrt.paths -------------------------------------------------------------------------


def test_missing_parent_folder_is_refused_and_not_created(tmp_path):
    target = tmp_path / "nonexistent" / "dir" / "img.png"
    with pytest.raises(SpecrtError, match="the folder .*nonexistent/dir does not exist .*mkdir -p"):
        output_file("--out", target)
    with pytest.raises(SpecrtError, match="does not exist"):
        output_folder("--out", tmp_path / "nonexistent" / "bundle")
    assert not (tmp_path / "nonexistent").exists()


def test_writable_places_pass_and_leave_nothing(tmp_path):
    assert output_file("--out", tmp_path / "img.png") == tmp_path / "img.png"
    assert output_folder("--out", tmp_path / "bundle") == tmp_path / "bundle"
    (tmp_path / "head").mkdir()
    assert output_folder("--out", tmp_path / "head", write_into_existing=True) == tmp_path / "head"
    assert output_file("--out", None) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]  # the write probe is gone


def test_a_folder_for_a_file_and_a_file_for_a_folder_are_refused(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(SpecrtError, match="is a folder"):
        output_file("--json", tmp_path)
    with pytest.raises(SpecrtError, match="is a file"):
        output_folder("--out", tmp_path / "f.txt")
    with pytest.raises(SpecrtError, match="is not a folder"):
        output_file("--out", tmp_path / "f.txt" / "img.png")


@pytest.mark.skipif(not NOT_WRITABLE, reason="no /proc or /sys on this system")
@pytest.mark.parametrize("path", NOT_WRITABLE)
def test_pseudo_filesystems_are_refused(path):
    with pytest.raises(SpecrtError, match="cannot write into"):
        output_file("--out", path)


@pytest.mark.skipif(as_root or sys.platform == "win32", reason="root writes into read-only folders; "
                    "the /proc and /sys tests cover refusal there")
def test_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(SpecrtError, match="cannot write into"):
            output_file("--out", folder / "img.png")
    finally:
        folder.chmod(0o755)


def test_cache_folder_is_created_with_its_parents(tmp_path):
    assert cache_folder("--cache-dir", tmp_path / "a" / "b").is_dir()
    if Path("/sys").is_dir():
        with pytest.raises(SpecrtError, match="--cache-dir /sys/specrt-cache: cannot create it"):
            cache_folder("--cache-dir", "/sys/specrt-cache")


# ---- the commands, before any model loads ---------------------------------------------------


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="no /proc on this system")
@pytest.mark.parametrize("argv", [
    ["generate", "--out", "/proc/x.png"],
    ["generate", "--stats", "/proc/s.json"],
    ["generate", "--tokens-only", "--out", "/proc/t.png"],
    ["generate", "--save-tokens", "/proc/t.npy"],
    ["export", "--out", "/proc/bundle"],
    ["bench", "--json", "/proc/b.json"],
    ["bench", "--plot", "/proc/b.png"],
    ["train-draft", "--out", "/proc/head"],
    ["demo", "train", "--out", "/proc/weights"],
    ["demo", "report", "--grid", "/proc/grid.png"],
])
def test_unwritable_outputs_exit_2_before_any_work(argv, capsys, no_model_loads):
    code, err = run(argv, capsys)
    assert code == 2 and "cannot write into /proc" in one_line(err)


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="no /sys on this system")
def test_export_into_sys_exits_2(capsys, no_model_loads):
    code, err = run(["export", "--out", "/sys/x"], capsys)
    assert code == 2 and "--out /sys/x: cannot write into /sys" in one_line(err)


def test_generate_into_a_missing_folder_exits_2_and_creates_nothing(tmp_path, capsys, no_model_loads):
    code, err = run(["generate", "--out", str(tmp_path / "nonexistent" / "dir" / "img.png")], capsys)
    assert code == 2 and "does not exist" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_quantize_and_triton_repo_check_out_before_reading(tmp_path, capsys):
    missing = tmp_path / "no" / "q"
    for argv in (["quantize", str(tmp_path), "--mode", "int4", "--out", str(missing)],
                 ["triton-repo", str(tmp_path), "--out", str(missing)]):
        code, err = run(argv, capsys)
        assert code == 2 and f"--out {missing}: the folder" in one_line(err)
    assert list(tmp_path.iterdir()) == []
