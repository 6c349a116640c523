"""`specrt triton-repo`: a Triton model repository serving a bundle on the stock tritonserver.

    REPO/<model>/config.pbtxt         Python backend, dynamic batching, one instance per GPU
    REPO/<model>/1/model.py           re-exports specrt.runtime.serving.python_backend's model
    REPO/<model>/1/bundle/            a copy of the bundle

The tensors come from protocol.py (the same as `specrt serve`), so one client talks to both.
Scale-out is Triton's: more instances per GPU (instance_group count), more GPUs, replicas of
the container behind a load balancer. Written to a hidden temporary folder and renamed.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from specrt.bundle_dir import move_into_place, partial_dir, refuse_existing
from specrt.errors import SpecrtError
from specrt.runtime.pipeline import BUNDLE_BACKENDS
from specrt.runtime.serving.protocol import INPUTS, OUTPUTS, TensorSpec

INSTANCE_KINDS = ("gpu", "cpu")
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
    backend: str = "ort-cuda"
    instance_kind: str = "gpu"
    instances: int = 1  # per GPU with kind gpu; in all with kind cpu
    max_batch: int = 8
    queue_delay_us: int = 2000
    threads: int = 0  # onnxruntime intra-op threads per session; 0: its default


def config_dtype(dtype: str) -> str:
    """Triton's data type name in a model config: BYTES tensors are TYPE_STRING there."""
    return "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"


def _tensor(spec: TensorSpec, optional: bool) -> str:
    dims = ", ".join(str(d) for d in spec.shape)
    extra = " optional: true" if optional else ""
    return f'  {{ name: "{spec.name}" data_type: {config_dtype(spec.dtype)} dims: [ {dims} ]{extra} }}'


def config_pbtxt(config: RepoConfig) -> str:
    """The model's config.pbtxt (protobuf text of Triton's ModelConfig)."""
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
        ",\n".join(_tensor(spec, optional=False) for spec in OUTPUTS),
        "]",
    ]
    parameters = {"bundle": "bundle", "backend": config.backend, "threads": str(config.threads or "")}
    lines += [f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}' for key, value in parameters.items()]
    return "\n".join(lines) + "\n"


def write_repository(bundle: Path, out: Path, config: RepoConfig = RepoConfig(), force: bool = False) -> Path:
    """Write the repository for `bundle` at `out`; returns the model folder."""
    from specrt.manifest import read_manifest

    bundle, out = Path(bundle), Path(out)
    read_manifest(bundle)  # a readable, complete bundle or one line saying what is wrong
    if config.backend not in BUNDLE_BACKENDS:
        raise SpecrtError(f"unknown backend {config.backend!r}; choose one of {', '.join(BUNDLE_BACKENDS)}")
    if config.instance_kind not in INSTANCE_KINDS:
        raise SpecrtError(f"instance kind must be one of {', '.join(INSTANCE_KINDS)}, got {config.instance_kind!r}")
    if config.instance_kind == "cpu" and config.backend not in ("ort", "ort-cpu"):
        raise SpecrtError(f"backend {config.backend} runs on a GPU; with --instance-kind cpu use ort or ort-cpu")
    if not config.model_name or not config.model_name.replace("-", "_").replace(".", "_").isidentifier():
        raise SpecrtError(f"model name {config.model_name!r}: use letters, digits, '-', '_' or '.'")
    refuse_existing(out, force)
    with partial_dir(out) as work:
        model = work / config.model_name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(config_pbtxt(config))
        (model / "1" / "model.py").write_text(MODEL_PY)
        shutil.copytree(bundle, model / "1" / "bundle", ignore=shutil.ignore_patterns(".*"))
        move_into_place(work, out, force)
    return out / config.model_name
