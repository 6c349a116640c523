"""The chameleon demo's hooks (export.demo.registry): captioned digits from a unified-vocabulary model.

Thin, like the other demos' hooks: the checkpoints are ordinary Hugging Face directories
(store.py), so every command reaches them through the same code a real Lumina-mGPT checkpoint
takes (specrt.export.unified: config, weights, recipe), with the t2i demo's VQ as the decoder
(Lumina-mGPT decodes with a VQGAN outside its checkpoint the same way).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.export.demo.unified.store import WEIGHTS, sampling_defaults
from specrt.models.step_kernels import DEFAULT_STEP_ATTENTION

# the longest demo prompt is 29 tokens (template, ten caption words, end of turn, image start and
# two size tokens): the bundle's cond_len, so the prefill pads little
MAX_PROMPT_TOKENS = 32


def packaged_weights_dir() -> Path:
    return WEIGHTS


def packaged_sampling_defaults() -> dict:
    """The demo's sampling defaults, read without torch (for --help)."""
    return sampling_defaults()


def model_set(weights: Optional[Path] = None, dtype: str = "float32") -> Any:
    """What `specrt export --demo chameleon` writes: target, draft, the t2i demo's VQ, the Lumina-mGPT
    recipe at the demo's grid and pixel size, the shipped tokenizer (export.unified.writer.UnifiedModels)."""
    import json

    import torch

    from specrt.export.demo.unified import store
    from specrt.export.unified import load_unified
    from specrt.export.unified.recipes import recipe_for
    from specrt.export.unified.tokenizer import read_tokenizer
    from specrt.export.unified.writer import UnifiedModels

    target_dir, draft_dir = store.target_dir(weights), store.draft_dir(weights)
    config = store.demo_config(weights)
    grid = (int(config["grid"]["rows"]), int(config["grid"]["cols"]))
    cond_len = int(config.get("max_prompt_tokens", MAX_PROMPT_TOKENS))
    target = load_unified(target_dir, grid=grid, cond_len=cond_len, dtype=getattr(torch, dtype))
    draft = load_unified(draft_dir, grid=grid, cond_len=cond_len, dtype=getattr(torch, dtype))
    vq = store.load_vq()
    tokenizer, tokenizer_file = read_tokenizer(target_dir)
    raw = json.loads((target_dir / "config.json").read_text())
    recipe = recipe_for("chameleon", raw, tokenizer, grid, int(vq.config.downsample))
    where = str(weights) if weights is not None else "demo-chameleon"
    return UnifiedModels(target=target, draft=draft, vq=vq, prompt=recipe.prompt,
                         sampling_defaults={**recipe.sampling_defaults, **store.sampling_defaults(weights)},
                         tokenizer_file=tokenizer_file,
                         sources={"target": f"{where}:target", "draft": f"{where}:draft", "vq": "demo-t2i:vq"})


def torch_pipeline(weights: Optional[Path] = None, max_window: Optional[int] = None, device: Optional[str] = None,
                   threads: Optional[int] = None, cuda_graphs: Optional[bool] = None, compile: Optional[bool] = None,
                   compile_mode: str = "default", step_matmuls: Optional[str] = None, step_attention: str = DEFAULT_STEP_ATTENTION,
                   **_: Any) -> Any:
    """UnifiedPipeline.from_torch over the demo's modules (what `specrt generate --demo chameleon` runs)."""
    from specrt.export.demo.unified import store
    from specrt.export.unified.tokenizer import read_tokenizer
    from specrt.runtime.families.unified.pipeline import UnifiedPipeline
    from specrt.runtime.families.unified.prompts import PromptEncoder
    from specrt.runtime.methods import DEFAULT_MAX_WINDOW
    from specrt.runtime.threads import set_torch_threads

    if threads is not None:
        set_torch_threads(threads)
    models = model_set(weights)
    tokenizer, _ = read_tokenizer(store.target_dir(weights))  # a trained folder's own target/, as model_set reads
    prompts = PromptEncoder(models.prompt, models.target.config.cond_len, tokenizer)
    return UnifiedPipeline.from_torch(models.target, models.draft, models.vq, prompts=prompts,
                                      max_window=max_window or DEFAULT_MAX_WINDOW, device=device,
                                      sampling_defaults=models.sampling_defaults, cuda_graphs=cuda_graphs,
                                      compile=compile, compile_mode=compile_mode, step_matmuls=step_matmuls,
                                      step_attention=step_attention)


def fidelity_judge(weights: Optional[Path] = None) -> Any:
    """Prompt following (digit, each attribute, all) and Fréchet distance to real digits: the t2i
    demo's judge (same images, same captions)."""
    from specrt.export.demo.t2i.fidelity import PromptJudge

    return PromptJudge.from_t2i_demo(None)


def bench_conditions(count: int) -> list[str]:
    """Image i's prompt: the t2i demo's default prompt set, cycled (the two demos compare directly)."""
    from specrt.export.demo.t2i.captions import default_prompts

    prompts = default_prompts()
    return [prompts[i % len(prompts)] for i in range(count)]


def train(out_dir: Optional[Path], seed: int = 0, steps_scale: float = 1.0, threads: int = 1,
          evaluate: bool = True) -> Any:
    """`specrt demo train --demo chameleon` (training.train_unified_demo): the trained weights' record,
    its demo.json as `.config` (what the command prints from)."""
    from types import SimpleNamespace

    from specrt.export.demo.unified.training import train_unified_demo

    return SimpleNamespace(config=train_unified_demo(out_dir, seed=seed, steps_scale=steps_scale, threads=threads,
                                                     evaluate=evaluate))


def format_quality(quality: dict) -> str:
    """demo.json's "quality" as `specrt demo train` prints it: prompt following at the defaults."""
    asked = quality.get("ar_prompt_following") or {}
    real = quality.get("real_prompt_following") or {}
    keys = [k for k in ("digit", "thickness", "slant", "width", "words", "all") if k in asked]
    lines = [f"prompt following ({quality.get('prompts', '?')} sampled images, CFG "
             f"{(quality.get('sampling_defaults') or {}).get('cfg_scale', '?')}):",
             "          " + "  ".join(f"{k:>9}" for k in keys),
             "samples   " + "  ".join(f"{asked[k]:9.3f}" for k in keys)]
    if real:
        lines.append("real      " + "  ".join(f"{real.get(k, float('nan')):9.3f}" for k in keys))
    return "\n".join(lines)
