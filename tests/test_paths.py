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


# ---- replacing an output: --force replaces a bundle or an empty folder, nothing else ------------


@pytest.fixture
def canary_cwd(tmp_path, monkeypatch):
    """The current folder (and the home folder) of a user with a file in it that must survive."""
    here, home = tmp_path / "work", tmp_path / "home"
    for folder in (here, home):
        folder.mkdir()
        (folder / "canary.txt").write_text("keep me")
    monkeypatch.chdir(here)
    monkeypatch.setenv("HOME", str(home))
    return here


def assert_canaries_alive(here: Path) -> None:
    for folder in (here, here.parent / "home"):
        assert sorted(p.name for p in folder.iterdir()) == ["canary.txt"], list(folder.iterdir())
        assert (folder / "canary.txt").read_text() == "keep me"
    assert sorted(p.name for p in here.parent.iterdir()) == ["home", "work"]  # no partial or moved-aside folder


@pytest.mark.parametrize("out", ["", "  ", ".", "./", "..", "../work", "~HOME", "/"])
@pytest.mark.parametrize("command", [["export"], ["export", "--demo", "mar"], ["quantize", "BUNDLE", "--mode", "int4"],
                                     ["triton-repo", "BUNDLE"]])
def test_force_never_replaces_the_current_folder_home_or_root(command, out, canary_cwd, capsys, no_model_loads):
    out = str(canary_cwd.parent / "home") if out == "~HOME" else out
    argv = [str(canary_cwd.parent) if a == "BUNDLE" else a for a in command]  # any existing folder: refused first
    code, err = run([*argv, "--out", out, "--force"], capsys)
    assert code == 2
    assert any(words in one_line(err) for words in ("names no file or folder", "is the current folder",
                                                    "is a folder above the current one", "is the home folder"))
    assert_canaries_alive(canary_cwd)


def test_a_link_to_the_current_folder_is_the_current_folder(canary_cwd, capsys, no_model_loads):
    (canary_cwd.parent / "link").symlink_to(canary_cwd)
    code, err = run(["export", "--out", str(canary_cwd.parent / "link"), "--force"], capsys)
    assert code == 2 and "is the current folder" in one_line(err)
    (canary_cwd.parent / "link").unlink()
    assert_canaries_alive(canary_cwd)


def test_the_python_api_refuses_the_current_folder_too(canary_cwd):
    from specrt.bundle_dir import move_into_place, refuse_existing

    for out in ("", ".", Path.cwd(), Path.home()):
        with pytest.raises(SpecrtError, match="which specrt never replaces"):
            refuse_existing(Path(out), force=True)
    work = canary_cwd.parent / "new"
    work.mkdir()
    (work / "manifest.json").write_text("{}")
    with pytest.raises(SpecrtError, match="is the current folder"):
        move_into_place(work, Path("").absolute(), force=True)  # what write_bundle(models, "") reached
    work.joinpath("manifest.json").unlink()
    work.rmdir()
    assert_canaries_alive(canary_cwd)


def test_force_replaces_a_bundle_or_an_empty_folder_and_nothing_else(tmp_path):
    from specrt.bundle_dir import move_into_place, refuse_existing

    def new_bundle(name: str) -> Path:
        work = tmp_path / name
        work.mkdir()
        (work / "manifest.json").write_text('{"new": true}')
        return work

    bundle, empty, other, plain = tmp_path / "bundle", tmp_path / "empty", tmp_path / "photos", tmp_path / "notes.txt"
    bundle.mkdir(), empty.mkdir(), other.mkdir()
    (bundle / "manifest.json").write_text('{"old": true}')
    (bundle / "old.onnx").write_bytes(b"x")
    (other / "holiday.jpg").write_bytes(b"x")
    plain.write_text("x")
    for out, what in ((bundle, "a specrt bundle"), (empty, "an empty folder")):
        with pytest.raises(SpecrtError, match=rf"already exists; pass --force to replace it \(it is {what}\)"):
            refuse_existing(out, force=False)
        move_into_place(new_bundle(f"work-{out.name}"), out, force=True)
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
        assert (out / "manifest.json").read_text() == '{"new": true}'
    for out, what in ((other, "a folder with other files in it"), (plain, "a file")):
        for force in (False, True):
            with pytest.raises(SpecrtError, match=f"is not a specrt bundle \\({what}\\)") as refused:
                refuse_existing(out, force=force)
            assert "--force" not in str(refused.value)  # never an invitation to delete it
    work = new_bundle("work-other")
    with pytest.raises(SpecrtError, match="is not a specrt bundle"):
        move_into_place(work, other, force=True)
    assert sorted(p.name for p in other.iterdir()) == ["holiday.jpg"] and plain.read_text() == "x"
    assert not [p for p in tmp_path.iterdir() if ".old-" in p.name]  # nothing moved aside and left


def test_export_without_force_does_not_invite_replacing_a_folder_of_other_files(tmp_path, capsys, no_model_loads):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "holiday.jpg").write_bytes(b"x")
    code, err = run(["export", "--out", str(tmp_path / "photos")], capsys)
    assert code == 2 and "is not a specrt bundle" in one_line(err) and "--force" not in err
    assert (tmp_path / "photos" / "holiday.jpg").exists()


def _path_parameters():
    import click

    from specrt.cli import cli

    def walk(command, path):
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, [*path, name])
        for param in command.params:
            if isinstance(param.type, click.Path):
                yield path, param

    return [pytest.param(path, param, id=f"{' '.join(path)} {param.name}") for path, param in walk(cli, [])]


@pytest.mark.parametrize("path, param", _path_parameters())
@pytest.mark.parametrize("blank", ["", " \t"])
def test_every_path_of_every_command_refuses_a_blank_value(path, param, blank, capsys, no_model_loads):
    argv = [*path, param.opts[0], blank] if param.param_type_name == "option" else [*path, blank]
    code, err = run(argv, capsys)
    assert code == 2 and "names no file or folder" in one_line(err)
    assert (param.opts[0] if param.param_type_name == "option" else param.human_readable_name) in err
