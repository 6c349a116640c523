"""The one-line warning `generate` and `bench` print when a quantized bundle runs on a backend its
graphs were not made for: it runs, slower than the fp32 bundle it came from (ModelOpt's int8 QDQ on
onnxruntime CPU: 6x), so it is a warning, not an error (specrt.engines.quantize.backend_advice)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def warn_backend(raw: dict[str, Any], root: Path, backend: str) -> None:
    """Print backend_advice's line on stderr, if the bundle (manifest JSON `raw` at `root`) needs one."""
    from specrt.engines.quantize import backend_advice

    advice = backend_advice(raw, root, backend)
    if advice:
        click.echo(advice, err=True)


def warn_bundle_backend(bundle: Path, backend: str) -> None:
    """warn_backend for a bundle folder (its manifest.json read here)."""
    from specrt.runtime.family_registry import read_manifest_file

    manifest = read_manifest_file(bundle)
    warn_backend(manifest.raw, manifest.root, backend)
