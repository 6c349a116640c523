"""The slice of a bundle the engine builder needs: its graphs, their files and profiles.

Reads manifest.json (docs/contracts.md, version 1) with the standard library alone, so
`specrt build --print-trtexec` works on a Jetson with nothing but this package installed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrt.errors import SpecrtError

MANIFEST = "manifest.json"
SUPPORTED_VERSIONS = (1,)


@dataclass(frozen=True)
class GraphEntry:
    """One graph of a bundle as manifest.json lists it (its dict kept verbatim in `spec`)."""

    name: str
    onnx_path: Path
    spec: dict[str, Any]


def read_manifest(bundle: str | Path) -> dict[str, Any]:
    """Load and sanity-check manifest.json of `bundle`; SpecrtError when it is not a bundle."""
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise SpecrtError(f"{bundle} is not a specrt bundle: {MANIFEST} not found (run `specrt export` first)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SpecrtError(f"{path} is not valid JSON: {exc}") from exc
    if manifest.get("format") != "specrt-bundle":
        raise SpecrtError(f"{path}: format is {manifest.get('format')!r}, expected 'specrt-bundle'")
    if manifest.get("version") not in SUPPORTED_VERSIONS:
        raise SpecrtError(f"{path}: manifest version {manifest.get('version')!r} is not supported (this specrt reads {SUPPORTED_VERSIONS})")
    if not isinstance(manifest.get("graphs"), dict) or not manifest["graphs"]:
        raise SpecrtError(f"{path}: no graphs listed")
    return manifest


def graph_entries(bundle: str | Path, only: list[str] | None = None) -> list[GraphEntry]:
    """The bundle's graphs in manifest order (or just `only`), each with its ONNX file checked to exist."""
    manifest = read_manifest(bundle)
    graphs = manifest["graphs"]
    names = list(graphs) if not only else only
    unknown = [n for n in names if n not in graphs]
    if unknown:
        raise SpecrtError(f"graph(s) {', '.join(unknown)} not in the bundle (it has {', '.join(graphs)})")
    entries = []
    for name in names:
        spec = graphs[name]
        if not isinstance(spec, dict) or "file" not in spec:
            raise SpecrtError(f"manifest graph {name!r} has no 'file'")
        onnx_path = Path(bundle) / spec["file"]
        if not onnx_path.is_file():
            raise SpecrtError(f"graph {name!r}: {onnx_path} is missing from the bundle")
        entries.append(GraphEntry(name=name, onnx_path=onnx_path, spec=spec))
    return entries
