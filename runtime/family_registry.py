"""The registry of model families: a bundle's manifest names its family, and this registry maps the
name to the one plug-in that opens, describes and serves it (transformers' Auto classes, diffusers'
pipelines).

    family, manifest = read_bundle("bundle/")   # manifest.json read once, checked by its family
    pipe = open_bundle(manifest, backend="ort")  # the family's pipeline (Pipeline.from_bundle does this)

A bundle is read once: read_manifest_file reads manifest.json and picks the family it names, the
family's `parse` checks it (a discrete bundle's files' sizes and sha256 too), and what it returns
is handed down to open, describe and serving; every entry point also takes that object in place
of the path. Everything generic (the CLI, bench, serving, the C API, inspect) goes through these
functions and the Family interface (runtime/family.py); adding a family is a folder in
runtime/families/ plus one line in FAMILIES.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.manifest import read_manifest_json
from specrt.runtime.family import Family
from specrt.runtime.plugins import load

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
    return load(f"{FAMILIES[name]}:FAMILY", f"model family {name!r}")


def where_method_runs(method: Any, here: str) -> str:
    """The families other than `here` (a family's name) that run `method`, as the end of an
    "unknown method" line: `--help` lists every family's methods, so a method this model lacks is
    named with the models that have it, not called unknown. '' when no family has it."""
    others = [name for name in FAMILIES if name != here and method in family(name).methods]
    if not isinstance(method, str) or not others:
        return ""
    def runs(name: str) -> str:
        demos = ["the default demo"] if name == DEFAULT_FAMILY else []
        demos += [f"--demo {demo}" for demo, owner in DEMO_FAMILIES.items() if owner == name]
        return f"{family(name).description} models ({', '.join([*demos, 'their bundles'])})"
    return f"; {method} is a method of {' and of '.join(runs(name) for name in others)}"


def named_family(raw: Any, where: Path) -> Family:
    """The plug-in of the family a manifest's parsed JSON names (`where`: the file, for messages)."""
    if not isinstance(raw, dict):
        raise SpecrtError(f"{where} must hold a JSON object, not {type(raw).__name__}")
    name = raw.get("family", DEFAULT_FAMILY)
    if not isinstance(name, str):
        raise SpecrtError(f"{where}: 'family' must be a string, got {name!r:.40}")
    return family(name)


@dataclass(frozen=True)
class ManifestFile:
    """A bundle's manifest.json read once and the family it names, before the family's own checks.

    Why a step of its own: a command checks its flags against the family first (a typo costs a
    second, not a hash of gigabytes of graphs), then `parse` checks the same JSON without reading
    the file again."""

    family: Family
    raw: dict[str, Any]
    root: Path

    def parse(self) -> Any:
        """The family's checked manifest (Family.parse): what open_bundle and the plug-in take."""
        return self.family.parse(self.raw, self.root)


def read_manifest_file(path: str | Path) -> ManifestFile:
    """manifest.json of the bundle at `path`, read and parsed once: what is wrong with it (missing,
    not JSON, not an object, an unknown family, an interrupted write's temporary folder) is one
    line before any family's own code runs."""
    raw, manifest_path = read_manifest_json(path)
    return ManifestFile(named_family(raw, manifest_path), raw, manifest_path.parent)


def read_bundle(bundle: Any) -> tuple[Family, Any]:
    """(the bundle's family, its manifest checked by that family): `bundle` is the bundle's
    folder, or a manifest read before (ManifestFile, or what a family's parse returned), which
    is not read again."""
    if isinstance(bundle, (str, os.PathLike)):
        bundle = read_manifest_file(bundle)
    if isinstance(bundle, ManifestFile):
        return bundle.family, bundle.parse()
    return named_family(bundle.raw, bundle.root), bundle


def open_bundle(bundle: Any, backend: str = "ort", threads: int | None = None, **options: Any) -> Any:
    """The pipeline of the family the bundle's manifest names, on `backend` (`bundle` as read_bundle's)."""
    plugin, manifest = read_bundle(bundle)
    return plugin.open(manifest, backend=backend, threads=threads, **options)


def bundle_family(path: str | Path) -> str:
    """The name of the family a bundle holds (its manifest file read, read_manifest_file)."""
    return read_manifest_file(path).family.name


def modules_family(target: Any) -> Optional[Family]:
    """The family whose own pipeline runs PyTorch modules with this target (Family.takes_modules),
    None for the LlamaGen layout Pipeline.from_torch runs itself."""
    for name in FAMILIES:
        plugin = family(name)
        if plugin.takes_modules(target):
            return plugin
    return None


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
    """The family a command runs: the bundle manifest's (read_manifest_file: its damage is one
    line), else the embedded demo's (LlamaGen's c2i/t2i demos unless DEMO_FAMILIES names another)."""
    if bundle is not None:
        return read_manifest_file(bundle).family
    return family(DEMO_FAMILIES.get(demo or "", DEFAULT_FAMILY))
