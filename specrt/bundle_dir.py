"""Writing a bundle directory atomically: work in a hidden sibling, rename only when complete.

A directory is a bundle exactly when it has a manifest.json whose hashes match, so every
writer of bundles (`specrt export`, `specrt quantize`) assembles its files in a hidden
temporary directory beside the destination and renames it into place at the end: an
interrupted or failed run never leaves a directory that looks complete. Pure os/shutil, no
torch, so tools that only rewrite graphs use it too.

Leftovers: an error or a signal the CLI handles (Ctrl-C, SIGTERM) removes the temporary
directory; a SIGKILL or a power cut cannot. So the writer holds an advisory lock (flock) on its
temporary directory while it works, and every later write beside the same destination removes
the `.NAME.partial-*` directories nobody holds a lock on: stale ones, left by a killed run.
A directory with that name is never a bundle (specrt.manifest refuses to read one).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, no stale-directory cleanup
    fcntl = None

from specrt.errors import SpecrtError
from specrt.manifest import MANIFEST_NAME
from specrt.termination import stop_if_requested


def is_bundle(path: Path) -> bool:
    """Whether `path` is a folder specrt wrote as a bundle: its manifest is there."""
    return (Path(path) / MANIFEST_NAME).is_file()


def _is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and next(path.iterdir(), None) is None


def _never_replaced(out: Path) -> Optional[str]:
    """What `out` is when it is a folder no writer may replace whatever it holds (the current
    folder, a folder above it, the home folder, a filesystem root), else None. Compared after
    resolving links and `..`, so no spelling of these folders gets through."""
    target = Path(os.path.realpath(out))
    here = Path(os.path.realpath(os.getcwd()))
    if target == here:
        return "the current folder"
    if target in here.parents:
        return "a folder above the current one"
    if target == Path(os.path.realpath(Path.home())):
        return "the home folder"
    if target.parent == target or os.path.ismount(target):
        return "a filesystem root"
    return None


def refuse_existing(out: Path, force: bool, is_ours: Callable[[Path], bool] = is_bundle,
                    kind: str = "specrt bundle") -> None:
    """SpecrtError unless a writer may put its output at `out`.

    Why this strict: `--force` with an empty or mistyped --out (a script's unset variable) once
    replaced the current folder with a bundle, deleting everything in it. So --force replaces only
    what a writer made (is_ours: a bundle, its manifest present) or an empty folder, and never the
    current folder, a folder above it, the home folder or a filesystem root; anything else that
    exists is refused with or without --force, and the message does not suggest --force for it."""
    protected = _never_replaced(out)
    if protected is not None:
        raise SpecrtError(f"{out} is {protected}, which specrt never replaces: name a new folder for its output, "
                          "e.g. --out bundle")
    if not (out.exists() or out.is_symlink()):
        return
    ours = not out.is_symlink() and out.is_dir() and is_ours(out)
    if ours or _is_empty_folder(out):
        if not force:
            what = f"a {kind}" if ours else "an empty folder"
            raise SpecrtError(f"{out} already exists; pass --force to replace it (it is {what})")
        return
    what = "a file" if out.is_file() else "a link" if out.is_symlink() else "a folder with other files in it"
    raise SpecrtError(f"{out} already exists and is not a {kind} ({what}); specrt replaces only a {kind} or an "
                      "empty folder: choose another --out")


PARTIAL_PATTERN = re.compile(r"\.(?P<name>.+)\.partial-[0-9a-f]{8}")


def is_partial(path: Path) -> bool:
    """True for a writer's temporary directory name (`.NAME.partial-1234abcd`): never a bundle."""
    return PARTIAL_PATTERN.fullmatch(Path(path).name) is not None


def _lock(directory: Path) -> Optional[int]:
    """An fd holding an exclusive flock on `directory`, or None where locks are unavailable or
    someone else holds it."""
    if fcntl is None:
        return None
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live writer (or a filesystem without locks: then leave it be)
        os.close(fd)
        return None
    return fd


def remove_stale_partials(out: Path, note: Optional[Callable[[str], None]] = None) -> list[Path]:
    """Remove the `.NAME.partial-*` directories beside `out` whose writer is gone (no lock held:
    a run that was killed), saying so through `note`; returns them. Live writers keep theirs."""
    out = Path(out)
    if fcntl is None or not out.parent.is_dir():
        return []
    removed = []
    for entry in sorted(out.parent.glob(f".{glob.escape(out.name)}.partial-*")):
        match = PARTIAL_PATTERN.fullmatch(entry.name)
        if match is None or match["name"] != out.name or entry.is_symlink() or not entry.is_dir():
            continue
        fd = _lock(entry)
        if fd is None:
            continue
        try:
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)
        if not entry.exists():
            removed.append(entry)
            if note is not None:
                note(f"removed {entry}, left by an earlier run that was killed")
    return removed


@contextmanager
def partial_dir(out: Path, note: Optional[Callable[[str], None]] = None) -> Iterator[Path]:
    """A fresh hidden directory beside `out`, locked while the block runs and removed when it
    raises (Ctrl-C and, through the CLI's handler, SIGTERM included). Stale ones a killed run
    left beside `out` are removed first (remove_stale_partials)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out, note)
    work = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    lock = _lock(work)
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            os.close(lock)


def move_into_place(work: Path, out: Path, force: bool, is_ours: Callable[[Path], bool] = is_bundle,
                    kind: str = "specrt bundle") -> None:
    """Rename work -> out; with force, the old `out` (one refuse_existing allows) is moved aside
    first and deleted after, so `out` is at every moment the old output or the new one, whole."""
    stop_if_requested()  # a SIGTERM whose exception was swallowed while the work was written
    refuse_existing(out, force, is_ours, kind)  # it may have appeared while we worked
    old = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
    os.replace(work, out)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
