"""Which models a unified bundle is exported from: Hugging Face checkpoint directories, or the demo.

`specrt export --target DIR [--draft DIR] [--vq DIR]` lands here: the language model(s) from
config.json + safetensors (export.unified.model), the model's own image decoder (export.unified.vq:
Janus's and Emu3's from the checkpoint, Chameleon's VQGAN from vqgan.ckpt + vqgan.yaml), and the
prompt recipe and sampling defaults its own code uses (export.unified.recipes), read with the
checkpoint's tokenizer.json.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Optional

from specrt.errors import SpecrtError
from specrt.export.unified.tokenizer import read_tokenizer
from specrt.export.unified.writer import UnifiedModels

GRID = re.compile(r"^\s*(\d+)\s*[xX*]\s*(\d+)\s*$")


def parse_grid(text: Optional[str]) -> Optional[tuple[int, int]]:
    """'48x48' -> (48, 48); None stays None (the model's default)."""
    if text is None:
        return None
    match = GRID.match(text)
    if not match or min(int(match.group(1)), int(match.group(2))) < 1:
        raise SpecrtError(f"--grid must be ROWSxCOLS in VQ tokens, e.g. 48x48, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def unified_models(target: Path, draft: Optional[Path] = None, vq: Optional[Path] = None,
                   grid: Optional[tuple[int, int]] = None, cond_len: Optional[int] = None, dtype: str = "float32",
                   progress: Optional[Callable[[str], None]] = None) -> UnifiedModels:
    """The models of Hugging Face checkpoint directories: target (+ draft of the same vocabulary),
    the target's image decoder (`vq`: a directory with Chameleon's vqgan.ckpt / vqgan.yaml when the
    checkpoint lacks them), its recipe and tokenizer."""
    import json

    import torch

    from specrt.export.unified import load_unified
    from specrt.export.unified.recipes import recipe_for
    from specrt.export.unified.vq import load_unified_vq

    say = progress or (lambda _msg: None)
    target = Path(target)
    say(f"loading {target} ...")
    bar = sys.stderr.isatty()  # a progress bar for people, none in logs
    model = load_unified(target, grid=grid, cond_len=cond_len, dtype=getattr(torch, dtype), progress=bar)
    config = model.config
    say(f"  {config.architecture}: {config.n_layer} layers, dim {config.dim}, {config.grammar.rows}x"
        f"{config.grammar.cols} image tokens of {config.grammar.image_vocab}"
        f"{', a row end after every row' if config.grammar.row_end else ''}")
    draft_model = None
    if draft is not None:
        say(f"loading {draft} ...")
        draft_model = load_unified(Path(draft), grid=(config.grammar.rows, config.grammar.cols),
                                   cond_len=config.cond_len, dtype=getattr(torch, dtype), progress=bar)
    vq_dir = Path(vq) if vq is not None else target
    decoder = None
    try:
        decoder = load_unified_vq(target, config.architecture,
                                  *((vq_dir / "vqgan.ckpt", vq_dir / "vqgan.yaml") if vq is not None else ()))
    except SpecrtError as missing:
        if vq is not None or config.architecture != "chameleon":
            raise
        say(f"note: {missing}; exporting a tokens-only bundle (generate --tokens-only; re-export with --vq DIR for "
            "images)")
    tokenizer, tokenizer_file = read_tokenizer(target)
    raw = json.loads((target / "config.json").read_text())
    recipe = recipe_for(config.architecture, raw, tokenizer, (config.grammar.rows, config.grammar.cols),
                        int(decoder.config.downsample) if decoder is not None else None)
    return UnifiedModels(target=model, draft=draft_model, vq=decoder.eval() if decoder is not None else None,
                         prompt=recipe.prompt,
                         sampling_defaults=dict(recipe.sampling_defaults), tokenizer_file=tokenizer_file,
                         sources={"target": str(target), "draft": str(draft or ""),
                                  "vq": str(vq_dir) if decoder is not None else ""})
