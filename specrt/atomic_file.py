"""Writing one file whole: a hidden sibling is written, then renamed onto the destination.

Why: a reader (a user, a script, a bench run reading a tree plan) must never see half a file,
so every file specrt writes goes through here — the rename within one folder is atomic on
POSIX filesystems. The sibling is created with open()'s own mode (0666 less the umask), not
tempfile.mkstemp's 0600: a JSON or PNG a user asked for is readable by others exactly when a
file they made with any other tool would be. Pure os/pathlib (and specrt.termination's flag), so every layer can use it.
"""
from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

from specrt.termination import stop_if_requested

PathLike = Union[str, "os.PathLike[str]"]


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A new, empty hidden file beside `path` for the block to write (by name: Pillow, numpy and
    matplotlib take a path); renamed onto `path` when the block ends, removed when it raises."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield partial
        stop_if_requested()  # a SIGTERM whose exception was swallowed while the block wrote
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_bytes(path: PathLike, data: bytes, durable: bool = False) -> Path:
    """`data` at `path`, whole or not at all; durable: flushed to the disk before the rename (a
    cache entry that must survive a power cut)."""
    with atomic_path(path) as partial:
        with open(partial, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
    return Path(path)


def write_text(path: PathLike, text: str) -> Path:
    """`text` (UTF-8) at `path`, whole or not at all."""
    return write_bytes(path, text.encode("utf-8"))
