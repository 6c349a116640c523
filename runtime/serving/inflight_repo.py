"""The model repository `specrt serve --batching inflight` hands Triton, and how its model opens the pipeline.

    REPO/<model>/config.pbtxt   Python backend, one CPU instance, the in-flight parameters
    REPO/<model>/1/model.py     re-exports specrt.runtime.serving.inflight_model's model

Unlike `specrt triton-repo` nothing is copied: the repository lives in a temporary folder for
the life of one server and names the bundle where it is. The pipeline is opened inside Triton's
stub process from a JSON spec (`open_pipeline`): {"bundle", "backend", "threads"} opens a bundle
of any family; {"factory": "module:function", "sys_path": [folders], ...} calls that function with the spec
(its module found on sys.path, after the spec's folders), which is
how the CLI hands over every route it knows (the embedded demos, checkpoints) without the runtime
importing the CLI. The stub runs the venv's Python (PyTriton puts it on the server's PATH), so
the model imports this installed specrt.
"""
from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.runtime.serving.protocol import INPUTS, OUTPUTS, TensorSpec
from specrt.runtime.serving.repository import config_dtype

MODEL_PY = '''"""specrt's in-flight Triton model (written by `specrt serve --batching inflight`)."""
from specrt.runtime.serving.inflight_model import TritonPythonModel  # noqa: F401
'''


@dataclass(frozen=True)
class InflightConfig:
    """The in-flight flags of `specrt serve` (the model's parameters)."""

    slots: Optional[int] = None  # None: 8, or the model's max_images where fewer (inflight_model)
    groups: Optional[int] = None  # None: the scheduler's default (DEFAULT_GROUPS)
    max_queue: int = 64
    request_timeout_s: Optional[float] = None  # None: only a request's own Triton timeout
    max_group_wait_s: Optional[float] = None  # None: one image's time, measured (Scheduler)
    max_batch: int = 8  # rows one request may carry (Triton's max_batch_size)


def parameters_of(model_config: dict) -> dict[str, str]:
    """A model config's parameters as name -> string value."""
    return {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}


def open_pipeline(spec: dict[str, Any]) -> Any:
    """The pipeline a spec names: the factory's ("module:function", called with the spec), else the bundle's."""
    factory = spec.get("factory")
    for folder in spec.get("sys_path", ()):  # where the factory's module lives, when not installed
        if folder not in sys.path:
            sys.path.insert(0, str(folder))
    if factory:
        module, _, name = str(factory).partition(":")
        try:
            return getattr(importlib.import_module(module), name)(spec)
        except (ImportError, AttributeError) as exc:
            raise SpecrtError(f"pipeline factory {factory!r} cannot be loaded: {exc}") from exc
    if not spec.get("bundle"):
        raise SpecrtError("the pipeline spec names neither a factory nor a bundle")
    from specrt.runtime.family_registry import open_bundle
    from specrt.runtime.threads import resolve

    return open_bundle(Path(spec["bundle"]), spec.get("backend") or "ort", resolve(spec.get("threads")))


def _tensor(spec: TensorSpec, optional: bool) -> str:
    dims = ", ".join(str(d) for d in spec.shape)
    return f'  {{ name: "{spec.name}" data_type: {config_dtype(spec.dtype)} dims: [ {dims} ]' \
           f'{" optional: true" if optional else ""} }}'


def config_pbtxt(model_name: str, config: InflightConfig, pipeline_spec: dict[str, Any], drain_file: Path,
                 drain_s: float, outputs: tuple[TensorSpec, ...] = OUTPUTS) -> str:
    """config.pbtxt of the in-flight model: no dynamic batcher (the scheduler batches), one instance."""
    parameters = {"pipeline": json.dumps(pipeline_spec), "slots": "" if config.slots is None else str(config.slots),
                  "groups": "" if config.groups is None else str(config.groups), "max_queue": str(config.max_queue),
                  "request_timeout_s": "" if config.request_timeout_s is None else repr(config.request_timeout_s),
                  "max_group_wait_s": "" if config.max_group_wait_s is None else repr(config.max_group_wait_s), "drain_file": str(drain_file),
                  "drain_s": repr(float(drain_s))}
    lines = [f'name: "{model_name}"', 'backend: "python"', f"max_batch_size: {config.max_batch}",
             "instance_group [ { count: 1 kind: KIND_CPU } ]",
             "input [", ",\n".join(_tensor(spec, optional=True) for spec in INPUTS), "]",
             "output [", ",\n".join(_tensor(spec, optional=False) for spec in outputs), "]"]
    lines += [f"parameters {{ key: {json.dumps(key)} value {{ string_value: {json.dumps(value)} }} }}"
              for key, value in parameters.items()]
    return "\n".join(lines) + "\n"


def write_inflight_repository(folder: Path, model_name: str, config: InflightConfig, pipeline_spec: dict[str, Any],
                              drain_s: float, outputs: tuple[TensorSpec, ...] = OUTPUTS) -> Path:
    """Write the repository into the (empty, temporary) `folder`; returns the drain file's path
    (created by the server to start draining; the model answers with drain file + '.done')."""
    model = Path(folder) / model_name
    (model / "1").mkdir(parents=True)
    drain_file = Path(folder) / "drain"
    (model / "config.pbtxt").write_text(config_pbtxt(model_name, config, pipeline_spec, drain_file, drain_s, outputs))
    (model / "1" / "model.py").write_text(MODEL_PY)
    return drain_file
