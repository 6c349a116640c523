"""Tiny random-weight models and one exported bundle shared by the export tests.

Exporting five graphs costs tens of seconds on a shared 2-core machine, so the bundle is
built once per test process (cached) and read-only for the tests; tests that need to break
or rewrite a bundle copy it first.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from specrt.export.bundle import ExportOptions, ModelSet, write_bundle
from specrt.manifest import Manifest
from specrt.models.llamagen_gpt import GPT, GPTConfig
from specrt.models.llamagen_vq import VQConfig, VQModel

VOCAB, CLASSES, GRID = 96, 5, 4
MAX_WINDOW = 20  # > 17, so W = 1, 5, 17 all run within the profile
NEIGHBOURS_K = 6
# `specrt export` flags that leave out the one-call draft graphs (chain, static tree, dynamic growth):
# a test about another part of the bundle skips the three slowest exports
NO_METHOD_GRAPHS = ["--draft-chain", "0", "--draft-tree", "none", "--draft-growth", "none"]


def tiny_target_config(**overrides) -> GPTConfig:
    fields = dict(dim=32, n_layer=2, n_head=4, n_kv_head=2, vocab_size=VOCAB, num_classes=CLASSES, grid_size=GRID,
                  multiple_of=16)
    return GPTConfig(**{**fields, **overrides})


def tiny_draft_config(**overrides) -> GPTConfig:
    fields = dict(dim=16, n_layer=1, n_head=2, vocab_size=VOCAB, num_classes=CLASSES, grid_size=GRID, multiple_of=16)
    return GPTConfig(**{**fields, **overrides})


def tiny_vq_config(**overrides) -> VQConfig:
    fields = dict(codebook_size=VOCAB, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), z_channels=8, num_res_blocks=1,
                  norm_groups=4, codebook_show_usage=False)
    return VQConfig(**{**fields, **overrides})


def tiny_models(seed: int = 0) -> ModelSet:
    torch.manual_seed(seed)
    return ModelSet(target=GPT(tiny_target_config()).eval(), draft=GPT(tiny_draft_config()).eval(),
                    vq=VQModel(tiny_vq_config()).eval(), sources={"target": "random", "draft": "random", "vq": "random"})


TINY_OPTIONS = ExportOptions(max_window=MAX_WINDOW, max_batch=4, neighbours_k=NEIGHBOURS_K)


def temporary_bundle(models: ModelSet, options: ExportOptions, prefix: str) -> Manifest:
    """`models` exported into a temporary directory removed when the test process exits."""
    torch.set_num_threads(2)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, root, True)
    return write_bundle(models, root / "bundle", options)


@lru_cache(maxsize=None)
def tiny_bundle() -> tuple[Manifest, ModelSet]:
    """(manifest, models) of a bundle exported once per process; do not modify its files."""
    models = tiny_models()
    return temporary_bundle(models, TINY_OPTIONS, "specrt-tiny-bundle-"), models


def cli_exit_code(argv: list[str]) -> int:
    """Run the CLI as the `specrt` entry point would; 0 when it returns normally."""
    from specrt.cli import main

    try:
        main(argv)
    except SystemExit as exc:
        return exc.code
    return 0
