"""Every path a user names for specrt to write is checked here, before any work.

Why: an output that cannot be written should cost a second, not a model load and minutes of
generation followed by a traceback. The CLI passes each output flag through one of these
before it loads anything; each failure is one SpecrtError line naming the flag and the fix.

The rule docs/concepts/bundle.md states: specrt creates no missing parent folders. A file output
(`generate --out img.png`, `--stats`, `bench --json`) goes into a folder that must exist and
accept new files; a folder output (`export --out bundle`, `train-draft --out head`) is created
itself, in a parent folder that must exist. Writability is tried, not guessed from permission
bits (root ignores them; /proc and /sys and read-only mounts refuse everyone): a hidden probe
file is created in the folder and removed at once. Pure os/pathlib, no torch.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Optional, Union

from specrt.errors import SpecrtError

PathLike = Union[str, "os.PathLike[str]"]


def _folder_accepts_files(flag: str, path: Path, folder: Path) -> None:
    """SpecrtError unless `folder` exists, is a folder and a new file can be created in it."""
    shown = str(folder) if str(folder) else "."
    if not folder.exists():
        raise SpecrtError(f"{flag} {path}: the folder {shown} does not exist (specrt creates no parent folders: "
                          f"mkdir -p {shown} first)")
    if not folder.is_dir():
        raise SpecrtError(f"{flag} {path}: {shown} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".specrt-write-check-", dir=folder)
    except OSError as exc:
        reason = "it takes no new files" if exc.errno == errno.ENOENT else (exc.strerror or str(exc)).lower()
        raise SpecrtError(f"{flag} {path}: cannot write into {shown} ({reason})") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def named(flag: str, path: PathLike) -> Path:
    """`path` as a Path, refusing an empty or blank one: pathlib reads "" as ".", the current
    folder, which no user means (a script's unset variable); the CLI refuses it as it parses
    (specrt.commands._path_flags), this is the same rule for the Python API."""
    if not str(os.fspath(path)).strip():
        raise SpecrtError(f"{flag} {str(os.fspath(path))!r} names no file or folder (an unset variable?); give a path")
    return Path(path)


def file_name(flag: str, path: PathLike) -> Path:
    """`path` as a path that names a file: not blank and not ending in a folder (`.`, `..`, `x/`)."""
    raw = str(os.fspath(path))
    path = named(flag, path)
    if path.name in ("", ".", "..") or raw.endswith(os.sep):
        raise SpecrtError(f"{flag} {raw} names a folder; name a file to write")
    return path


def output_file(flag: str, path: Optional[PathLike]) -> Optional[Path]:
    """`path` as a file specrt may write (create or replace), or SpecrtError; None passes through."""
    if path is None:
        return None
    path = file_name(flag, path)
    if path.is_dir():
        raise SpecrtError(f"{flag} {path} is a folder; name a file to write")
    _folder_accepts_files(flag, path, path.parent)
    if path.exists() and not os.access(path, os.W_OK):
        raise SpecrtError(f"{flag} {path} exists and cannot be written (permission denied)")
    return path


def output_folder(flag: str, path: Optional[PathLike], write_into_existing: bool = False) -> Optional[Path]:
    """`path` as a folder specrt may create (or, with write_into_existing, add files to when it
    exists: a training run's output it resumes); None passes through. Whether an existing folder
    may be replaced (--force) is the caller's rule."""
    if path is None:
        return None
    path = named(flag, path)
    if path.exists() and not path.is_dir():
        raise SpecrtError(f"{flag} {path} is a file; name a folder to write")
    if write_into_existing and path.is_dir():
        _folder_accepts_files(flag, path, path)
    else:
        _folder_accepts_files(flag, path, path.parent)
    return path


def cache_root() -> Path:
    """Where specrt keeps what it can make again (exported demo bundles, engines, --method auto's
    choices): $SPECRT_CACHE_DIR, else $XDG_CACHE_HOME/specrt, else ~/.cache/specrt."""
    if os.environ.get("SPECRT_CACHE_DIR"):
        return Path(os.environ["SPECRT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specrt"


def cache_folder(flag: str, path: Optional[PathLike]) -> Optional[Path]:
    """A cache folder the user names: created when missing (with its parents: it is a cache, the
    one kind of output specrt makes folders for) and checked to take files; None passes through."""
    if path is None:
        return None
    path = named(flag, path)
    if path.exists() and not path.is_dir():
        raise SpecrtError(f"{flag} {path} is a file; name a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecrtError(f"{flag} {path}: cannot create it ({(exc.strerror or str(exc)).lower()})") from None
    _folder_accepts_files(flag, path, path)
    return path
