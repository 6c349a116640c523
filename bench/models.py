"""What a benchmark runs on: a Pipeline on a backend, and (for the demo) its fidelity judge.

Default: the embedded demo, exported once into a cache directory and run on onnxruntime,
because a bundle on onnxruntime is what specrt deploys — measuring the PyTorch modules
would time a path no user ships. The export takes about a minute on a 2-core CPU and is
keyed by a digest of the demo weights, so retrained weights get a fresh bundle. `torch`
runs the demo's PyTorch modules directly (no export) for comparison.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from specrt.errors import SpecrtError
from specrt.runtime.pipeline import BUNDLE_BACKENDS, Pipeline
from specrt.runtime.threads import set_torch_threads

BACKENDS = (*BUNDLE_BACKENDS, "torch")
Progress = Callable[[str], None]


@dataclass
class BenchModels:
    """The pipeline under test, how to name it in a report, and how to judge its images."""

    pipeline: Pipeline
    backend: str
    bundle: str
    judge: Optional[Any] = None  # bench.fidelity.FidelityJudge when an evaluator exists for these models
    drafts: dict[str, Pipeline] = field(default_factory=dict)  # `--drafts`: draft kind -> the pipeline with it
    draft_sources: dict[str, str] = field(default_factory=dict)  # draft kind -> what it is, for the report


def cache_root() -> Path:
    """$SPECRT_CACHE_DIR, else $XDG_CACHE_HOME/specrt, else ~/.cache/specrt."""
    if os.environ.get("SPECRT_CACHE_DIR"):
        return Path(os.environ["SPECRT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specrt"


def demo_weights_dir(demo_weights: Optional[Path]) -> Path:
    from specrt.export.demo import packaged_weights_dir

    return Path(demo_weights) if demo_weights is not None else packaged_weights_dir()


def weights_digest(folder: Path, eagle: bool = False) -> str:
    """Short sha256 over a demo weights folder's files (demo.json and the safetensors; the
    EAGLE head's eagle.* only for the bundle that drafts with it)."""
    digest = hashlib.sha256()
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors")
                   and (eagle or p.stem != "eagle"))
    if not files:
        raise SpecrtError(f"no demo weights in {folder} (train them with `specrt demo train --out DIR`)")
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def demo_bundle(demo_weights: Optional[Path] = None, cache_dir: Optional[Path] = None,
                progress: Optional[Progress] = None, eagle: bool = False) -> Path:
    """The demo exported to <cache>/bench/demo-v<manifest version>-<digest>/, exporting it on first use.

    The bundle format version and the export defaults (max window, max batch, opset, ...) are
    part of the name, so a specrt that changes the graphs' contract or their limits exports
    afresh instead of refusing a cached bundle made by the previous one (a bundle exported before
    sjd-pac's window grew to L + 1 would refuse default sjd-pac)."""
    from specrt.export.bundle import ExportOptions, write_bundle
    from specrt.manifest import MANIFEST_NAME, VERSION

    weights = demo_weights_dir(demo_weights)
    options = hashlib.sha256(repr(ExportOptions()).encode()).hexdigest()[:8]
    kind = "-eagle" if eagle else ""  # the demo with its EAGLE head as the draft (export --eagle demo)
    out = Path(cache_dir or cache_root() / "bench") / f"demo{kind}-v{VERSION}-{weights_digest(weights, eagle)}-{options}"
    if (out / MANIFEST_NAME).is_file():
        return out
    from specrt.export.sources import demo_models, with_eagle_head

    say = progress or (lambda _msg: None)
    say(f"exporting the demo{' + EAGLE head' if eagle else ''} bundle once to {out} (about a minute on a 2-core CPU) ...")
    models = demo_models(demo_weights)
    if eagle:
        models = with_eagle_head(models, "demo")
    try:
        write_bundle(models, out, ExportOptions(), progress=say)
    except SpecrtError:
        if not (out / MANIFEST_NAME).is_file():  # another process may have just finished the same export
            raise
    return out


def _judge_for_bundle(bundle: Path) -> Optional[Any]:
    """The demo's fidelity judge when the bundle was exported from demo weights, else None."""
    from specrt.manifest import read_manifest

    source = str(read_manifest(bundle, check_hashes=False).models["target"].get("source", ""))
    where, sep, _role = source.rpartition(":")
    if not sep:
        return None
    if where == "demo":
        weights = None
    elif (Path(where) / "demo.json").is_file():
        weights = Path(where)
    else:
        return None
    from specrt.bench.fidelity import FidelityJudge

    return FidelityJudge.from_demo(weights)


def open_models(bundle: Optional[Path] = None, backend: str = "ort", demo_weights: Optional[Path] = None,
                threads: Optional[int] = 1, cache_dir: Optional[Path] = None, judge: bool = True,
                progress: Optional[Progress] = None, device: str = "cpu",
                cuda_graphs: Optional[bool] = None, drafts: Sequence[str] = ()) -> BenchModels:
    """A BUNDLE on onnxruntime, or the demo on onnxruntime (cached export) or PyTorch.

    `device` and `cuda_graphs` are the torch backend's (Pipeline.from_torch); the backend is
    reported as 'torch-cuda' on a GPU so the run names the GPU. `drafts` (the demo only):
    the draft kinds to compare, each a pipeline of its own (`independent`: the demo's draft
    GPT; `eagle`: the packaged EAGLE head, on the same target)."""
    models = _open_models(bundle, backend, demo_weights, threads, cache_dir, judge, progress, device, cuda_graphs)
    if drafts:
        if bundle is not None or demo_weights is not None:
            raise SpecrtError("--drafts compares the packaged demo's draft GPT and EAGLE head; drop the BUNDLE / "
                              "--demo-weights (or benchmark each bundle on its own)")
        for kind in drafts:
            models.drafts[kind] = models.pipeline if kind == "independent" else \
                _eagle_demo_pipeline(backend, threads, cache_dir, progress, device)
            models.draft_sources[kind] = "demo draft GPT" if kind == "independent" else "demo EAGLE head (eagle.safetensors)"
    return models


def _eagle_demo_pipeline(backend: str, threads: Optional[int], cache_dir: Optional[Path],
                         progress: Optional[Progress], device: str) -> Pipeline:
    """The demo target with its packaged EAGLE head as the draft, on the run's backend."""
    if backend != "torch":
        return Pipeline.from_bundle(demo_bundle(None, cache_dir, progress, eagle=True), backend=backend, threads=threads)
    from specrt.export.demo import load_demo
    from specrt.export.eagle.checkpoint import load_eagle_head, packaged_demo_head

    demo = load_demo()
    return Pipeline.from_torch(demo.target, load_eagle_head(packaged_demo_head(), demo.target), demo.vq,
                               device=device, threads=threads, cuda_graphs=False)


def _open_models(bundle, backend, demo_weights, threads, cache_dir, judge, progress, device, cuda_graphs) -> BenchModels:
    if backend not in BACKENDS:
        raise SpecrtError(f"unknown --backend {backend!r}; choose from {', '.join(BACKENDS)}")
    set_torch_threads(threads)  # torch runs the export, the evaluator and the torch backend
    if bundle is not None:
        if demo_weights is not None:
            raise SpecrtError("give either a BUNDLE or --demo-weights, not both")
        if backend == "torch":
            raise SpecrtError("a BUNDLE runs on the ort backend (or ort-cpu, ort-cuda, ort-trt, trt); "
                              "--backend torch benchmarks the demo's PyTorch modules")
        pipe = Pipeline.from_bundle(bundle, backend=backend, threads=threads)
        return BenchModels(pipe, backend, str(bundle), _judge_for_bundle(bundle) if judge else None)

    from specrt.bench.fidelity import FidelityJudge

    fidelity = FidelityJudge.from_demo(demo_weights) if judge else None
    where = "demo" if demo_weights is None else f"demo weights {demo_weights}"
    if backend != "torch":
        path = demo_bundle(demo_weights, cache_dir, progress)
        return BenchModels(Pipeline.from_bundle(path, backend=backend, threads=threads), backend,
                           f"{where} (exported to {path})", fidelity)

    from specrt.export.demo import load_demo

    demo = load_demo(demo_weights)
    pipe = Pipeline.from_torch(demo.target, demo.draft, demo.vq, device=device, threads=threads,
                               cuda_graphs=cuda_graphs)  # the demo's own sampling defaults
    on_gpu = device.startswith("cuda")
    graphs = " with CUDA graphs" if on_gpu and pipe.target.cuda_graphs else ""
    return BenchModels(pipe, "torch-cuda" if on_gpu else "torch", f"{where} (PyTorch modules{graphs})", fidelity)
