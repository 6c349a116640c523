"""What generate writes, for every family: images in the format --out names (PNG by default), tokens as .npy.

Every file is written to a hidden temporary name beside its destination and renamed into place
when complete, so an interrupted or failed run never leaves a truncated PNG or .npy that looks
like a result (a rename within one folder is atomic on POSIX filesystems).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import click
import numpy as np

from specrt.atomic_file import atomic_path, write_text
from specrt.commands._flag_groups import flag_group
from specrt.runtime.family import Family


@dataclass(frozen=True)
class OutputFlags:
    """What generate writes: --out, --sheet, --stats, --save-tokens, --tokens-only."""

    out: Path = Path("img.png")
    sheet: Optional[Path] = None
    stats_path: Optional[Path] = None
    tokens_path: Optional[Path] = None
    tokens_only: bool = False

    def checked(self) -> "OutputFlags":
        """The flags with every file generate will write checked before a model loads (specrt.paths:
        its folder exists and takes new files; no folder is created), --out as the image file it
        names (image_output) and the sheet's name free (check_sheet)."""
        from specrt.paths import file_name, output_file

        out = file_name("--out", self.out) if self.tokens_only else image_output(self.out)
        tokens_path = self.tokens_path
        if not self.tokens_only:
            output_file("--out", out)
        elif tokens_path is None:
            tokens_path = output_file("--out", tokens_output(out))
        output_file("--stats", self.stats_path)
        output_file("--save-tokens", self.tokens_path)
        return dataclasses.replace(self, out=out, tokens_path=tokens_path,
                                   sheet=check_sheet(self.sheet, out, self.tokens_only))

    def report(self, family: Family, result: Any, method: str, per_condition: int = 1,
               auto: Optional[dict[str, Any]] = None) -> str:
        """Write one generate call's files (write_results) and its --stats JSON (the family's
        summary, and what --method auto chose: `auto`); returns the closing line (summary_line)."""
        images = None if self.tokens_only else result.images
        paths, others = write_results(images, result.tokens, self.out, self.tokens_only, self.tokens_path, self.sheet,
                                      per_condition)
        summary = {"method": method, **({"auto": auto} if auto else {}), **family.summary(result)}
        if self.stats_path:
            write_text(self.stats_path, json.dumps(summary, indent=2) + "\n")
        return summary_line(paths, method, summary, getattr(result, "sampling", None) or {}, images, others)


output_flags = flag_group("outputs", OutputFlags, [
    click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("img.png"), show_default=True,
                 help="Image to write, in the type its suffix names (.png, .jpg, .webp, ...; none: .png is added); "
                      "numbered when several images are asked for."),
    click.option("--sheet", type=click.Path(dir_okay=False, path_type=Path),
                 help="Also write one contact sheet here: every image of the call on a grid (a row per class or "
                      "prompt with --num-images)."),
    click.option("--stats", "stats_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="Also write the stats as JSON here."),
    click.option("--save-tokens", "tokens_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="Also write the image tokens here as .npy (int64 [N, grid, grid], N = number of --class)."),
    click.option("--tokens-only", is_flag=True,
                 help="Skip the VQ decode and the PNG: write only the tokens (to --save-tokens, default: --out as "
                      ".npy)."),
])


def tokens_output(out: Path) -> Path:
    """--tokens-only's file without --save-tokens: --out with .npy for its suffix (x.png, x. and x: x.npy)."""
    return out.with_name(out.name.rstrip(".") or out.name).with_suffix(".npy")


def save_tokens(tokens: np.ndarray, path: Path) -> Path:
    """tokens as .npy at exactly `path` (np.save would append .npy to other names): VQ codes
    [N, grid, grid] as int64, continuous latents [N, seq_len, C] in their own float dtype."""
    tokens = np.asarray(tokens)
    with atomic_path(path) as partial:
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


def image_output(out: Path, name: str = "--out", formats: Optional[dict[str, str]] = None) -> Path:
    """The image path generate writes for `out`: the file type its suffix names, checked.

    Why: a name ending in .jpg holding PNG bytes breaks every tool that trusts the suffix, so the
    suffix picks the format. A name without a suffix gets .png (the wrote ... line shows it; `x.`,
    a dot with no type after it, is `x.png`, not `x..png`); a suffix that is no image type we write
    (`formats`, default image_formats()) is one line, before a model loads."""
    from specrt.errors import SpecrtError
    from specrt.paths import file_name

    out = file_name(name, out)
    if not out.suffix:
        stem = out.name.rstrip(".")
        if not stem:
            raise SpecrtError(f"{name} {out}: name a file, e.g. img.png")
        return out.with_name(stem + DEFAULT_IMAGE_SUFFIX)
    formats = image_formats() if formats is None else formats
    if out.suffix.lower() not in formats:
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
        with atomic_path(path) as partial:
            Image.fromarray(image).save(partial, format=kind, **options)
    return paths


def summary_line(paths: Sequence[Path], method: str, summary: dict[str, Any], sampling: Any,
                 images: Optional[np.ndarray] = None, others: Sequence[Path] = ()) -> str:
    """generate's one closing line, the same for every model family:

        wrote img.png  (2 images 32x32, sd: 128 tokens, 60 target forwards, mean accepted length 2.13, 0.41 s;
        sampling cfg 2, temperature 1, top-k 0, top-p 1)

    (--method auto: the method slot is `auto:CHOSEN`, e.g. auto:sjd(coupling=maximal,window=8), and the counters end
    with the cost model's prediction, "predicted 1.49x ar".)

    Why one shape: each family's stats name their counters differently (a continuous model
    counts target passes and tokens per pass, a unified one has no host-byte count on every
    path), and a line that changes with the model cannot be compared or parsed. The family's
    full numbers stay in --stats. `paths` are the images (a long run shown as its first and last),
    `others` the other files written (tokens, the contact sheet)."""
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
    if isinstance(summary.get("auto"), dict):  # --method auto: the method slot names the choice (auto:sd(...))
        parts.append(f"predicted {summary['auto']['predicted_speedup']:.2f}x ar")
    shown = f"{method}: {', '.join(parts)}"
    if images is not None and np.ndim(images) == 4:
        count, height, width = images.shape[:3]
        shown = f"{count} image{'s' if count != 1 else ''} {width}x{height}, {shown}"
    used = sampling if isinstance(sampling, dict) else as_dict(sampling)
    return f"wrote {shown_paths(paths, others)}  ({shown}; sampling {describe(used)})"


SHEET_GAP = 2          # pixels of grey between the tiles of a contact sheet
SHEET_MAX_SIDE = 8192  # a sheet's longer side at most: tiles are shrunk by a whole factor to fit


def sheet_columns(count: int, per_condition: int) -> int:
    """Columns of a contact sheet of `count` images: one row per class or prompt when several
    were asked for each (at most 16 a row), else as square a grid as the count allows."""
    if 1 < per_condition <= 16 and count > per_condition:
        return per_condition
    return max(1, int(np.ceil(np.sqrt(count))))


def save_sheet(images: np.ndarray, path: Path, columns: int) -> Path:
    """One image holding every image of the call on a grid, in call order, row by row.

    Why: a batch is judged at a glance, and opening fifty files to do it is what people skip.
    Tiles keep the images' own pixels unless the sheet's longer side would pass SHEET_MAX_SIDE,
    where each is shrunk by the smallest whole factor that fits (a 1024-image call of 384-pixel
    images would otherwise be a 12,000-pixel square). Written whole or not at all, in the format
    the suffix names (image_output)."""
    from PIL import Image

    images = np.asarray(images, dtype=np.uint8)
    count, height, width = images.shape[:3]
    rows = -(-count // columns)
    side = max(rows * (height + SHEET_GAP), columns * (width + SHEET_GAP))
    shrink = max(1, -(-side // SHEET_MAX_SIDE))
    tile_h, tile_w = max(1, height // shrink), max(1, width // shrink)
    sheet = Image.new("RGB", (columns * (tile_w + SHEET_GAP) + SHEET_GAP, rows * (tile_h + SHEET_GAP) + SHEET_GAP),
                      (128, 128, 128))
    for i, image in enumerate(images):
        tile = Image.fromarray(image)
        if shrink > 1:
            tile = tile.resize((tile_w, tile_h), Image.Resampling.BOX)
        row, column = divmod(i, columns)
        sheet.paste(tile, (SHEET_GAP + column * (tile_w + SHEET_GAP), SHEET_GAP + row * (tile_h + SHEET_GAP)))
    kind = image_formats().get((path.suffix or DEFAULT_IMAGE_SUFFIX).lower(), "PNG")
    with atomic_path(path) as partial:
        sheet.save(partial, format=kind, **({"quality": 95} if kind in ("JPEG", "WEBP") else {}))
    return path


def shown_paths(images: Sequence[Path], others: Sequence[Path] = (), most: int = 4) -> str:
    """The files a call wrote, for the closing line: every image, or the first and the last of a
    long numbered run (a 100-image call would otherwise print 100 names), then the other files
    (tokens, the contact sheet)."""
    names = [str(p) for p in images]
    if len(names) > most:
        names = [f"{names[0]} ... {names[-1]}"]
    return ", ".join(names + [str(p) for p in others])


def write_results(images: Optional[np.ndarray], tokens: np.ndarray, out: Path, tokens_only: bool,
                  tokens_path: Optional[Path], sheet: Optional[Path] = None,
                  per_condition: int = 1) -> tuple[list[Path], list[Path]]:
    """Everything generate writes for one call, for every family: the images (save_images), the
    tokens when asked, the contact sheet when asked. Returns (image paths, other paths) for
    summary_line."""
    paths = [] if tokens_only else save_images(images, out, len(tokens))
    others = []
    if tokens_only or tokens_path:
        others.append(save_tokens(tokens, tokens_path or tokens_output(out)))
    if sheet is not None and images is not None:
        others.append(save_sheet(images, sheet, sheet_columns(len(images), per_condition)))
    return paths, others


def check_sheet(sheet: Optional[Path], out: Path, tokens_only: bool) -> Optional[Path]:
    """--sheet checked before a model loads: images to lay out, a folder that takes the file, an
    image type (image_output) and a name that no image of the call takes (img.png, img_3.png)."""
    if sheet is None:
        return None
    from specrt.errors import SpecrtError
    from specrt.paths import output_file

    if tokens_only:
        raise SpecrtError("--sheet lays out the call's images, and --tokens-only makes none")
    sheet = image_output(sheet, "--sheet")
    output_file("--sheet", sheet)
    suffix = out.suffix or DEFAULT_IMAGE_SUFFIX
    numbered = (sheet.suffix == suffix and sheet.stem.startswith(f"{out.stem}_")
                and sheet.stem[len(out.stem) + 1:].isdigit())
    if sheet.parent.resolve() == out.parent.resolve() and (sheet.name == out.name or numbered):
        raise SpecrtError(f"--sheet {sheet} is a name the images of --out {out} take; give the sheet its own name")
    return sheet
