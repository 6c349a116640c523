"""What generate writes, for every family: images in the format --out names (PNG by default), tokens as .npy.

Every file is written to a hidden temporary name beside its destination and renamed into place
when complete, so an interrupted or failed run never leaves a truncated PNG or .npy that looks
like a result (a rename within one folder is atomic on POSIX filesystems).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

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


# Suffix -> Pillow format of the image files --out may name: the ones that store 8-bit RGB whole
# (GIF would quantize to 256 colours, so it is left out). Others are refused before a model loads.
IMAGE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".bmp": "BMP",
                 ".tif": "TIFF", ".tiff": "TIFF", ".ppm": "PPM"}
DEFAULT_IMAGE_SUFFIX = ".png"


def image_formats() -> dict[str, str]:
    """IMAGE_FORMATS that this Pillow can write (WebP needs libwebp in the wheel)."""
    from PIL import Image

    Image.init()
    return {suffix: name for suffix, name in IMAGE_FORMATS.items() if name in Image.SAVE}


def image_output(out: Path, name: str = "--out") -> Path:
    """The image path generate writes for `out`: the file type its suffix names, checked.

    Why: a name ending in .jpg holding PNG bytes breaks every tool that trusts the suffix, so the
    suffix picks the format. A name without a suffix gets .png (the wrote ... line shows it); a
    suffix that is no image type we write is one line, before a model loads."""
    if not out.suffix:
        return out.with_name(out.name + DEFAULT_IMAGE_SUFFIX)
    formats = image_formats()
    if out.suffix.lower() not in formats:
        from specrt.errors import SpecrtError

        raise SpecrtError(f"{name} {out}: {out.suffix!r} is not an image type specrt writes; "
                          f"use one of {', '.join(formats)}")
    return out


def save_images(images: np.ndarray, out: Path, count: int) -> list[Path]:
    """img.png for one image; img_0.png, img_1.png, ... for several (into an existing folder), each
    in the format its suffix names (image_output; PNG where there is none)."""
    from PIL import Image

    suffix = out.suffix or DEFAULT_IMAGE_SUFFIX
    paths = [out] if count == 1 else [out.with_name(f"{out.stem}_{i}{suffix}") for i in range(count)]
    kind = image_formats().get(suffix.lower(), "PNG")
    options = {"quality": 95} if kind in ("JPEG", "WEBP") else {}
    for image, path in zip(images, paths):
        with written_atomically(path) as partial:
            Image.fromarray(image).save(partial, format=kind, **options)
    return paths


def summary_line(paths: Sequence[Path], method: str, summary: dict[str, Any], sampling: Any,
                 images: Optional[np.ndarray] = None) -> str:
    """generate's one closing line, the same for every model family:

        wrote img.png  (2 images 32x32, sd: 128 tokens, 60 target forwards, mean accepted length 2.13, 0.41 s;
        sampling cfg 2, temperature 1, top-k 0, top-p 1)

    Why one shape: each family's stats name their counters differently (a continuous model
    counts target passes and tokens per pass, a unified one has no host-byte count on every
    path), and a line that changes with the model cannot be compared or parsed. The family's
    full numbers stay in --stats."""
    from specrt.runtime.defaults import as_dict, describe

    forwards = summary.get("target_forwards", summary.get("target_passes"))
    accepted = summary.get("mean_accepted_length", summary.get("tokens_per_target_pass"))
    seconds = summary.get("seconds")
    seconds = seconds.get("total") if isinstance(seconds, dict) else seconds
    parts = [f"{summary['tokens']} tokens"]
    if forwards is not None:
        parts.append(f"{forwards} target forwards")
    if accepted is not None:
        parts.append(f"mean accepted length {float(accepted):.2f}")
    if seconds is not None:
        parts.append(f"{float(seconds):.2f} s")
    shown = f"{method}: {', '.join(parts)}"
    if images is not None and np.ndim(images) == 4:
        count, height, width = images.shape[:3]
        shown = f"{count} image{'s' if count != 1 else ''} {width}x{height}, {shown}"
    used = sampling if isinstance(sampling, dict) else as_dict(sampling)
    return f"wrote {', '.join(str(p) for p in paths)}  ({shown}; sampling {describe(used)})"
