"""The slice of a bundle the engine builder needs: each graph's ONNX file, entry and hash.

specrt.manifest reads and verifies manifest.json (sizes and sha256 of every file); this
module only lists the graphs to build, in manifest order, with the content hash the engine
cache keys on — taken from the verified manifest, so a multi-GB graph is hashed once.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrt.errors import SpecrtError
from specrt.manifest import Manifest, read_manifest


@dataclass(frozen=True)
class GraphEntry:
    """One graph of a bundle: its name, ONNX file, manifest entry (as JSON) and content hash."""

    name: str
    onnx_path: Path
    spec: dict[str, Any]
    onnx_sha256: str


def graph_entries(bundle: str | Path, only: list[str] | None = None, manifest: Manifest | None = None) -> list[GraphEntry]:
    """The bundle's graphs in manifest order (or just `only`), after the manifest's own checks."""
    manifest = manifest or read_manifest(bundle)
    names = list(only) if only else list(manifest.graphs)
    unknown = [n for n in names if n not in manifest.graphs]
    if unknown:
        raise SpecrtError(f"graph(s) {', '.join(unknown)} not in the bundle (it has {', '.join(manifest.graphs)})")
    entries = []
    for name in names:
        graph = manifest.graph(name)
        digest = hashlib.sha256(manifest.files[graph.file]["sha256"].encode())
        if graph.external_data:  # weights beside the graph change the engine as much as the graph does
            digest.update(manifest.files[graph.external_data]["sha256"].encode())
        entries.append(GraphEntry(name, manifest.graph_path(name), graph.to_json(), digest.hexdigest()))
    return entries
