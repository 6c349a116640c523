"""Writing a bundle directory atomically: work in a hidden sibling, rename only when complete.

A directory is a bundle exactly when it has a manifest.json whose hashes match, so every
writer of bundles (`specrt export`, `specrt quantize`) assembles its files in a hidden
temporary directory beside the destination and renames it into place at the end: an
interrupted or failed run never leaves a directory that looks complete. Pure os/shutil, no
torch, so tools that only rewrite graphs use it too.
"""
from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from specrt.errors import SpecrtError


def refuse_existing(out: Path, force: bool) -> None:
    """SpecrtError when `out` exists (a file, directory or dangling link) and force is off."""
    if (out.exists() or out.is_symlink()) and not force:
        raise SpecrtError(f"{out} already exists; pass --force to replace it")


@contextmanager
def partial_dir(out: Path) -> Iterator[Path]:
    """A fresh hidden directory beside `out`, removed when the block raises (Ctrl-C included)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def move_into_place(work: Path, out: Path, force: bool) -> None:
    """Rename work -> out; with force, the old `out` is moved aside first and deleted after."""
    refuse_existing(out, force)  # it may have appeared while we worked
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
