"""The t2i demo (export.demo.registry hooks): captioned digits for LlamaGen's text-to-image GPTs.

    from specrt.export.demo.t2i import load
    demo = load()                 # .target, .draft (t2i GPTs), .vq, .evaluator, .text_encoder()
    pipe = torch_pipeline()       # Pipeline.from_torch with the demo's text encoder
    pipe.generate(prompts=["a thick slanted seven"])

Captions are built from properties measured on each digit (captions.py); a small T5 encoder
trained here (text_model.py) turns them into caption embeddings; the target and draft are
the c2i demo's GPTs with LlamaGen's caption conditioning; the evaluator scores the digit and
each attribute (evaluator.py). Everything heavy is imported on first use.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.export.demo.t2i.packaged import packaged_sampling_defaults, packaged_weights_dir

__all__ = ["packaged_weights_dir", "packaged_sampling_defaults", "load", "model_set", "torch_pipeline",
           "fidelity_judge", "bench_conditions", "train", "format_quality"]


def load(weights: Optional[Path] = None) -> Any:
    """The trained t2i family (store.T2IDemoModels) from `weights` or the packaged folder."""
    from specrt.export.demo.t2i.store import load_t2i_demo

    return load_t2i_demo(weights)


def model_set(weights: Optional[Path] = None) -> Any:
    """What `specrt export --demo t2i` writes: the GPTs, the VQ and the text encoder graph."""
    from specrt.export.bundle import ModelSet

    demo = load(weights)
    where = str(weights) if weights is not None else "demo-t2i"
    return ModelSet(target=demo.target, draft=demo.draft, vq=demo.vq, text_encoder=demo.text_encoder(),
                    sources={role: f"{where}:{role}" for role in ("target", "draft", "vq")})


def torch_pipeline(weights: Optional[Path] = None, **options: Any) -> Any:
    """Pipeline.from_torch over the demo with its text encoder; `options` are from_torch's."""
    from specrt.export.demo.t2i.report import demo_pipeline

    return demo_pipeline(load(weights), **options)


def fidelity_judge(weights: Optional[Path] = None) -> Any:
    """Prompt following (digit, each attribute, all) and Fréchet distance to real digits."""
    from specrt.export.demo.t2i.fidelity import PromptJudge

    return PromptJudge.from_t2i_demo(weights)


def bench_conditions(count: int) -> list[str]:
    """Image i's prompt: the default prompt set (captions.default_prompts), cycled."""
    from specrt.export.demo.t2i.captions import default_prompts

    prompts = default_prompts()
    return [prompts[i % len(prompts)] for i in range(count)]


def train(out_dir: Optional[Path], seed: int = 0, steps_scale: float = 1.0, threads: int = 1,
          evaluate: bool = True) -> Any:
    """`specrt demo train --demo t2i` (pipeline.train_t2i_demo; starts from the packaged c2i demo)."""
    from specrt.export.demo.t2i.pipeline import train_t2i_demo

    return train_t2i_demo(out_dir, seed=seed, steps_scale=steps_scale, threads=threads, evaluate=evaluate)


def format_quality(quality: dict) -> str:
    from specrt.export.demo.t2i.report import format_summary

    return format_summary(quality)
