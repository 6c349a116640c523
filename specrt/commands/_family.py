"""`specrt generate` for a model family other than LlamaGen's, through the Family interface alone
(runtime/families: its pipeline, methods, sampling keys, decoder and stats summary).

A BUNDLE of such a family runs on the backend given (onnxruntime by default) from its manifest
alone; an embedded demo of it (`--demo mar`) through the family's `demo_pipeline`. Flags mean what
they mean for LlamaGen where they apply (--class, --seed, --out, --cfg-scale, --temperature,
--param, --stats, --save-tokens, --tokens-only); the ones that do not (sampling keys the family
lacks, prompts, checkpoints) are refused in one line. Family-specific sampling keys go through
--param (the continuous family's cfg_schedule: --param cfg_schedule=linear).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click

from specrt.errors import SpecrtError
from specrt.runtime.families.base import Family


def open_pipeline(family: Family, bundle: Optional[Path], demo: Optional[str], backend: Optional[str],
                  threads: Optional[int] = None) -> Any:
    """The family's pipeline over BUNDLE on `backend`, else its embedded demo `demo`."""
    if bundle is not None:
        from specrt.runtime.families import open_bundle

        return open_bundle(bundle, backend or "ort", threads)
    if backend not in (None, "torch"):
        raise SpecrtError(f"--backend {backend} needs a BUNDLE: export the demo with `specrt export --demo {demo} "
                          "--out DIR`")
    return family.demo_pipeline(demo, threads)


def refuse(family: Family, method: str, refused: dict[str, Any]) -> None:
    """Before the model loads: SpecrtError naming the first flag in `refused` ({flag: given?})
    that was given, or a method the family does not run."""
    given = [flag for flag, value in refused.items() if value]
    if given:
        raise SpecrtError(f"{given[0]} does not apply to a {family.description} model")
    if method not in family.methods:
        raise SpecrtError(f"method {method!r}: a {family.description} model runs {', '.join(family.methods)}")


def generate(family: Family, pipe: Any, method: str, class_ids: tuple[int, ...], seed: int, out: Path,
             prompts: tuple[str, ...], sampling: dict[str, Any], params: dict[str, str], stats_path: Optional[Path],
             tokens_only: bool, tokens_path: Optional[Path]) -> None:
    """Generate with the family's pipeline and write PNGs / tokens / stats as `specrt generate` does."""
    from specrt.commands._outputs import save_images, save_tokens, summary_line

    kwargs = {**{k: v for k, v in sampling.items() if v is not None}, **params}  # validated where they are used
    if family.takes_prompts:
        kwargs["prompts"] = list(prompts)
    else:
        kwargs["class_ids"] = list(class_ids or (0,))
    result = pipe.generate(method=method, seed=seed, decode=not tokens_only, **kwargs)
    paths = [] if tokens_only else save_images(result.images, out, len(result.tokens))
    if tokens_only or tokens_path:
        paths.append(save_tokens(result.tokens, tokens_path or out.with_suffix(".npy")))
    summary = {"method": method, **family.summary(result)}
    if stats_path:
        stats_path.write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(summary_line(paths, method, summary, getattr(result, "sampling", None) or {},
                            None if tokens_only else result.images))
