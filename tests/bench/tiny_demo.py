"""A random-weight demo weights folder (the demo's file format, small models) for bench tests.

The bench only needs the demo's interfaces: load_demo (target, draft, VQ, evaluator,
sampling defaults) and the held-out digits. Random weights keep the tests independent of
the trained demo and fast; the numbers they produce mean nothing, only their presence
and consistency are checked.
"""
from __future__ import annotations

from typing import Any

from pathlib import Path

import torch

from specrt.export.demo.configs import SAMPLING_DEFAULTS
from specrt.export.demo.evaluator import DigitClassifier, EvaluatorConfig
from specrt.export.demo.store import DemoModels, config_dicts, save_demo
from specrt.models.llamagen_gpt import GPT, GPTConfig
from specrt.models.llamagen_vq import VQConfig, VQModel

CLASSES, GRID, VOCAB = 10, 8, 64  # 8x8 tokens x4 downsampling = the evaluator's 32x32 images


def tiny_configs() -> tuple[VQConfig, GPTConfig, GPTConfig, EvaluatorConfig]:
    vq = VQConfig(codebook_size=VOCAB, codebook_embed_dim=4, ch=8, ch_mult=(1, 2, 2), z_channels=8,
                  num_res_blocks=1, norm_groups=4, codebook_show_usage=False)
    target = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=VOCAB, num_classes=CLASSES, grid_size=GRID,
                       multiple_of=16)
    draft = GPTConfig(dim=16, n_layer=1, n_head=2, vocab_size=VOCAB, num_classes=CLASSES, grid_size=GRID,
                      multiple_of=16)
    return vq, target, draft, EvaluatorConfig(num_classes=CLASSES, channels=(4, 4, 4), feature_dim=8)


def write_tiny_demo(out: Path, seed: int = 0) -> Path:
    """Save random tiny demo models in `specrt demo train`'s format; returns the folder."""
    torch.manual_seed(seed)
    vq_cfg, target_cfg, draft_cfg, eval_cfg = tiny_configs()
    models = DemoModels(GPT(target_cfg).eval(), GPT(draft_cfg).eval(), VQModel(vq_cfg).eval(),
                        DigitClassifier(eval_cfg).eval(), config_dicts(vq_cfg, target_cfg, draft_cfg, eval_cfg))
    models.config["sampling_defaults"] = dict(SAMPLING_DEFAULTS)
    return save_demo(models, out)


def run_cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """`specrt ARGV` in this process: (exit code, stdout, stderr)."""
    from specrt.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err
