"""The embedded demo family: a LlamaGen-architecture VQ tokenizer, target and draft GPT, and a
digit evaluator, trained here on scikit-learn's handwritten digits and shipped as weights.

    from specrt.export.demo import load_demo, demo_dataset
    demo = load_demo()            # .target, .draft (GPT), .vq (VQModel), .evaluator, .config
    split = demo_dataset()        # .held_out_images / .held_out_labels: real 32×32 digits

Needs torch (the `export` extra). Everything is imported on first use, so importing this
package is cheap.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specrt.export.demo.dataset import DigitsSplit
    from specrt.export.demo.store import DemoModels

__all__ = ["load_demo", "demo_dataset", "packaged_weights_dir", "packaged_sampling_defaults"]


def load_demo(path=None) -> "DemoModels":
    """The trained demo family (float32, eval mode) from `path` or the packaged weights."""
    from specrt.export.demo.store import load_demo as _load

    return _load(path)


def demo_dataset() -> "DigitsSplit":
    """The deterministic train / held-out split of real digits, [N,3,32,32] in [-1, 1]."""
    from specrt.export.demo.dataset import load_split

    return load_split()


def packaged_weights_dir():
    """Folder of the committed demo weights (demo.json + *.safetensors)."""
    from specrt.export.demo.store import packaged_weights_dir as _dir

    return _dir()


def packaged_sampling_defaults() -> dict:
    """The packaged demo's sampling defaults from its demo.json, read without torch (for --help)."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parent / "weights" / "demo.json").read_text())["sampling_defaults"]
