"""Saving and loading the demo family: safetensors weights + one JSON of configs and metrics.

Why this layout: the weights ship inside the package (export/demo/weights/), so every
command works offline; fp16 storage keeps the wheel small and everything is loaded back as
float32, which is what training, export and the torch backend use. One file per model
lets the exporter read the target or the VQ decoder alone.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.sampling import SamplingParams

torch = require("torch", "the demo models")
safetensors_torch = require("safetensors.torch", "the demo models")

from specrt.export.demo.evaluator import DigitClassifier, EvaluatorConfig  # noqa: E402
from specrt.models.llamagen_gpt import GPT, GPTConfig  # noqa: E402
from specrt.models.llamagen_vq import VQConfig, VQModel  # noqa: E402

CONFIG_FILE = "demo.json"
FORMAT = "specrt-demo"
VERSION = 1
WEIGHT_FILES = {"vq": "vq.safetensors", "target": "target.safetensors", "draft": "draft.safetensors",
                "evaluator": "evaluator.safetensors"}


def packaged_weights_dir() -> Path:
    """Where the committed demo weights live inside the installed package."""
    return Path(__file__).resolve().parent / "weights"


@dataclass
class DemoModels:
    """The trained family, in eval mode, float32: target and draft GPTs share the VQ tokenizer."""

    target: GPT
    draft: GPT
    vq: VQModel
    evaluator: DigitClassifier
    config: dict

    def __post_init__(self) -> None:
        # the target carries the demo's own defaults, so every path that starts from it (export,
        # Pipeline.from_torch, bench) samples as demo.json says (specrt.runtime.defaults.defaults_of)
        if "sampling_defaults" in self.config:
            self.target.sampling_defaults = self.sampling_defaults

    @property
    def sampling_defaults(self) -> SamplingParams:
        """The CFG scale / temperature / top-k / top-p the demo was tuned for."""
        return SamplingParams(**self.config["sampling_defaults"])


@torch.no_grad()
def round_to_storage(model: "torch.nn.Module") -> "torch.nn.Module":
    """Round float parameters to fp16 precision in place, so the in-memory model is exactly
    what save_demo writes and load_demo reads back (metrics then describe the shipped weights)."""
    for tensor in model.state_dict().values():
        if tensor.is_floating_point():
            tensor.copy_(tensor.to(torch.float16).float())
    return model


def _save_tensors(model: "torch.nn.Module", path: Path) -> None:
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
             if not k.endswith("codebook_used")}
    safetensors_torch.save_file(state, str(path))


def save_demo(models: DemoModels, out_dir: str | Path) -> Path:
    """Write the four weight files and demo.json into out_dir (created); returns out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for role, filename in WEIGHT_FILES.items():
        _save_tensors(getattr(models, role), out / filename)
    config = dict(models.config, format=FORMAT, version=VERSION, files=WEIGHT_FILES)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
    return out


def update_config(folder: str | Path, **entries: dict) -> Path:
    """Replace top-level entries of a weights folder's demo.json (e.g. re-tuned sampling
    defaults and the quality measured with them), leaving the weights untouched."""
    path = Path(folder) / CONFIG_FILE
    config = json.loads(path.read_text())
    config.update(entries)
    path.write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
    return path


def gpt_config_from_dict(d: dict) -> GPTConfig:
    return GPTConfig(**{f.name: d[f.name] for f in fields(GPTConfig) if f.name in d})


def vq_config_from_dict(d: dict) -> VQConfig:
    return VQConfig(**{f.name: d[f.name] for f in fields(VQConfig) if f.name in d})


def config_dicts(vq: VQConfig, target: GPTConfig, draft: GPTConfig, evaluator: EvaluatorConfig) -> dict:
    """The architecture part of demo.json (the VQ usage monitor is a training-only buffer)."""
    vq_dict = dict(asdict(vq), codebook_show_usage=False, downsample=vq.downsample)
    return {"vq": vq_dict, "target": asdict(target), "draft": asdict(draft), "evaluator": evaluator.to_dict()}


def _load_into(model: "torch.nn.Module", path: Path) -> "torch.nn.Module":
    if not path.is_file():
        raise SpecrtError(f"demo weights file {path} is missing (train them with `specrt demo train --out DIR`)")
    state = {k: v.float() for k, v in safetensors_torch.load_file(str(path)).items()}
    model.load_state_dict(state, strict=True)
    return model.eval()


def read_config(root: Path, fmt: str = FORMAT, version: int = VERSION, hint: str = "",
                config_file: str = CONFIG_FILE, kind: str = "demo") -> dict:
    """A weights folder's `config_file` (demo.json), checked to be `fmt` v`version` (one line
    otherwise); every demo family's loader reads its JSON through here."""
    config_path = root / config_file
    if not config_path.is_file():
        raise SpecrtError(f"no {config_file} in {root}: not a {kind} weights folder")
    config = json.loads(config_path.read_text())
    if config.get("format") != fmt or config.get("version") != version:
        raise SpecrtError(f"{config_path} is not a {fmt} v{version} file{hint}")
    return config


def load_demo(path: str | Path | None = None) -> DemoModels:
    """Load the demo family from `path` (a `specrt demo train` output) or the packaged weights."""
    root = Path(path) if path is not None else packaged_weights_dir()
    config = read_config(root)
    target = _load_into(GPT(gpt_config_from_dict(config["target"])), root / WEIGHT_FILES["target"])
    draft = _load_into(GPT(gpt_config_from_dict(config["draft"])), root / WEIGHT_FILES["draft"])
    vq = _load_into(VQModel(vq_config_from_dict(config["vq"])), root / WEIGHT_FILES["vq"])
    evaluator = _load_into(DigitClassifier(EvaluatorConfig.from_dict(config["evaluator"])),
                           root / WEIGHT_FILES["evaluator"])
    return DemoModels(target, draft, vq, evaluator, config)
