"""What a benchmark runs on: a Pipeline on a backend, and (for the demo) its fidelity judge.

Default: the embedded demo, exported once into a cache directory and run on onnxruntime,
because a bundle on onnxruntime is what specrt deploys — measuring the PyTorch modules
would time a path no user ships. The export takes about a minute on a 2-core CPU and is
keyed by a digest of the demo weights, so retrained weights get a fresh bundle. `torch`
runs the demo's PyTorch modules directly (no export) for comparison.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from specrt.errors import SpecrtError
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION
from specrt.paths import cache_root  # noqa: F401  (bench's callers import it from here)
from specrt.runtime.backends.bundle_backends import BUNDLE_BACKENDS
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.threads import set_torch_threads

BACKENDS = (*BUNDLE_BACKENDS, "torch")
Progress = Callable[[str], None]


@dataclass
class BenchModels:
    """The pipeline under test, how to name it in a report, and how to judge its images."""

    pipeline: Pipeline
    backend: str
    bundle: str
    judge: Optional[Any] = None  # export.demo.fidelity.FidelityJudge when an evaluator exists for these models
    drafts: dict[str, Pipeline] = field(default_factory=dict)  # `--drafts`: draft kind -> the pipeline with it
    draft_sources: dict[str, str] = field(default_factory=dict)  # draft kind -> what it is, for the report
    prompts: Optional[list[str]] = None  # t2i: image i's prompt is prompts[i mod len]; None: class ids cycle


def demo_weights_dir(demo_weights: Optional[Path], demo: Optional[str] = None) -> Path:
    from specrt.export.demo.registry import get_demo

    return Path(demo_weights) if demo_weights is not None else get_demo(demo).hook("packaged_weights_dir")()


def weights_digest(folder: Path, eagle: bool = False) -> str:
    """Short sha256 over a demo weights folder's files (demo.json and the safetensors, also in
    subfolders such as the t2i demo's text_encoder/; the EAGLE head's eagle.* only for the bundle
    that drafts with it)."""
    digest = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".safetensors")
                   and (eagle or p.stem != "eagle"))
    if not files:
        raise SpecrtError(f"no demo weights in {folder} (train them with `specrt demo train --out DIR`)")
    for path in files:
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


# Bumped when the export writes other graphs under the same contract version and options, so a
# cached demo bundle is exported afresh instead of running without them (2: draft chains, for
# independent drafts and EAGLE heads; 3: chains read their cache in segments; 4: the target's token
# embeddings, GSD's).
EXPORT_REVISION = 4


def demo_bundle(demo_weights: Optional[Path] = None, cache_dir: Optional[Path] = None,
                progress: Optional[Progress] = None, eagle: bool = False, demo: Optional[str] = None) -> Path:
    """The demo `demo` (export.demo.registry, default c2i) exported to
    <cache>/bench/demo[-NAME]-v<manifest version>-<digest>/, exporting it on first use.

    The bundle format version and the export defaults (max window, max batch, opset, ...) are
    part of the name, so a specrt that changes the graphs' contract or their limits exports
    afresh instead of refusing a cached bundle made by the previous one (a bundle exported before
    sjd-pac's window grew to L + 1 would refuse default sjd-pac)."""
    from specrt.export.bundle import ExportOptions, write_bundle
    from specrt.export.demo.registry import DEFAULT_DEMO, get_demo
    from specrt.manifest import MANIFEST_NAME, VERSION, read_manifest

    entry = get_demo(demo)
    weights = demo_weights_dir(demo_weights, entry.name)
    options = hashlib.sha256(f"{EXPORT_REVISION} {ExportOptions()!r}".encode()).hexdigest()[:8]

    def cached(eagle: bool) -> Path:
        # the demo with its EAGLE head as the draft (export --eagle demo); another demo than c2i: its name
        kind = ("-eagle" if eagle else "") + ("" if entry.name == DEFAULT_DEMO else f"-{entry.name}")
        return Path(cache_dir or cache_root() / "bench") / f"demo{kind}-v{VERSION}-{weights_digest(weights, eagle)}-{options}"

    out = cached(eagle)
    if (out / MANIFEST_NAME).is_file():
        return out
    # the plain demo of the same weights, when cached, lends the EAGLE bundle its target and VQ graphs
    plain = cached(False) if eagle else None
    reuse = read_manifest(plain, check_hashes=False) if plain is not None and (plain / MANIFEST_NAME).is_file() else None
    from specrt.export.sources import with_eagle_head

    say = progress or (lambda _msg: None)
    which = "" if entry.name == DEFAULT_DEMO else f"{entry.name} "
    say(f"exporting the {which}demo{' + EAGLE head' if eagle else ''} bundle once to {out} "
        "(about a minute on a 2-core CPU) ...")
    models = entry.hook("model_set")(demo_weights)
    if eagle:
        models = with_eagle_head(models, "demo")
    from specrt.export.unified.writer import UnifiedModels, write_unified_bundle

    # the demo's family's writer
    writer = write_unified_bundle if isinstance(models, UnifiedModels) else partial(write_bundle, reuse=reuse)
    try:
        writer(models, out, ExportOptions(), progress=say)
    except SpecrtError:
        if not (out / MANIFEST_NAME).is_file():  # another process may have just finished the same export
            raise
    return out


def _judge_for_bundle(bundle: Path) -> Optional[Any]:
    """The demo's fidelity judge when the bundle was exported from demo weights, else None.

    The manifest's target source says which: "demo:target" (c2i), "demo-NAME:target" (the
    packaged weights of demo NAME) or "FOLDER:target" (a `specrt demo train` folder, whose
    demo.json names its demo; c2i folders predate that key)."""
    import json

    from specrt.export.demo.registry import DEFAULT_DEMO, DEMOS
    from specrt.manifest import read_manifest

    source = str(read_manifest(bundle, check_hashes=False).models["target"].get("source", ""))
    where, sep, _role = source.rpartition(":")
    if not sep:
        return None
    if where == "demo" or (where.startswith("demo-") and where[5:] in DEMOS):
        name, weights = (where[5:] or DEFAULT_DEMO), None
    elif (Path(where) / "demo.json").is_file():
        weights = Path(where)
        name = json.loads((weights / "demo.json").read_text()).get("demo", DEFAULT_DEMO)
    else:
        return None
    return DEMOS[name].hook("fidelity_judge")(weights) if name in DEMOS else None


def bench_prompts(pipe: Pipeline, prompts: Optional[list[str]]) -> Optional[list[str]]:
    """The prompts a t2i model is benchmarked on (the t2i demo's default set unless given);
    None for a class-conditional model, which refuses prompts in one line."""
    if pipe.target.spec.model_type == "c2i":
        if prompts:
            raise SpecrtError("--prompts goes with a text-to-image model; this one is class-conditional")
        return None
    if prompts:
        return list(prompts)
    from specrt.export.demo.t2i.captions import default_prompts

    return default_prompts()


def refuse_torch_bundle(bundle: Optional[Path | str], backend: str) -> None:
    """One line for a BUNDLE with --backend torch: the bench's torch backend runs the demo's modules."""
    if bundle is not None and backend == "torch":
        raise SpecrtError("a BUNDLE runs on the ort backend (or ort-cpu, ort-cuda, ort-trt, trt); "
                          "--backend torch benchmarks the demo's PyTorch modules")


def open_models(bundle: Optional[Path] = None, backend: str = "ort", demo_weights: Optional[Path] = None,
                threads: Optional[int] = 1, cache_dir: Optional[Path] = None, judge: bool = True,
                progress: Optional[Progress] = None, device: str = "cpu",
                cuda_graphs: Optional[bool] = None, drafts: Sequence[str] = (), demo: Optional[str] = None,
                prompts: Optional[list[str]] = None, compile: Optional[bool] = None,
                compile_mode: str = "default", step_matmuls: Optional[str] = None,
                step_attention: str = DEFAULT_STEP_ATTENTION) -> BenchModels:
    """A BUNDLE on onnxruntime, or the demo `demo` (export.demo.registry; default c2i) on
    onnxruntime (cached export) or PyTorch. `prompts`: a t2i model's prompts (bench_prompts).

    `device`, `cuda_graphs`, `compile`, `compile_mode`, `step_matmuls` and `step_attention` are the torch
    backend's (Pipeline.from_torch; the source names the step choices); the backend is
    reported as 'torch-cuda' on a GPU so the run names the GPU. `drafts` (the demo only):
    the draft kinds to compare, each a pipeline of its own (`independent`: the demo's draft
    GPT; `eagle`: the packaged EAGLE head, on the same target)."""
    torch_step = TorchStep(cuda_graphs, compile, compile_mode, step_matmuls, step_attention)
    models = _open_models(bundle, backend, demo_weights, threads, cache_dir, judge, progress, device, torch_step, demo)
    models.prompts = bench_prompts(models.pipeline, prompts)
    if drafts:
        if bundle is not None or demo_weights is not None or demo not in (None, "c2i"):
            raise SpecrtError("--drafts compares the packaged demo's draft GPT and EAGLE head; drop the BUNDLE / "
                              "--demo-weights (or benchmark each bundle on its own)")
        for kind in drafts:
            models.drafts[kind] = models.pipeline if kind == "independent" else \
                _eagle_demo_pipeline(backend, threads, cache_dir, progress, device, torch_step)
            models.draft_sources[kind] = "demo draft GPT" if kind == "independent" else "demo EAGLE head (eagle.safetensors)"
    return models


def _eagle_demo_pipeline(backend: str, threads: Optional[int], cache_dir: Optional[Path],
                         progress: Optional[Progress], device: str, torch_step: "TorchStep") -> Pipeline:
    """The demo target with its packaged EAGLE head as the draft, on the run's backend. On torch it
    takes the run's CUDA-graph setting, as the demo's own pipeline does, so its device round runs
    captured on a GPU (the head's own steps stay eager: TorchHeadRunner)."""
    if backend != "torch":
        return Pipeline.from_bundle(demo_bundle(None, cache_dir, progress, eagle=True), backend=backend, threads=threads)
    from specrt.export.demo import load_demo
    from specrt.export.eagle.checkpoint import load_eagle_head, packaged_demo_head

    demo = load_demo()
    return Pipeline.from_torch(demo.target, load_eagle_head(packaged_demo_head(), demo.target), demo.vq,
                               device=device, threads=threads, **torch_step.options())


def _open_models(bundle, backend, demo_weights, threads, cache_dir, judge, progress, device, torch_step: "TorchStep",
                 demo=None) -> BenchModels:
    from specrt.export.demo.registry import DEFAULT_DEMO, get_demo

    if backend not in BACKENDS:
        raise SpecrtError(f"unknown --backend {backend!r}; choose from {', '.join(BACKENDS)}")
    set_torch_threads(threads)  # torch runs the export, the evaluator and the torch backend
    if bundle is not None:
        if demo_weights is not None or demo is not None:
            raise SpecrtError(f"give either a BUNDLE or {'--demo' if demo else '--demo-weights'}, not both")
        refuse_torch_bundle(bundle, backend)
        pipe = Pipeline.from_bundle(bundle, backend=backend, threads=threads)
        return BenchModels(pipe, backend, str(bundle), _judge_for_bundle(bundle) if judge else None)

    entry = get_demo(demo)
    fidelity = entry.hook("fidelity_judge")(demo_weights) if judge else None
    where = "demo" if entry.name == DEFAULT_DEMO else f"{entry.name} demo"
    where += "" if demo_weights is None else f" weights {demo_weights}"
    if backend != "torch":
        path = demo_bundle(demo_weights, cache_dir, progress, demo=entry.name)
        return BenchModels(Pipeline.from_bundle(path, backend=backend, threads=threads), backend,
                           f"{where} (exported to {path})", fidelity)

    # the demo's own sampling defaults
    pipe = entry.hook("torch_pipeline")(demo_weights, device=device, threads=threads, **torch_step.options())
    on_gpu = device.startswith("cuda")
    graphs = " with CUDA graphs" if on_gpu and pipe.target.cuda_graphs else ""
    step = f"{pipe.target.step_matmuls} matmuls, {pipe.target.step_attention} attention"  # what the runner chose
    return BenchModels(pipe, "torch-cuda" if on_gpu else "torch", f"{where} (PyTorch modules{graphs}; {step})",
                       fidelity)


@dataclass(frozen=True)
class TorchStep:
    """How the torch backend runs a step (Pipeline.from_torch's options of the same names)."""

    cuda_graphs: Optional[bool] = None
    compile: Optional[bool] = None
    compile_mode: str = "default"
    step_matmuls: Optional[str] = None
    step_attention: str = DEFAULT_STEP_ATTENTION

    def options(self) -> dict:
        return asdict(self)
