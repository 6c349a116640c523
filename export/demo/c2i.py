"""The c2i demo's hooks (export.demo.registry): class-conditional digits, the package's first demo.

Thin: the models, their training and their judge live in this package's other modules
(store, pipeline, evaluator, fidelity); this file only says how each command reaches them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.export.demo import packaged_sampling_defaults, packaged_weights_dir
from specrt.export.demo.dataset import NUM_CLASSES

__all__ = ["packaged_weights_dir", "packaged_sampling_defaults", "model_set", "torch_pipeline", "fidelity_judge",
           "bench_conditions", "train", "format_quality"]


def model_set(weights: Optional[Path] = None) -> Any:
    """The trained c2i family as the exporter takes it (specrt.export.bundle.ModelSet): the
    package's weights, or a `specrt demo train` folder's."""
    from specrt.errors import SpecrtError
    from specrt.export.bundle import ModelSet
    from specrt.export.demo import load_demo

    try:
        demo = load_demo(weights)
    except SpecrtError as exc:
        if weights is not None:
            raise
        raise SpecrtError(f"the packaged demo weights cannot be loaded ({exc}); export checkpoints with "
                          "--target/--draft/--vq, or real-size random weights with --random-weights") from exc
    where = str(weights) if weights else "demo"
    return ModelSet(target=demo.target, draft=demo.draft, vq=demo.vq,
                    sources={"target": f"{where}:target", "draft": f"{where}:draft", "vq": f"{where}:vq"})


def torch_pipeline(weights: Optional[Path] = None, **options: Any) -> Any:
    """Pipeline.from_torch over the demo's modules; `options` are from_torch's (threads, device, ...)."""
    from specrt.export.demo import load_demo
    from specrt.runtime.pipeline import Pipeline

    demo = load_demo(weights)
    return Pipeline.from_torch(demo.target, demo.draft, demo.vq, **options)


def fidelity_judge(weights: Optional[Path] = None) -> Any:
    """Class accuracy and Fréchet distance against held-out real digits (fidelity.FidelityJudge)."""
    from specrt.export.demo.fidelity import FidelityJudge

    return FidelityJudge.from_demo(weights)


def bench_conditions(count: int) -> list[int]:
    """Image i asks for class i mod 10, so every class is equally used."""
    return [i % NUM_CLASSES for i in range(count)]


def train(out_dir: Optional[Path], seed: int = 0, steps_scale: float = 1.0, threads: int = 1,
          evaluate: bool = True) -> Any:
    """`specrt demo train --demo c2i`: VQ, target, draft and evaluator from scratch (pipeline.train_demo)."""
    from specrt.export.demo.pipeline import train_demo

    return train_demo(out_dir, seed=seed, steps_scale=steps_scale, evaluate=evaluate, threads=threads)


def format_quality(quality: dict) -> str:
    """demo.json's "quality" entry as `specrt demo train` prints it."""
    from specrt.export.demo.report import format_summary

    return format_summary(quality)
