"""Build one TensorRT engine per graph of a bundle, through the engine cache.

Polygraphy-style loaders: `NetworkFromOnnx`, `CreateConfig` and `EngineBytes` are small
callables that do nothing until called, so building reads as one composed expression and
each step can be tested or swapped alone:

    EngineBytes(NetworkFromOnnx(path), CreateConfig(profile, "fp16", trt_version, 4 << 30))()

`build_bundle` is the orchestration `specrt build` calls: validate every graph's profile
against its ONNX first (fail before minutes of building), convert graphs for strongly typed
TensorRT 11, then build or reuse each engine. TensorRT itself is imported lazily; the
engine builder is injectable so everything but the TensorRT calls is tested without it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specrt.errors import SpecrtError
from specrt.manifest import UNBUILT_KINDS, Manifest, as_manifest
from specrt.runtime.kv_inputs import is_layer_name
from specrt.lazy import available

from .bundle import GraphEntry, graph_entries
from .cache import DeviceInfo, EngineCache, EngineKey, detect_device
from .precision import CONVERTER_VERSION, builder_flag_names, needs_conversion, validate_precision, write_converted
from .profiles import GraphProfile, derive_profile, onnx_input_dims, validate_against_onnx

TRT_MISSING = "TensorRT is not installed: pip install 'specrt[trt]' (on Jetson it comes with JetPack)"
# graphs no engine can be made of (manifest.UNBUILT_KINDS: a draft_growth's float64 scores; the
# TensorRT runner grows dynamic trees level by level)
SKIPPED_KINDS = UNBUILT_KINDS
CONVERTED_DIR = "engines/converted"  # relative to the bundle: fp16/bf16 graphs for TensorRT 11


def require_tensorrt() -> Any:
    """The tensorrt module, or the one-line SpecrtError `specrt build` shows without it."""
    if not available("tensorrt"):
        raise SpecrtError(TRT_MISSING)
    import tensorrt

    return tensorrt


@dataclass
class ParsedNetwork:
    """A parsed network with the objects that must outlive it (TensorRT does not keep them alive)."""

    logger: Any
    builder: Any
    network: Any
    parser: Any


class NetworkFromOnnx:
    """Loader: parse an ONNX file (external data beside it is found by path) into a network."""

    def __init__(self, onnx_path: str | Path):
        self.onnx_path = Path(onnx_path)

    def __call__(self) -> ParsedNetwork:
        trt = require_tensorrt()
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        # Explicit batch is the only mode on TensorRT 10+, and TensorRT 11 is always strongly typed.
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(self.onnx_path)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise SpecrtError(f"TensorRT could not parse {self.onnx_path}: {' | '.join(errors) or 'unknown error'}")
        return ParsedNetwork(logger, builder, network, parser)


class CreateConfig:
    """Loader: a builder config with one optimization profile, precision flags, workspace and timing cache."""

    def __init__(self, profile: GraphProfile, precision: str, trt_version: str, workspace_bytes: int,
                 timing_cache: bytes = b""):
        self.profile, self.precision, self.trt_version = profile, validate_precision(precision), trt_version
        self.workspace_bytes, self.timing_cache = workspace_bytes, timing_cache

    def __call__(self, builder: Any, network: Any) -> Any:
        trt = require_tensorrt()
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace_bytes)
        flags = builder_flag_names(self.precision, self.trt_version)
        for flag in flags:
            if not hasattr(trt.BuilderFlag, flag):
                raise SpecrtError(f"TensorRT {self.trt_version} has no BuilderFlag.{flag}; this GPU/TensorRT cannot build {self.precision}")
            config.set_flag(getattr(trt.BuilderFlag, flag))
        if flags:  # weakly typed TensorRT 10: ask for the same fp32 islands the TensorRT 11 converter makes
            keep_sensitive_layers_fp32(trt, network)
            config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
        optimization_profile = builder.create_optimization_profile()
        for item in self.profile.dynamic_inputs:
            optimization_profile.set_shape(item.name, item.min, item.opt, item.max)
        config.add_optimization_profile(optimization_profile)
        config.set_timing_cache(config.create_timing_cache(self.timing_cache), False)
        return config


def keep_sensitive_layers_fp32(trt: Any, network: Any) -> int:
    """Pin softmax, reductions, normalisation, sqrt/reciprocal and pow layers, and every float
    layer of the sampling head, to fp32; returns how many.

    With BuilderFlag.FP16 alone TensorRT 10 may run an RMSNorm's x² and mean in fp16 (x² of
    an activation above 256 overflows); the head's CDF and its count of CDF entries need
    fp32 too (fp16 is exact only up to 2048). This mirrors precision.fp32_nodes at the layer
    level: the head is every layer downstream of the values of the network inputs `mix` and
    `uniforms` (layers come in topological order); a shape layer reads only dims, so the walk
    stops there, as precision.downstream_nodes does.
    """
    from .precision import FP32_FROM_INPUTS

    unary = {trt.UnaryOperation.SQRT, trt.UnaryOperation.RECIP}
    head = {network.get_input(i).name for i in range(network.num_inputs)} & set(FP32_FROM_INPUTS)
    sensitive_kinds = {trt.LayerType.SOFTMAX, trt.LayerType.REDUCE, trt.LayerType.NORMALIZATION}
    if hasattr(trt.LayerType, "CUMULATIVE"):  # ICumulativeLayer (CumSum) on newer TensorRT 10
        sensitive_kinds.add(trt.LayerType.CUMULATIVE)
    pinned = 0
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        kind = layer.type
        in_head = any(layer.get_input(j) is not None and layer.get_input(j).name in head for j in range(layer.num_inputs))
        outputs = [layer.get_output(j) for j in range(layer.num_outputs)]
        if in_head and kind != trt.LayerType.SHAPE:
            head.update(t.name for t in outputs)
        sensitive = kind in sensitive_kinds
        if kind == trt.LayerType.UNARY:
            layer.__class__ = trt.IUnaryLayer
            sensitive = layer.op in unary
        elif kind == trt.LayerType.ELEMENTWISE:
            layer.__class__ = trt.IElementWiseLayer
            sensitive = layer.op == trt.ElementWiseOperation.POW
        if in_head and all(t.dtype == trt.float32 for t in outputs):  # not the bool compare or the int32 cast
            sensitive = True
        if sensitive:
            layer.precision = trt.float32
            pinned += 1
    return pinned


class EngineBytes:
    """Loader: build a serialized engine; hands the grown timing cache to `save_timing_cache`."""

    def __init__(self, network: Callable[[], ParsedNetwork], config: CreateConfig,
                 save_timing_cache: Callable[[bytes], None] | None = None):
        self.network, self.config, self.save_timing_cache = network, config, save_timing_cache

    def __call__(self) -> bytes:
        parsed = self.network()
        config = self.config(parsed.builder, parsed.network)
        serialized = parsed.builder.build_serialized_network(parsed.network, config)
        if serialized is None:
            raise SpecrtError(f"TensorRT failed to build an engine for {self.config.profile.graph} (see the TensorRT log above)")
        if self.save_timing_cache is not None:
            self.save_timing_cache(bytes(config.get_timing_cache().serialize()))
        return bytes(serialized)


@dataclass(frozen=True)
class BuildJob:
    """Everything needed to build one graph's engine; `onnx_path` is the converted graph on TensorRT 11."""

    entry: GraphEntry
    onnx_path: Path
    profile: GraphProfile
    precision: str
    key: EngineKey


@dataclass(frozen=True)
class BuildResult:
    graph: str
    engine_path: Path
    built: bool


EngineBuilder = Callable[[BuildJob, EngineCache], bytes]


def tensorrt_engine_builder(workspace_bytes: int) -> EngineBuilder:
    """The real builder: TensorRT loaders composed, timing cache shared through the engine cache."""

    def build(job: BuildJob, cache: EngineCache) -> bytes:
        config = CreateConfig(job.profile, job.precision, cache.trt_version, workspace_bytes, cache.load_timing_cache())
        return EngineBytes(NetworkFromOnnx(job.onnx_path), config, cache.save_timing_cache)()

    return build


def plan_jobs(bundle: str | Path | Manifest, precision: str, trt_version: str, device: DeviceInfo,
              max_window: int | None = None, graphs: list[str] | None = None) -> list[BuildJob]:
    """Validate every graph and prepare its job before anything is built (conversion included);
    `bundle`: its checked manifest, or its directory."""
    validate_precision(precision)
    manifest = as_manifest(bundle)
    jobs = []
    for entry in graph_entries(manifest.root, graphs, manifest):
        if graphs is None and entry.spec["kind"] in SKIPPED_KINDS:
            continue  # the TensorRT runner does not run it: no engine unless asked for by name
        if entry.spec["kind"] in UNBUILT_KINDS:
            raise SpecrtError(f"{entry.name} outputs float64 scores, which TensorRT has no type for: onnxruntime "
                              "and PyTorch run it (the TensorRT runner grows dynamic trees level by level)")
        profile = derive_profile(entry.name, entry.spec, max_window)
        validate_against_onnx(profile, entry.spec, onnx_input_dims(entry.onnx_path))
        onnx_path, converter = entry.onnx_path, ""
        if needs_conversion(precision, trt_version):
            onnx_path = write_converted(entry.onnx_path, entry.onnx_sha256, precision, manifest.root / CONVERTED_DIR)
            converter = CONVERTER_VERSION
        key = EngineKey(graph=entry.name, trt_version=trt_version, device=device, precision=precision,
                        profile=profile.to_json(), onnx_sha256=entry.onnx_sha256, converter=converter)
        jobs.append(BuildJob(entry, onnx_path, profile, precision, key))
    return jobs


def refuse_layer_inputs(graph: str, inputs: list[str]) -> None:
    """The TensorRT runner binds the cache as one past_kv buffer: a step graph exported with per-layer
    KV inputs (for onnxruntime on a CPU) is refused in one line that says how to re-export. (Its engine
    builds: onnxruntime's TensorRT provider binds inputs by name and runs it.)"""
    if any(is_layer_name(name) for name in inputs):
        raise SpecrtError(f"{graph} takes the KV cache per layer (exported for onnxruntime on a CPU); TensorRT binds "
                          "one past_kv buffer: re-export with `specrt export --kv-inputs stacked`")


def build_bundle(bundle: str | Path, precision: str = "fp32", workspace_bytes: int = 4 << 30,
                 max_window: int | None = None, force: bool = False, graphs: list[str] | None = None,
                 device: DeviceInfo | None = None, trt_version: str | None = None,
                 engine_builder: EngineBuilder | None = None,
                 progress: Callable[[str], None] = lambda message: None) -> list[BuildResult]:
    """Build (or reuse from the cache) one engine per graph of `bundle`; returns where each engine is.

    Without `engine_builder`, TensorRT must be installed and its version is the one used.
    """
    if engine_builder is None:
        trt = require_tensorrt()
        trt_version = trt.__version__
        engine_builder = tensorrt_engine_builder(workspace_bytes)
    if trt_version is None:
        raise SpecrtError("trt_version is required with a custom engine_builder")
    device = device or detect_device()
    jobs = plan_jobs(bundle, precision, trt_version, device, max_window, graphs)
    cache = EngineCache(bundle, device, trt_version)
    progress(f"building {len(jobs)} engine(s) for {device.name} (sm {device.compute_capability}), "
             f"TensorRT {trt_version}, {precision}, into {cache.dir}")
    results = []
    for number, job in enumerate(jobs, 1):
        label = f"[{number}/{len(jobs)}] {job.entry.name}"
        cached = None if force else cache.lookup(job.key)
        if cached is not None:
            progress(f"{label}: cached {cached}")
            results.append(BuildResult(job.entry.name, cached, False))
            continue
        progress(f"{label}: building from {job.onnx_path.name} ...")
        start = time.perf_counter()
        engine_bytes = engine_builder(job, cache)
        seconds = time.perf_counter() - start
        path = cache.store(job.key, engine_bytes, round(seconds, 3))
        progress(f"{label}: built in {seconds:.1f} s, {len(engine_bytes) / 1e6:.1f} MB -> {path}")
        results.append(BuildResult(job.entry.name, path, True))
    return results
