"""The t2i demo's weights folder: demo.json, four safetensors files and a text_encoder/ directory.

Same conventions as the c2i demo (export.demo.store: fp16 storage, float32 in memory, one
file per model); the text encoder is a transformers directory (text_model), so
runtime.text.T5TextEncoder and `specrt export` read it as they read flan-t5-xl.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.lazy import require

torch = require("torch", "the t2i demo models")

from specrt.export.demo.evaluator import EvaluatorConfig  # noqa: E402
from specrt.export.demo.store import (  # noqa: E402
    CONFIG_FILE, DemoModels, _load_into, _save_tensors, gpt_config_from_dict, read_config, vq_config_from_dict,
)
from specrt.export.demo.t2i.packaged import packaged_weights_dir  # noqa: E402
from specrt.export.demo.t2i.captions import AttributeBins  # noqa: E402
from specrt.export.demo.t2i.evaluator import PromptEvaluator  # noqa: E402
from specrt.models.llamagen_gpt import GPT  # noqa: E402
from specrt.models.llamagen_vq import VQModel  # noqa: E402

FORMAT = "specrt-demo-t2i"
VERSION = 1
WEIGHT_FILES = {"vq": "vq.safetensors", "target": "target.safetensors", "draft": "draft.safetensors",
                "evaluator": "evaluator.safetensors"}
TEXT_ENCODER_DIR = "text_encoder"


@dataclass
class T2IDemoModels(DemoModels):
    """The trained t2i family (eval mode, float32; the evaluator a PromptEvaluator) and the
    folder of its text encoder."""

    text_encoder_dir: Optional[Path] = None

    @property
    def bins(self) -> AttributeBins:
        """The per-digit thresholds that turned measurements into caption words."""
        return AttributeBins.from_dict(self.config["attributes"])

    def text_encoder(self, device: Any = None) -> Any:
        """runtime.text.T5TextEncoder over the demo's encoder, tokenising to the GPTs' cond_len."""
        from specrt.runtime.text import T5TextEncoder

        return T5TextEncoder(self.text_encoder_dir, max_length=self.target.config.cond_len, device=device)


def save_t2i_demo(models: T2IDemoModels, out_dir: str | Path) -> Path:
    """Write the weights and demo.json into out_dir (the text encoder is written by training)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for role, filename in WEIGHT_FILES.items():
        _save_tensors(getattr(models, role), out / filename)
    config = dict(models.config, demo="t2i", format=FORMAT, version=VERSION,
                  files=dict(WEIGHT_FILES, text_encoder=TEXT_ENCODER_DIR))
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
    return out


def load_t2i_demo(path: str | Path | None = None) -> T2IDemoModels:
    """The t2i family from `path` (a `specrt demo train --demo t2i` output) or the packaged weights."""
    root = Path(path) if path is not None else packaged_weights_dir()
    config = read_config(root, FORMAT, VERSION, " (a c2i demo folder goes with --demo c2i)")
    encoder_dir = root / TEXT_ENCODER_DIR
    if not (encoder_dir / "config.json").is_file():
        raise SpecrtError(f"the t2i demo's text encoder is missing from {encoder_dir}")
    return T2IDemoModels(
        target=_load_into(GPT(gpt_config_from_dict(config["target"])), root / WEIGHT_FILES["target"]),
        draft=_load_into(GPT(gpt_config_from_dict(config["draft"])), root / WEIGHT_FILES["draft"]),
        vq=_load_into(VQModel(vq_config_from_dict(config["vq"])), root / WEIGHT_FILES["vq"]),
        evaluator=_load_into(PromptEvaluator(EvaluatorConfig.from_dict(config["evaluator"])),
                             root / WEIGHT_FILES["evaluator"]),
        text_encoder_dir=encoder_dir, config=config)
