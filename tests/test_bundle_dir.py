"""Atomic bundle writes and what a kill leaves behind (specrt.bundle_dir, specrt.cli).

SIGTERM unwinds like Ctrl-C (temporary folder removed, exit 143); a SIGKILL leaves a
`.NAME.partial-*` folder that the next write beside NAME removes, unless its writer is still
alive (it holds a lock on it); no command ever reads such a folder as a bundle.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specrt.bundle_dir import is_partial, partial_dir, remove_stale_partials
from specrt.errors import SpecrtError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and flock")

# A CLI command that writes into a partial folder and then waits to be killed; with "swallow", its
# wait swallows every exception (as a library might), then it moves its work into place.
WRITER = """
import sys, time
from pathlib import Path
import click
from specrt import cli
from specrt.bundle_dir import move_into_place, partial_dir

@cli.cli.command("slow-write")
@click.argument("out")
@click.argument("how")
def slow_write(out, how):
    with partial_dir(Path(out)) as work:
        (work / "graph.onnx").write_bytes(b"x" * 1000)
        print("writing", flush=True)
        try:
            time.sleep(120)
        except BaseException:
            if how != "swallow":
                raise
        move_into_place(work, Path(out), force=False)

cli.main(["slow-write", sys.argv[1], sys.argv[2]])
"""


def start_writer(out: Path, how: str = "raise") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out), how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # the writer prints once its folder exists (or exits: then "")
    assert line.strip() == "writing", proc.communicate(timeout=30)
    return proc


def partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if is_partial(p))


@pytest.mark.parametrize("how", ["raise", "swallow"])
def test_sigterm_removes_the_partial_folder_and_exits_143(tmp_path, how):
    """Also when the command swallows the Terminated the signal raised (seen, rarely, inside
    torch.onnx's export): the writer stops where it would have moved its work into place."""
    proc = start_writer(tmp_path / "bundle", how)
    assert len(partials(tmp_path)) == 1
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "specrt: terminated"
    assert list(tmp_path.iterdir()) == []


def test_a_terminate_swallowed_by_a_callback_is_raised_again():
    """A SIGTERM whose Terminated is raised inside a weakref callback (where Python prints it and
    goes on; seen when it landed in importlib's module-lock callback during an export) is sent
    again and unwinds the block after all."""
    import weakref

    from specrt.cli import sigterm_as_interrupt
    from specrt.errors import Terminated

    class Thing:
        pass

    def raise_terminated(_):
        raise Terminated()

    with pytest.raises(Terminated):
        with sigterm_as_interrupt():
            thing = Thing()
            ref = weakref.ref(thing, raise_terminated)
            del thing  # the callback's Terminated is unraisable here
            for _ in range(200):  # the signal sent again arrives within a few instructions
                time.sleep(0.005)
    assert ref() is None


def test_a_file_written_after_a_swallowed_sigterm_is_never_committed(tmp_path):
    """atomic_path checks the same flag before its rename; a command's end clears it."""
    from specrt import termination
    from specrt.atomic_file import write_bytes
    from specrt.cli import sigterm_as_interrupt
    from specrt.errors import Terminated

    with sigterm_as_interrupt():
        termination.request()  # what the CLI's handler does before raising
        with pytest.raises(Terminated):
            write_bytes(tmp_path / "plan.json", b"{}")
    assert list(tmp_path.iterdir()) == []
    write_bytes(tmp_path / "plan.json", b"{}")
    assert (tmp_path / "plan.json").read_bytes() == b"{}"


def test_after_sigkill_the_next_write_removes_the_stale_folder(tmp_path):
    proc = start_writer(tmp_path / "bundle")
    proc.kill()
    proc.communicate(timeout=60)
    [stale] = partials(tmp_path)
    notes = []
    with pytest.raises(RuntimeError):
        with partial_dir(tmp_path / "bundle", note=notes.append) as work:
            assert partials(tmp_path) == [work.name]  # the stale one went first
            raise RuntimeError("and this write fails: its own folder goes too")
    assert notes == [f"removed {tmp_path / stale}, left by an earlier run that was killed"]
    assert list(tmp_path.iterdir()) == []


def test_a_live_writers_folder_is_kept(tmp_path):
    proc = start_writer(tmp_path / "bundle")
    try:
        [live] = partials(tmp_path)
        assert remove_stale_partials(tmp_path / "bundle") == []
        assert partials(tmp_path) == [live]
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert remove_stale_partials(tmp_path / "bundle") == [tmp_path / live]


def test_only_the_destinations_own_partials_are_touched(tmp_path):
    for name in (".bundle.partial-0123abcd", ".bundle2.partial-0123abcd", ".bundle.partial-notours", "bundle"):
        (tmp_path / name).mkdir()
    assert remove_stale_partials(tmp_path / "bundle") == [tmp_path / ".bundle.partial-0123abcd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bundle.partial-notours", ".bundle2.partial-0123abcd",
                                                          "bundle"]


def test_a_partial_folder_is_never_read_as_a_bundle(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).parent / "engines"))
    from tiny_bundle import write_bundle

    from specrt.cli import main
    from specrt.manifest import read_manifest

    bundle = write_bundle(tmp_path / "bundle")
    read_manifest(bundle)  # a complete bundle ...
    partial = tmp_path / ".bundle.partial-0123abcd"
    shutil.copytree(bundle, partial)  # ... and the same files under a writer's temporary name
    with pytest.raises(SpecrtError, match="is not a bundle: it is the temporary folder of an unfinished write"):
        read_manifest(partial)
    for argv in (["inspect", str(partial)], ["generate", str(partial)]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "temporary folder" in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_specrt_export_on_sigterm_leaves_nothing(tmp_path):
    """The real command: SIGTERM while the demo's graphs are being exported."""
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-m", "specrt.cli", "export", "--out", str(tmp_path / "bundle"),
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not partials(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert partials(tmp_path), proc.communicate(timeout=60) if proc.poll() is not None else "no partial folder in 180 s"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "specrt: terminated" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []
