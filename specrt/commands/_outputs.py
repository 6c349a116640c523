"""What generate writes, for every family: images as PNG files, tokens as .npy."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def save_tokens(tokens: np.ndarray, path: Path) -> Path:
    """tokens as .npy at exactly `path` (np.save would append .npy to other names): VQ codes
    [N, grid, grid] as int64, continuous latents [N, seq_len, C] in their own float dtype."""
    tokens = np.asarray(tokens)
    with open(path, "wb") as f:
        np.save(f, tokens if np.issubdtype(tokens.dtype, np.floating) else tokens.astype(np.int64))
    return path


def save_images(images: np.ndarray, out: Path, count: int) -> list[Path]:
    """img.png for one image; img_0.png, img_1.png, ... for several (into an existing folder)."""
    from PIL import Image

    paths = [out] if count == 1 else [out.with_name(f"{out.stem}_{i}{out.suffix or '.png'}") for i in range(count)]
    for image, path in zip(images, paths):
        Image.fromarray(image).save(path)
    return paths
