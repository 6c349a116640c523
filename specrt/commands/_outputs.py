"""What generate writes, for every family: images as PNG files, tokens as .npy.

Every file is written to a hidden temporary name beside its destination and renamed into place
when complete, so an interrupted or failed run never leaves a truncated PNG or .npy that looks
like a result (a rename within one folder is atomic on POSIX filesystems).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import numpy as np


@contextlib.contextmanager
def written_atomically(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` to write; renamed to `path` on success, removed on failure."""
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def save_tokens(tokens: np.ndarray, path: Path) -> Path:
    """tokens as .npy at exactly `path` (np.save would append .npy to other names): VQ codes
    [N, grid, grid] as int64, continuous latents [N, seq_len, C] in their own float dtype."""
    tokens = np.asarray(tokens)
    with written_atomically(path) as partial:
        with open(partial, "wb") as f:
            np.save(f, tokens if np.issubdtype(tokens.dtype, np.floating) else tokens.astype(np.int64))
    return path


def save_images(images: np.ndarray, out: Path, count: int) -> list[Path]:
    """img.png for one image; img_0.png, img_1.png, ... for several (into an existing folder)."""
    from PIL import Image

    paths = [out] if count == 1 else [out.with_name(f"{out.stem}_{i}{out.suffix or '.png'}") for i in range(count)]
    for image, path in zip(images, paths):
        with written_atomically(path) as partial:
            Image.fromarray(image).save(partial, format="PNG")
    return paths
