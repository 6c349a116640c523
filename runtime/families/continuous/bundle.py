"""Open a continuous bundle (manifest family "continuous") on onnxruntime or PyTorch.

The manifest alone says where everything is: each role's config, graphs and weights
(export/mar/export.py writes it). It is read once per bundle into a ContinuousManifest, which
the runners and the decoder are opened from; mistakes in it are SpecrtErrors with one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.manifest import read_manifest_json
from specrt.runtime.families.continuous.runner import ContinuousRunner, ContinuousSpec

FAMILY = "continuous"
BACKENDS = ("onnxruntime", "torch")


@dataclass(frozen=True)
class ContinuousManifest:
    """A continuous bundle's manifest.json, checked: its parsed JSON and the folder it describes."""

    root: Path
    raw: dict[str, Any]

    @classmethod
    def checked(cls, raw: Any, root: Path) -> "ContinuousManifest":
        """The manifest's parsed JSON checked to be a continuous bundle's: an object of this family
        whose `models` hold a target."""
        where = root / "manifest.json"
        if not isinstance(raw, dict):
            raise SpecrtError(f"{where} must hold a JSON object")
        if raw.get("family") != FAMILY:
            raise SpecrtError(f"{root} holds family {raw.get('family', 'llamagen')!r}, not {FAMILY!r}")
        models = raw.get("models")
        if not isinstance(models, dict) or not isinstance(models.get("target"), dict):
            raise SpecrtError(f"{where}: 'models' must hold at least a target")
        return cls(Path(root), raw)

    @property
    def models(self) -> dict[str, Any]:
        return self.raw["models"]


def continuous_manifest(bundle: str | Path | ContinuousManifest) -> ContinuousManifest:
    """The checked manifest given, as it is, or the one of the bundle folder `bundle` (read once)."""
    if isinstance(bundle, ContinuousManifest):
        return bundle
    raw, path = read_manifest_json(bundle)
    return ContinuousManifest.checked(raw, path.parent)


def read_continuous_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    """The parsed JSON of a continuous bundle's manifest, checked (continuous_manifest)."""
    return continuous_manifest(bundle_dir).raw


def model_spec(config: dict[str, Any]) -> ContinuousSpec:
    """The runtime spec of one model's manifest config."""
    try:
        dim, heads = int(config["dim"]), int(config["n_head"])
        return ContinuousSpec(token_dim=int(config["token_dim"]), seq_len=int(config["seq_len"]),
                              num_classes=int(config["num_classes"]), n_layer=int(config["n_layer"]),
                              n_head=heads, head_dim=dim // heads, hidden=dim,
                              diffusion_steps=int(config["diffusion_steps"]), schedule=str(config["schedule"]),
                              beta_start=float(config.get("beta_start", 1e-4)),
                              beta_end=float(config.get("beta_end", 0.02)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        raise SpecrtError(f"continuous model config is incomplete or malformed: {err!r}") from None


def open_runner(bundle: str | Path | ContinuousManifest, role: str,
                backend: str = "onnxruntime") -> Optional[ContinuousRunner]:
    """The runner of `role` ("target" or "draft") in a continuous bundle (its checked manifest, or
    its folder); None if it has none."""
    if backend not in BACKENDS:
        raise SpecrtError(f"unknown backend {backend!r} for a continuous bundle; choose one of {', '.join(BACKENDS)}")
    manifest = continuous_manifest(bundle)
    bundle_dir = manifest.root
    entry = manifest.models.get(role)
    if entry is None:
        return None
    spec = model_spec(entry["config"])
    for key in ("step", "head", "weights"):
        if not (bundle_dir / entry[key]).is_file():
            raise SpecrtError(f"bundle {bundle_dir} lacks {entry[key]} ({role} {key})")
    if backend == "onnxruntime":
        from specrt.runtime.families.continuous.ort_runner import OrtContinuousRunner

        return OrtContinuousRunner(spec, bundle_dir / entry["step"], bundle_dir / entry["head"])
    from specrt.lazy import require
    from specrt.models.mar.model import MAR, MARConfig
    from specrt.runtime.families.continuous.torch_runner import TorchContinuousRunner

    require("torch", "the torch backend")
    from safetensors.torch import load_file

    model = MAR(MARConfig(**entry["config"]))
    model.load_state_dict(load_file(str(bundle_dir / entry["weights"])), strict=True)
    return TorchContinuousRunner(model)


DecoderFn = Callable[[np.ndarray], np.ndarray]


def open_decoder(bundle: str | Path | ContinuousManifest, backend: str = "onnxruntime",
                 threads: Optional[int] = 1) -> Optional[DecoderFn]:
    """The bundle's tokenizer decoder (`bundle`: its checked manifest, or its folder) as tokens
    [N, seq_len, C] -> images [N,3,H,W] float in about [-1, 1]; None when the bundle has none (it
    then makes tokens only)."""
    if backend not in BACKENDS:
        raise SpecrtError(f"unknown backend {backend!r} for a continuous bundle; choose one of {', '.join(BACKENDS)}")
    manifest = continuous_manifest(bundle)
    bundle_dir = manifest.root
    entry = manifest.raw.get("decoder")
    if entry is None:
        return None
    for key in ("graph", "weights"):
        if not (bundle_dir / entry[key]).is_file():
            raise SpecrtError(f"bundle {bundle_dir} lacks {entry[key]} (decoder {key})")
    if backend == "onnxruntime":
        from specrt.lazy import require

        ort = require("onnxruntime", "the onnxruntime backend")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(bundle_dir / entry["graph"]), options, providers=["CPUExecutionProvider"])
        return lambda tokens: session.run(None, {"tokens": np.ascontiguousarray(tokens, np.float32)})[0]
    from specrt.lazy import require
    from specrt.models.mar.autoencoder import AEConfig, TokenDecoder

    torch = require("torch", "the torch backend")
    from safetensors.torch import load_file

    module = TokenDecoder(AEConfig.from_dict(entry["config"]))
    module.load_state_dict(load_file(str(bundle_dir / entry["weights"])), strict=True)
    module.eval()

    def decode(tokens: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(np.ascontiguousarray(tokens, np.float32))).numpy()
    return decode
