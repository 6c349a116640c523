"""`specrt triton-repo`: a Triton model repository serving a bundle on the stock tritonserver.

    REPO/<model>/config.pbtxt         Python backend, dynamic batching, one instance per GPU
    REPO/<model>/1/model.py           re-exports specrt.runtime.serving.python_backend's model
    REPO/<model>/1/bundle/            a copy of the bundle

The tensors come from protocol.py (the same as `specrt serve`), so one client talks to both;
the `tokens` output is declared from the bundle's family and manifest (Family.token_dtype,
manifest_token_shape), without opening a graph. The backend and instance kind default to the
family's: ort-cuda on GPU instances where the family runs on it (LlamaGen), else its first
backend on CPU instances (a continuous bundle: ort). Scale-out is Triton's: more instances per
GPU (instance_group count), more GPUs, replicas of the container behind a load balancer.
Written to a hidden temporary folder and renamed.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from specrt.bundle_dir import move_into_place, partial_dir, refuse_existing
from specrt.errors import SpecrtError
from specrt.manifest import MANIFEST_NAME
from specrt.runtime.family import Family
from specrt.runtime.serving.protocol import INPUTS, OUTPUTS, TensorSpec

INSTANCE_KINDS = ("gpu", "cpu")
GPU_BACKENDS = ("ort-cuda", "ort-trt", "trt")
MODEL_PY = '''"""Triton Python-backend model for a specrt bundle (written by `specrt triton-repo`).

The container needs specrt installed (pip install specrt, plus onnxruntime-gpu for ort-cuda);
the model itself is specrt.runtime.serving.python_backend.TritonPythonModel.
"""
from specrt.runtime.serving.python_backend import TritonPythonModel  # noqa: F401
'''


@dataclass(frozen=True)
class RepoConfig:
    """What config.pbtxt says besides the tensors (the `specrt triton-repo` flags)."""

    model_name: str = "specrt"
    backend: Optional[str] = None        # None: the family's default (for_family)
    instance_kind: Optional[str] = None  # None: gpu where the backend runs on a GPU, else cpu
    instances: int = 1  # per GPU with kind gpu; in all with kind cpu
    max_batch: int = 8
    queue_delay_us: int = 2000
    threads: int = 0  # onnxruntime intra-op threads per session; 0: its default


def for_family(config: RepoConfig, family: Family) -> RepoConfig:
    """`config` with its defaults filled in for `family` and checked against what it runs on."""
    backend = config.backend or ("ort-cuda" if "ort-cuda" in family.backends else family.backends[0])
    on_gpu = any(b in GPU_BACKENDS for b in family.backends)
    kind = config.instance_kind or ("gpu" if on_gpu else "cpu")
    if backend not in family.backends:
        raise SpecrtError(f"a {family.name} bundle runs on {', '.join(family.backends)}, not backend {backend!r}")
    if kind not in INSTANCE_KINDS:
        raise SpecrtError(f"instance kind must be one of {', '.join(INSTANCE_KINDS)}, got {kind!r}")
    if kind == "cpu" and backend in GPU_BACKENDS:
        raise SpecrtError(f"backend {backend} runs on a GPU; with --instance-kind cpu use ort or ort-cpu")
    if kind == "gpu" and not on_gpu:
        raise SpecrtError(f"a {family.name} bundle runs on the CPU ({', '.join(family.backends)}): use "
                          f"--instance-kind cpu")
    return replace(config, backend=backend, instance_kind=kind)


def config_dtype(dtype: str) -> str:
    """Triton's data type name in a model config: BYTES tensors are TYPE_STRING there."""
    return "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"


def _tensor(spec: TensorSpec, optional: bool) -> str:
    dims = ", ".join(str(d) for d in spec.shape)
    extra = " optional: true" if optional else ""
    return f'  {{ name: "{spec.name}" data_type: {config_dtype(spec.dtype)} dims: [ {dims} ]{extra} }}'


def config_pbtxt(config: RepoConfig, outputs: tuple[TensorSpec, ...] = OUTPUTS) -> str:
    """The model's config.pbtxt (protobuf text of Triton's ModelConfig); `outputs`: the model's
    (protocol.outputs for its family; OUTPUTS is LlamaGen's)."""
    lines = [
        f'name: "{config.model_name}"',
        'backend: "python"',
        f"max_batch_size: {config.max_batch}",
        f"dynamic_batching {{ max_queue_delay_microseconds: {config.queue_delay_us} }}",
        f"instance_group [ {{ count: {config.instances} kind: KIND_{config.instance_kind.upper()} }} ]",
        "input [",
        ",\n".join(_tensor(spec, optional=True) for spec in INPUTS),
        "]",
        "output [",
        ",\n".join(_tensor(spec, optional=False) for spec in outputs),
        "]",
    ]
    parameters = {"bundle": "bundle", "backend": config.backend, "threads": str(config.threads or "")}
    lines += [f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in parameters.items()]
    return "\n".join(lines) + "\n"


REPOSITORY = "Triton model repository specrt wrote"


def is_repository(path: Path) -> bool:
    """Whether `path` is a model repository write_repository made (a model folder holding a bundle):
    what triton-repo --force may replace."""
    return any((model / "1" / "bundle" / MANIFEST_NAME).is_file() for model in Path(path).iterdir() if model.is_dir())


def write_repository(bundle: Path, out: Path, config: RepoConfig = RepoConfig(), force: bool = False) -> Path:
    """Write the repository for `bundle` (any family's) at `out`; returns the model folder."""
    from specrt.runtime.family_registry import read_bundle
    from specrt.runtime.serving.protocol import outputs

    bundle, out = Path(bundle), Path(out)
    family, manifest = read_bundle(bundle)
    family.describe(manifest)  # the family's own checks (those of `specrt inspect`), or one line saying what is wrong
    config = for_family(config, family)
    tensors = outputs(family.token_dtype, family.manifest_token_shape(manifest))
    if not config.model_name or not config.model_name.replace("-", "_").replace(".", "_").isidentifier():
        raise SpecrtError(f"model name {config.model_name!r}: use letters, digits, '-', '_' or '.'")
    refuse_existing(out, force, is_repository, REPOSITORY)
    with partial_dir(out) as work:
        model = work / config.model_name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(config_pbtxt(config, tensors))
        (model / "1" / "model.py").write_text(MODEL_PY)
        shutil.copytree(bundle, model / "1" / "bundle", ignore=shutil.ignore_patterns(".*"))
        move_into_place(work, out, force, is_repository, REPOSITORY)
    return out / config.model_name
