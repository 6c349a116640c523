"""The engine cache inside a bundle: one folder per GPU + TensorRT version.

TensorRT engines are not portable across GPUs or TensorRT versions, and an engine built
for other profiles or another ONNX file runs wrong or not at all. So every engine has a
JSON sidecar holding the full key it was built for; a lookup that finds a different key
(or an engine file whose hash is not the recorded one) reports a miss and the engine is
rebuilt — a stale engine is never loaded silently. Layout:

    bundle/engines/<gpu>-sm<cc>-trt<version>/<graph>.<precision>.engine   (+ .json sidecar)
    bundle/engines/<gpu>-sm<cc>-trt<version>/timing.cache                 (shared by the graphs)

Files are written to a temporary name and renamed, so an interrupted build leaves either
the old engine or none, never half of one. Several processes may build into one bundle at
once: an engine and its sidecar are written and read as a pair under an advisory file lock
(`.lock` in the folder; fcntl, where the platform has it), so a reader never pairs one
process's engine with another's sidecar; the last writer wins, and every engine a lookup
returns is whole and matches its key.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; atomic renames still keep every file whole
    fcntl = None

from specrt.errors import SpecrtError

ENGINE_DIR = "engines"
KEY_FORMAT = 1  # bump when the meaning of a key field changes


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU an engine is built for: its name and compute capability ("8.7" on Orin)."""

    name: str
    compute_capability: str

    @property
    def slug(self) -> str:
        """Filesystem-safe folder name part, e.g. 'nvidia-h100-80gb-hbm3-sm9.0'."""
        name = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return f"{name}-sm{self.compute_capability}"


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine's validity depends on; two engines with equal keys are interchangeable."""

    graph: str
    trt_version: str
    device: DeviceInfo
    precision: str
    profile: dict[str, Any]
    onnx_sha256: str
    converter: str = ""  # non-empty when the ONNX was type-converted first (TensorRT 11 fp16/bf16)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["key_format"] = KEY_FORMAT
        return data

    @property
    def digest(self) -> str:
        """Short hash of the canonical JSON form of the key."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in chunks (ONNX graphs can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class EngineCache:
    """Engines and the timing cache of one bundle for one GPU + TensorRT version."""

    def __init__(self, bundle: str | Path, device: DeviceInfo, trt_version: str):
        self.bundle = Path(bundle)
        self.device = device
        self.trt_version = trt_version
        self.dir = self.bundle / ENGINE_DIR / f"{device.slug}-trt{trt_version}"

    def engine_path(self, graph: str, precision: str) -> Path:
        return self.dir / f"{graph}.{precision}.engine"

    def sidecar_path(self, graph: str, precision: str) -> Path:
        return self.dir / f"{graph}.{precision}.json"

    @property
    def timing_cache_path(self) -> Path:
        return self.dir / "timing.cache"

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """Hold the folder's advisory lock: exclusive to write an engine + sidecar pair, shared to read one."""
        if fcntl is None or not self.dir.is_dir():
            yield
            return
        try:
            handle = open(self.dir / ".lock", "a+b")
        except OSError:  # a read-only bundle: nobody can be writing into it
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def lookup(self, key: EngineKey) -> Path | None:
        """The cached engine for `key`, or None when absent, built for another key, or damaged."""
        engine, sidecar = self.engine_path(key.graph, key.precision), self.sidecar_path(key.graph, key.precision)
        with self._locked(exclusive=False):
            if not engine.is_file() or not sidecar.is_file():
                return None
            try:
                recorded = json.loads(sidecar.read_text())
            except json.JSONDecodeError:
                return None
            if recorded.get("key") != key.to_json() or recorded.get("engine_sha256") != file_sha256(engine):
                return None
            return engine

    def store(self, key: EngineKey, engine_bytes: bytes, build_seconds: float | None = None) -> Path:
        """Save an engine and then its sidecar (last, so a crash in between reads as a miss)."""
        engine = self.engine_path(key.graph, key.precision)
        sidecar = {"key": key.to_json(), "digest": key.digest, "engine_sha256": hashlib.sha256(engine_bytes).hexdigest(),
                   "engine_bytes": len(engine_bytes), "build_seconds": build_seconds}
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._locked(exclusive=True):
            self._remove_stale_temporaries()
            atomic_write_bytes(engine, engine_bytes)
            atomic_write_bytes(self.sidecar_path(key.graph, key.precision), json.dumps(sidecar, indent=2).encode())
        return engine

    def _remove_stale_temporaries(self) -> None:
        """Remove half-written engines and sidecars (atomic_write_bytes' `.NAME.*.tmp`) that a killed
        build left. Called under the exclusive lock every engine writer holds, so none is in use."""
        for pattern in (".*.engine.*.tmp", ".*.json.*.tmp"):
            for stale in self.dir.glob(pattern):
                try:
                    stale.unlink()
                except OSError:
                    pass

    def load_timing_cache(self) -> bytes:
        """Serialized timing cache from earlier builds on this GPU + TensorRT, or b'' for a fresh one."""
        path = self.timing_cache_path
        return path.read_bytes() if path.is_file() else b""

    def save_timing_cache(self, data: bytes) -> None:
        atomic_write_bytes(self.timing_cache_path, bytes(data))


def detect_device(device_index: int = 0) -> DeviceInfo:
    """Name and compute capability of the GPU engines are built for.

    Asks cuda-python (installed with the trt extra), then torch if it is already installed,
    then nvidia-smi; SpecrtError when none of them sees a GPU.
    """
    for probe in (_device_from_cuda_python, _device_from_torch, _device_from_nvidia_smi):
        try:
            found = probe(device_index)
        except Exception:  # a probe that cannot answer just defers to the next one
            found = None
        if found is not None:
            return found
    raise SpecrtError("no CUDA GPU found (TensorRT engines are built on the GPU they will run on)")


def _device_from_cuda_python(index: int) -> DeviceInfo | None:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    err, props = cudart.cudaGetDeviceProperties(index)
    if int(err) != 0:
        return None
    name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    return DeviceInfo(name.strip("\x00 "), f"{props.major}.{props.minor}")


def _device_from_torch(index: int) -> DeviceInfo | None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return DeviceInfo(torch.cuda.get_device_name(index), f"{major}.{minor}")


def _device_from_nvidia_smi(index: int) -> DeviceInfo | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    name, cc = (part.strip() for part in out.splitlines()[0].rsplit(",", 1))
    return DeviceInfo(name, cc)
