"""Read and validate a bundle's manifest.json (format "specrt-bundle", version 2: see VERSION).

The manifest is the only place the runtime, the engine builder and `specrt inspect` learn a
bundle's graphs, their I/O names, symbolic dims and optimization profiles (docs/contracts.md).
This module is pure json + hashlib on purpose: it must import on a Jetson that has numpy and
onnxruntime or TensorRT but no torch and no onnx package.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from specrt import validation
from specrt.errors import SpecrtError

FORMAT = "specrt-bundle"
# The one place the manifest version lives (writers and readers import it). 2: every prefill and
# step graph ends in the sampling head (inputs mix, uniforms; outputs probs, draws).
VERSION = 2
MANIFEST_NAME = "manifest.json"
ROLES = ("target", "draft", "vq", "text")
KINDS = ("prefill", "step", "chain", "tree", "growth", "decode", "encode")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "bool")
# The sampling head every prefill and step graph ends in (docs/contracts.md, "Sampling head"):
# name -> dtype of the inputs it adds and the outputs it appends.
HEAD_INPUTS = {"mix": "float32", "uniforms": "float32"}
HEAD_OUTPUTS = {"probs": "float32", "draws": "int32"}
HEAD_KINDS = ("prefill", "step", "chain", "tree")
# kinds no TensorRT engine is made of: a draft_growth's scores are float64, which TensorRT has no
# type for (its runner grows dynamic trees level by level; `specrt build` refuses them)
UNBUILT_KINDS = ("growth",)


DEFAULT_MAX_IMAGES = 32  # `export --max-batch`: images decoded together in one pass, 64 model rows under CFG


def rows_for_images(images: int) -> int:
    """Model rows (the graphs' `batch`) for `images` images under classifier-free guidance: a
    [cond; uncond] pair each. `limits.max_images` is what `specrt export --max-batch` counts,
    `limits.max_batch` these rows."""
    return 2 * images


Dim = Union[int, str]


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, dtype name (numpy spelling) and dims (int or symbolic)."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def symbolic_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX graph of the bundle with its I/O and the min/opt/max of every symbolic dim."""

    name: str
    file: str
    role: str
    kind: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    profile: dict[str, dict[str, int]]
    external_data: str | None = None
    # Set by `specrt quantize`: precision, tool and version, algorithm settings, calibration size.
    quantization: dict[str, Any] | None = None
    # A draft_tree graph's static shape (runtime/tree_call.py): its paths of child ranks.
    tree: tuple[tuple[int, ...], ...] | None = None
    # A draft_growth graph's dynamic tree (runtime/tree_call.py GrowthLayout): its depth and top_k.
    growth: dict[str, int] | None = None

    def input(self, name: str) -> TensorSpec:
        return _find(self.inputs, name, f"input of graph {self.name}")

    def output(self, name: str) -> TensorSpec:
        return _find(self.outputs, name, f"output of graph {self.name}")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    def shape_at(self, tensor: TensorSpec, level: str, **overrides: int) -> tuple[int, ...]:
        """Concrete shape of `tensor` at profile level 'min' | 'opt' | 'max'; `overrides` pin dims.

        Consistency of derived dims (total_len = cache_len + window) is the caller's job when
        it overrides only some of them.
        """
        return tuple(overrides.get(d, self.profile[d][level]) if isinstance(d, str) else d for d in tensor.shape)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.file, "role": self.role, "kind": self.kind, "opset": self.opset,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "profile": self.profile,
        }
        if self.external_data:
            out["external_data"] = self.external_data
        if self.quantization:
            out["quantization"] = dict(self.quantization)
        if self.tree is not None:
            out["tree"] = [list(path) for path in self.tree]
        if self.growth is not None:
            out["growth"] = dict(self.growth)
        return out


@dataclass(frozen=True)
class Manifest:
    """A validated manifest.json; `root` is the bundle directory the file names are relative to."""

    root: Path
    models: dict[str, Any]
    graphs: dict[str, GraphSpec]
    limits: dict[str, int]
    sampling_defaults: dict[str, float]
    neighbours: dict[str, Any] | None
    files: dict[str, dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    def graph(self, name: str) -> GraphSpec:
        try:
            return self.graphs[name]
        except KeyError:
            raise SpecrtError(f"bundle {self.root} has no graph {name!r} (it has: {', '.join(self.graphs)})") from None

    def graph_path(self, name: str) -> Path:
        return self.root / self.graph(name).file

    @property
    def neighbours_path(self) -> Path | None:
        return self.root / self.neighbours["file"] if self.neighbours else None


def _find(specs: tuple[TensorSpec, ...], name: str, what: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise SpecrtError(f"no {what} named {name!r} (has: {', '.join(s.name for s in specs)})")


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks so multi-GB external weights do not load into memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    """The manifest's `files` entry for one file: its sha256 and size in bytes."""
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def check_profile(graph: str, profile: dict[str, dict[str, int]]) -> None:
    """Raise SpecrtError unless every dim has 1 <= min <= opt <= max and, where a graph has
    cache_len, window and total_len, total_len = cache_len + window at min, opt and max."""
    for dim, levels in profile.items():
        try:
            lo, opt, hi = (validation.integer("", levels[level], strings=False) for level in ("min", "opt", "max"))
        except (KeyError, TypeError, SpecrtError):
            raise SpecrtError(f"manifest: graph {graph}: profile of {dim!r} needs integer min/opt/max, "
                              f"got {levels!r:.80}") from None
        levels.update(min=lo, opt=opt, max=hi)  # 64.0 in the JSON is the int 64 from here on
        if not 0 <= lo <= opt <= hi:
            raise SpecrtError(f"manifest: graph {graph}: profile of {dim!r} is not min <= opt <= max: {levels}")
    if {"cache_len", "window", "total_len"} <= profile.keys():
        for level in ("min", "opt", "max"):
            total = profile["total_len"][level]
            parts = profile["cache_len"][level] + profile["window"][level]
            if total != parts:
                raise SpecrtError(
                    f"manifest: graph {graph}: profile {level} has total_len {total} != cache_len + window = {parts}")


def _tensor(graph: str, raw: Any) -> TensorSpec:
    try:
        name, dtype, shape = raw["name"], raw["dtype"], raw["shape"]
    except (KeyError, TypeError):
        raise SpecrtError(f"manifest: graph {graph}: tensor entry needs name, dtype and shape, got {raw!r}") from None
    if not isinstance(name, str) or not name or not isinstance(shape, list):
        raise SpecrtError(f"manifest: graph {graph}: tensor entry needs a name string and a shape list, got {raw!r:.80}")
    if dtype not in DTYPES:
        raise SpecrtError(f"manifest: graph {graph}: tensor {name} has unknown dtype {dtype!r}")
    if not all(isinstance(d, (int, str)) and not isinstance(d, bool) for d in shape):
        raise SpecrtError(f"manifest: graph {graph}: tensor {name} has a dim that is neither int nor name: {shape}")
    return TensorSpec(name=name, dtype=dtype, shape=tuple(shape))


def _check_head(spec: GraphSpec) -> None:
    """A prefill, step or chain graph must carry the sampling head's inputs and outputs with their dtypes."""
    problems = []
    for what, tensors, wanted in (("input", spec.inputs, HEAD_INPUTS), ("output", spec.outputs, HEAD_OUTPUTS)):
        dtypes = {t.name: t.dtype for t in tensors}
        for name, dtype in wanted.items():
            if name not in dtypes:
                problems.append(f"no {what} {name!r}")
            elif dtypes[name] != dtype:
                problems.append(f"{what} {name!r} is {dtypes[name]}, not {dtype}")
    if problems:
        raise SpecrtError(f"manifest: graph {spec.name} does not end in the sampling head ({'; '.join(problems)}); "
                          "re-export the bundle with this specrt")


def parse_graph(name: str, raw: dict[str, Any]) -> GraphSpec:
    """Validate one `graphs` entry: known role/kind, typed I/O, a profile for every symbolic dim."""
    try:
        spec = GraphSpec(
            name=name, file=raw["file"], role=raw["role"], kind=raw["kind"], opset=int(raw["opset"]),
            inputs=tuple(_tensor(name, t) for t in raw["inputs"]),
            outputs=tuple(_tensor(name, t) for t in raw["outputs"]),
            profile={d: dict(v) for d, v in raw.get("profile", {}).items()},
            external_data=raw.get("external_data"), quantization=raw.get("quantization"),
            tree=tuple(tuple(int(r) for r in path) for path in raw["tree"]) if "tree" in raw else None,
            growth={key: int(raw["growth"][key]) for key in ("depth", "top_k")} if "growth" in raw else None,
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SpecrtError(f"manifest: graph {name} is missing or has a malformed field: {exc}") from None
    for key in ("file", "external_data"):
        value = getattr(spec, key)
        if value is not None and not _relative_name(value):
            raise SpecrtError(f"manifest: graph {name} {key} must be a file name inside the bundle, got {value!r}")
    if spec.role not in ROLES or spec.kind not in KINDS:
        raise SpecrtError(f"manifest: graph {name} has role {spec.role!r} / kind {spec.kind!r}; "
                          f"expected role in {ROLES}, kind in {KINDS}")
    if spec.kind in HEAD_KINDS:
        _check_head(spec)
    if (spec.kind == "tree") != (spec.tree is not None):
        raise SpecrtError(f"manifest: graph {name}: a \"tree\" field goes with kind \"tree\" and only there")
    if (spec.kind == "growth") != (spec.growth is not None) or (spec.growth and min(spec.growth.values()) < 1):
        raise SpecrtError(f"manifest: graph {name}: a \"growth\" field (depth and top_k >= 1) goes with kind "
                          f"\"growth\" and only there")
    for tensor in spec.inputs + spec.outputs:
        missing = [d for d in tensor.symbolic_dims if d not in spec.profile]
        if missing:
            raise SpecrtError(f"manifest: graph {name}: dims {missing} of {tensor.name} have no profile")
    check_profile(name, spec.profile)
    return spec


def parse_manifest(raw: dict[str, Any], root: Path) -> Manifest:
    """Validate a manifest's structure (not the files it names) and wrap it."""
    if isinstance(raw, dict) and raw.get("family") == "continuous":
        raise SpecrtError(f"bundle {root} holds a continuous (MAR-style) model, not a LlamaGen one: open it "
                          "with Pipeline.from_bundle or specrt.runtime.families.open_bundle (methods ar, cspd)")
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SpecrtError(f"{root / MANIFEST_NAME} is not a specrt bundle manifest (format must be {FORMAT!r})")
    version = raw.get("version")
    if version != VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
        advice = ("it was written by a newer specrt; upgrade specrt or re-export it with this one"
                  if newer else "re-export it with this specrt (`specrt export ...`)")
        raise SpecrtError(f"bundle {root} uses manifest version {version!r}; this specrt reads version {VERSION}: {advice}")
    for key in ("models", "graphs", "files"):
        if not isinstance(raw.get(key), dict):
            raise SpecrtError(f"manifest: missing or malformed {key!r} section")
    for key in ("limits", "sampling_defaults"):
        if not isinstance(raw.get(key, {}), dict):
            raise SpecrtError(f"manifest: {key!r} must be an object, got {raw[key]!r:.60}")
    neighbours = raw.get("neighbours")
    if neighbours is not None and not (isinstance(neighbours, dict) and _relative_name(neighbours.get("file"))):
        raise SpecrtError(f"manifest: neighbours must be an object naming a file inside the bundle, got {neighbours!r:.60}")
    embeddings = raw.get("token_embeddings")
    if embeddings is not None and not (isinstance(embeddings, dict) and _relative_name(embeddings.get("file"))):
        raise SpecrtError(f"manifest: token_embeddings must be an object naming a file inside the bundle, "
                          f"got {embeddings!r:.60}")
    for rel, record in raw["files"].items():
        if not _relative_name(rel) or not isinstance(record, dict):
            raise SpecrtError(f"manifest: files entry {rel!r} must name a file inside the bundle and map it to "
                              f"its sha256 and bytes, got {record!r:.60}")
    graphs = {name: parse_graph(name, g) for name, g in raw["graphs"].items()}
    return Manifest(
        root=root, models=raw["models"], graphs=graphs, limits=dict(raw.get("limits", {})),
        sampling_defaults=dict(raw.get("sampling_defaults", {})), neighbours=raw.get("neighbours"),
        files=raw["files"], raw=raw,
    )


def _relative_name(name: Any) -> bool:
    """A file name the manifest may use: a non-empty relative path that stays inside the bundle."""
    if not isinstance(name, str) or not name or "\x00" in name:
        return False
    parts = Path(name).parts
    return not Path(name).is_absolute() and ".." not in parts


def verify_files(manifest: Manifest, check_hashes: bool = True) -> None:
    """Every file the manifest names exists, is listed under `files`, and matches its size and sha256."""
    named = [g.file for g in manifest.graphs.values()]
    named += [g.external_data for g in manifest.graphs.values() if g.external_data]
    if manifest.neighbours:
        named.append(manifest.neighbours["file"])
    if isinstance(manifest.raw.get("token_embeddings"), dict):
        named.append(manifest.raw["token_embeddings"]["file"])
    unlisted = sorted(set(named) - manifest.files.keys())
    if unlisted:
        raise SpecrtError(f"manifest: files {unlisted} are used but have no hash under 'files'")
    for rel, record in manifest.files.items():
        path = manifest.root / rel
        if not path.is_file():
            raise SpecrtError(f"bundle {manifest.root}: file {rel} is missing")
        if path.stat().st_size != record.get("bytes"):
            raise SpecrtError(f"bundle {manifest.root}: {rel} has {path.stat().st_size} bytes, "
                              f"manifest says {record.get('bytes')} (corrupt or modified bundle)")
        if check_hashes and sha256_file(path) != record.get("sha256"):
            raise SpecrtError(f"bundle {manifest.root}: sha256 of {rel} does not match the manifest "
                              "(corrupt or modified bundle)")


def refuse_partial(path: str | Path) -> None:
    """SpecrtError when `path` is a bundle writer's temporary directory (specrt.bundle_dir)."""
    from specrt.bundle_dir import PARTIAL_PATTERN

    match = PARTIAL_PATTERN.fullmatch(Path(path).absolute().name)
    if match is not None:
        raise SpecrtError(f"{path} is not a bundle: it is the temporary folder of an unfinished write of "
                          f"{match['name']} (killed, or still running); the next export or quantize to {match['name']} "
                          f"removes it")


def read_manifest_json(path: str | Path, partial_ok: bool = False) -> tuple[Any, Path]:
    """(the parsed JSON of a bundle's manifest, its path), for every family's reader: a missing
    bundle or manifest, an interrupted write's folder (unless partial_ok) and invalid JSON are
    one line each."""
    path = Path(path)
    manifest_path = path / MANIFEST_NAME if path.is_dir() else path
    if not path.exists():
        raise SpecrtError(f"bundle {path} does not exist")
    if not partial_ok:
        refuse_partial(manifest_path.parent)
    if not manifest_path.is_file():
        raise SpecrtError(f"{path} is not a specrt bundle: it has no {MANIFEST_NAME}")
    try:
        return json.loads(manifest_path.read_text()), manifest_path
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecrtError(f"{manifest_path} is not valid JSON: {exc}") from None


def read_manifest(path: str | Path, check_hashes: bool = True, partial_ok: bool = False) -> Manifest:
    """Load a bundle's manifest (`path` is the bundle directory or its manifest.json), validate
    version, structure and profiles, and check every listed file's size and sha256.

    Raises SpecrtError with one line saying what is wrong. check_hashes=False skips only the
    sha256 pass (sizes are still checked) for callers that re-open a bundle they just verified.
    A writer's temporary directory (`.NAME.partial-*`, specrt.bundle_dir) is never a bundle, even
    with a manifest in it; only the writer itself reads its work back (partial_ok=True).
    """
    raw, manifest_path = read_manifest_json(path, partial_ok)
    return checked_manifest(raw, manifest_path.parent, check_hashes)


def checked_manifest(raw: Any, root: Path, check_hashes: bool = True) -> Manifest:
    """A manifest's parsed JSON validated (parse_manifest) and its files verified (verify_files):
    read_manifest without reading the file, for a caller that has read it already (the family
    registry reads manifest.json once to learn which family parses it)."""
    manifest = parse_manifest(raw, root)
    verify_files(manifest, check_hashes=check_hashes)
    return manifest


def as_manifest(bundle: str | Path | Manifest) -> Manifest:
    """The manifest a caller hands down, as it is, or a bundle directory's read by read_manifest:
    entry points take either, so a bundle opened once is never read (and hashed) again."""
    return bundle if isinstance(bundle, Manifest) else read_manifest(bundle)
