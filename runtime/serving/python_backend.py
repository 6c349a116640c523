"""The model of a `specrt triton-repo` repository, for the stock tritonserver container.

Triton's Python backend runs each model instance in its own stub process and calls
`initialize` once, then `execute` with every batch its dynamic batcher formed. The
repository's model.py only re-exports TritonPythonModel from here, so what the container
runs is this tested module of the installed specrt. config.pbtxt's parameters name the
bundle folder (beside model.py's version folder), the backend (ort, ort-cpu, ort-cuda,
ort-trt, trt; a continuous bundle's: ort, ort-cpu) and the onnxruntime threads. The bundle is
opened through its manifest's family (runtime/families), as `specrt serve` opens it.
"""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from specrt.runtime.serving.handler import RequestHandler
from specrt.runtime.serving.protocol import INPUTS


def _parameters(model_config: dict) -> dict[str, str]:
    return {key: value.get("string_value", "") for key, value in model_config.get("parameters", {}).items()}


class TritonPythonModel:
    """One instance: the bundle's pipeline on the instance's GPU (or the CPU)."""

    def initialize(self, args: dict[str, Any]) -> None:
        from specrt.runtime.family_registry import read_bundle

        parameters = _parameters(json.loads(args["model_config"]))
        bundle = Path(args["model_repository"]) / str(args["model_version"]) / parameters.get("bundle", "bundle")
        if args.get("model_instance_kind") == "GPU":
            # this stub process serves one instance; instance_group places one per GPU, and
            # every backend (onnxruntime's providers, TensorRT) then uses "its" device 0
            os.environ["CUDA_VISIBLE_DEVICES"] = str(args.get("model_instance_device_id", 0))
        threads = int(parameters["threads"]) if parameters.get("threads") else None
        family, manifest = read_bundle(bundle)
        pipeline = family.open(manifest, backend=parameters.get("backend") or "ort", threads=threads)
        self.handler = RequestHandler(pipeline, family)

    def execute(self, requests: list) -> list:
        pb_utils = importlib.import_module("triton_python_backend_utils")  # exists inside the stub only
        inputs = []
        for request in requests:
            tensors = {spec.name: pb_utils.get_input_tensor_by_name(request, spec.name) for spec in INPUTS}
            inputs.append({name: tensor.as_numpy() for name, tensor in tensors.items() if tensor is not None})
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, array) for name, array in out.items()])
                for out in self.handler(inputs)]
