"""The continuous family (MAR-style models, methods ar and cspd) on `specrt generate`.

A continuous BUNDLE (manifest family "continuous") runs on onnxruntime from its manifest alone;
the "mar" demo runs its PyTorch modules (export/mar/hooks.py). Flags mean what they mean for the
discrete family where they apply (--class, --seed, --out, --cfg-scale, --temperature, --param,
--stats, --save-tokens, --tokens-only); the ones that do not (top-k/top-p, prompts, checkpoints)
are refused in one line. MAR's cfg_schedule is a sampling key: --param cfg_schedule=linear.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click
import numpy as np

from specrt.errors import SpecrtError

METHODS = ("ar", "cspd")


def open_pipeline(bundle: Optional[Path], backend: Optional[str], threads: Optional[int] = None,
                  demo_weights: Optional[Path] = None) -> Any:
    """A continuous BUNDLE on onnxruntime (or torch), else the mar demo's PyTorch modules (with
    `threads` torch threads; None: 1, the embedded demo's default as for c2i)."""
    if bundle is not None:
        from specrt.runtime.families import open_bundle

        return open_bundle(bundle, backend or "ort", threads)
    if backend not in (None, "torch"):
        raise SpecrtError(f"--backend {backend} needs a BUNDLE: export the demo with `specrt export --demo mar --out DIR`")
    from specrt.export.mar.hooks import torch_pipeline

    return torch_pipeline(demo_weights, threads=1 if threads is None else threads)


def refuse(refused: dict[str, Any]) -> None:
    """SpecrtError naming the first flag in `refused` ({flag: given?}) that was given."""
    given = [flag for flag, value in refused.items() if value]
    if given:
        raise SpecrtError(f"{given[0]} does not apply to a continuous (MAR-style) model")


def generate(pipe: Any, method: str, class_ids: tuple[int, ...], seed: int, out: Path, sampling: dict[str, Any],
             params: dict[str, str], stats_path: Optional[Path], tokens_only: bool, tokens_path: Optional[Path],
             refused: dict[str, Any]) -> None:
    """Generate with a ContinuousPipeline and write PNGs / tokens / stats as `specrt generate` does."""
    from specrt.commands._outputs import save_images

    refuse(refused)
    if method not in METHODS:
        raise SpecrtError(f"method {method!r} is for discrete tokens; a continuous model runs {', '.join(METHODS)}")
    kwargs = {**{k: v for k, v in sampling.items() if v is not None}, **params}  # validated where they are used
    result = pipe.generate(list(class_ids or (0,)), method=method, seed=seed, decode=not tokens_only, **kwargs)
    paths = [] if tokens_only else save_images(result.images, out, len(result.tokens))
    if tokens_only or tokens_path:
        path = tokens_path or out.with_suffix(".npy")
        with open(path, "wb") as f:
            np.save(f, result.tokens)
        paths.append(path)
    stats = result.stats
    summary = {"method": method, "tokens": stats.tokens, "target_passes": stats.target_passes,
               "drafted": stats.drafted, "accepted": stats.accepted, "acceptance_rate": stats.acceptance_rate,
               "tokens_per_target_pass": stats.tokens_per_target_pass,
               "residual_proposals": stats.residual_proposals, "seconds": sum(result.seconds),
               "sampling": result.sampling}
    if stats_path:
        stats_path.write_text(json.dumps(summary, indent=2) + "\n")
    s = result.sampling
    click.echo(f"wrote {', '.join(str(p) for p in paths)}  ({method}: {stats.tokens} tokens, {stats.target_passes} "
               f"target passes, {stats.tokens_per_target_pass:.2f} tokens/pass, acceptance {stats.acceptance_rate:.2f}, "
               f"{sum(result.seconds):.2f} s; sampling cfg_scale={s['cfg_scale']} temperature={s['temperature']} "
               f"cfg_schedule={s['cfg_schedule']})")

