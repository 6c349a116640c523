"""Model families as plug-ins: a bundle's manifest names its family, and this registry maps the
name to the one plug-in that opens, describes and serves it (transformers' Auto classes, diffusers'
pipelines).

    family, raw = read_bundle("bundle/")        # manifest.json read once; damage is one line
    pipe = open_bundle("bundle/", backend="ort") # the family's pipeline (Pipeline.from_bundle does this)

Everything generic (the CLI, bench, serving, the C API, inspect) goes through `read_bundle` /
`open_bundle` and the Family interface (runtime/families/base.py); adding a family is a folder
beside these plug-ins plus one line in FAMILIES.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from specrt.errors import SpecrtError
from specrt.runtime.families.base import Family

# manifest "family" -> the module whose FAMILY is its plug-in (imported when first used: a family's
# heavy dependencies stay unloaded until a bundle of it is opened)
FAMILIES: dict[str, str] = {
    "llamagen": "specrt.runtime.families.llamagen",      # LlamaGen-layout VQ generators: c2i, t2i, the demos
    "continuous": "specrt.runtime.families.continuous",  # MAR-style diffusion-head models (cspd)
    "unified": "specrt.runtime.families.unified",        # Janus, Emu3, Lumina-mGPT: text and image in one vocabulary
}
DEFAULT_FAMILY = "llamagen"  # manifests written before families were named carry none
DEMO_FAMILIES: dict[str, str] = {"mar": "continuous", "chameleon": "unified"}  # embedded demos outside the LlamaGen family


def family(name: str) -> Family:
    """The plug-in registered for `name` (one line naming the known families if there is none)."""
    if name not in FAMILIES:
        raise SpecrtError(f"unknown model family {name!r}; this specrt knows {', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[name]).FAMILY


def read_bundle(path: str | Path) -> tuple[Family, dict[str, Any]]:
    """(the bundle's family, its raw manifest): the file is read and parsed once, and what is wrong
    with it (missing, not JSON, not an object, an unknown family, an interrupted write's temporary
    folder) is one line before any family's own code runs."""
    from specrt.manifest import read_manifest_json

    raw, manifest_path = read_manifest_json(path)
    if not isinstance(raw, dict):
        raise SpecrtError(f"{manifest_path} must hold a JSON object, not {type(raw).__name__}")
    name = raw.get("family", DEFAULT_FAMILY)
    if not isinstance(name, str):
        raise SpecrtError(f"{manifest_path}: 'family' must be a string, got {name!r:.40}")
    return family(name), raw


def open_bundle(path: str | Path, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
    """The pipeline of the family the bundle's manifest names, on `backend`."""
    plugin, _ = read_bundle(path)
    return plugin.open(Path(path), backend=backend, threads=threads, **options)


def bundle_family(path: str | Path) -> str:
    """The name of the family a bundle holds (its manifest read and checked, read_bundle)."""
    return read_bundle(path)[0].name


def pipeline_family(pipeline: Any) -> Family:
    """The family whose pipeline class `pipeline` is an instance of (serving gets pipelines built
    elsewhere too: an embedded demo's); matched by the class's module and name, importing nothing,
    the most derived class first (a family's pipeline may extend another's)."""
    plugins = [family(name) for name in FAMILIES]
    for cls in type(pipeline).__mro__:
        name = f"{cls.__module__}:{cls.__qualname__}"
        for plugin in plugins:
            if getattr(plugin, "pipeline_class", None) == name:
                return plugin
    raise SpecrtError(f"{type(pipeline).__name__} is no registered family's pipeline ({', '.join(FAMILIES)})")


def family_for(bundle: str | Path | None, demo: str | None) -> Family:
    """The family a command runs: the bundle manifest's (read_bundle: its damage is one line),
    else the embedded demo's (LlamaGen's c2i/t2i demos unless DEMO_FAMILIES names another)."""
    if bundle is not None:
        return read_bundle(bundle)[0]
    return family(DEMO_FAMILIES.get(demo or "", DEFAULT_FAMILY))
