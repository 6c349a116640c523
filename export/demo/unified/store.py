"""Where the unified demo's shipped checkpoints are, and how to read them.

Layout of weights/ (a `python -m specrt.export.demo.unified.training --out DIR` output has the same):

    demo.json         sampling defaults, grid, template, token layout, schedule, losses, quality
    target/, draft/   Hugging Face checkpoint directories (config.json, model.safetensors,
                      tokenizer.json, tokenizer_config.json, generation_config.json): what
                      `specrt export --target DIR` reads for a Lumina-mGPT checkpoint

The VQ that decodes the codes is the t2i demo's (export/demo/t2i/weights/vq.safetensors),
referenced, not copied: the two demos draw the same images from the same codes. Weights are
stored in fp16 (the t2i demo's convention, half the bytes) while config.json says float32, so
`from_pretrained` gives float32 models by default, which is what the CPU exporter and the
tests use. Paths and demo.json need no torch; the loaders import what they use.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError

WEIGHTS = Path(__file__).resolve().parent / "weights"
CONFIG_FILE = "demo.json"
FORMAT = "specrt-demo-unified"
VERSION = 1
TARGET_DIR, DRAFT_DIR = "target", "draft"


def weights_dir(root: Optional[Path] = None) -> Path:
    return Path(root) if root is not None else WEIGHTS


def target_dir(root: Optional[Path] = None) -> Path:
    """The target's checkpoint directory (packaged unless `root`)."""
    return weights_dir(root) / TARGET_DIR


def draft_dir(root: Optional[Path] = None) -> Path:
    return weights_dir(root) / DRAFT_DIR


def t2i_weights_dir() -> Path:
    from specrt.export.demo.t2i.packaged import packaged_weights_dir

    return packaged_weights_dir()


def vq_path() -> Path:
    """The demo VQ's weights: the t2i demo's vq.safetensors (512 codes, 8×8 grid, 32 px)."""
    return t2i_weights_dir() / "vq.safetensors"


def t2i_config() -> dict:
    """The t2i demo's demo.json: the VQ's architecture, the caption attributes' thresholds and
    its evaluator's sizes, all of which this demo shares."""
    return json.loads((t2i_weights_dir() / CONFIG_FILE).read_text())


def demo_config(root: Optional[Path] = None) -> dict:
    """demo.json of the packaged weights (or of `root`), checked to be this demo's."""
    path = weights_dir(root) / CONFIG_FILE
    if not path.is_file():
        raise SpecrtError(f"no {CONFIG_FILE} in {path.parent}: not a unified demo weights folder")
    config = json.loads(path.read_text())
    if config.get("format") != FORMAT or config.get("version") != VERSION:
        raise SpecrtError(f"{path} is not a {FORMAT} v{VERSION} file")
    return config


def sampling_defaults(root: Optional[Path] = None) -> dict:
    """cfg_scale / temperature / top_k / top_p the demo was tuned for (no torch)."""
    return dict(demo_config(root)["sampling_defaults"])


# ---- loaders (torch, transformers) -----------------------------------------------------------

def load_model(directory: Path) -> Any:
    """A shipped checkpoint as transformers' ChameleonForConditionalGeneration, float32, eval mode."""
    from specrt.lazy import require

    torch = require("torch", "the unified demo's models")
    transformers = require("transformers", "the unified demo's models")
    if not (Path(directory) / "config.json").is_file():
        raise SpecrtError(f"{directory} is not a checkpoint directory (no config.json); train the unified demo "
                          f"with `python -m specrt.export.demo.unified.training --out DIR`")
    return transformers.ChameleonForConditionalGeneration.from_pretrained(str(directory), dtype=torch.float32).eval()


def load_tokenizer(directory: Optional[Path] = None) -> Any:
    """The checkpoint's tokenizer.json as a `tokenizers.Tokenizer` (what a bundle runs with)."""
    from specrt.lazy import require

    tokenizers = require("tokenizers", "the unified demo's tokenizer")
    return tokenizers.Tokenizer.from_file(str(Path(directory or target_dir()) / "tokenizer.json"))


def load_vq() -> Any:
    """The t2i demo's VQ (LlamaGen's VQModel, float32, eval mode): encode images, decode codes."""
    from specrt.export.demo.store import _load_into, vq_config_from_dict
    from specrt.models.llamagen_vq import VQModel

    return _load_into(VQModel(vq_config_from_dict(t2i_config()["vq"])), vq_path())


def load_evaluator() -> Any:
    """The t2i demo's judge (digit and caption attributes of a 32×32 image)."""
    from specrt.export.demo.evaluator import EvaluatorConfig
    from specrt.export.demo.store import _load_into
    from specrt.export.demo.t2i.evaluator import PromptEvaluator

    config = EvaluatorConfig.from_dict(t2i_config()["evaluator"])
    return _load_into(PromptEvaluator(config), t2i_weights_dir() / "evaluator.safetensors")


def save_model(model: Any, directory: Path) -> Path:
    """save_pretrained with fp16 tensors (config.json keeps float32) and the demo's tokenizer."""
    from specrt.export.demo.unified.vocabulary import save_tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    model.save_pretrained(str(directory), state_dict=state)
    save_tokenizer(directory)
    return directory
