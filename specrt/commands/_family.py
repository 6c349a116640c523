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


MAX_IMAGES_PER_CALL = 1024  # images one generate call makes: --num-images times the classes or prompts


def repeated(values: list[Any], times: int, what: str) -> list[Any]:
    """Each of `values` (classes, prompts, caption rows) `times` times in a row, for --num-images.

    Why a ceiling: one call decodes every image before it writes any (in passes of the bundle's
    max_images), so a typo like --num-images 100000 would run for hours and then fill a folder;
    more than MAX_IMAGES_PER_CALL is one line, and a larger set is several calls with --seed."""
    from specrt import validation

    times = validation.count("--num-images", times, high=MAX_IMAGES_PER_CALL)
    total = len(values) * times
    if total > MAX_IMAGES_PER_CALL:
        raise SpecrtError(f"--num-images {times} of {len(values)} {what}{'es' if what == 'class' else 's'} is "
                          f"{total} images; one call makes at most {MAX_IMAGES_PER_CALL} (split it over calls with "
                          "--seed)")
    return [value for value in values for _ in range(times)]


def open_pipeline(family: Family, bundle: Optional[Path], demo: Optional[str], backend: Optional[str],
                  threads: Optional[int] = None) -> Any:
    """The family's pipeline over BUNDLE on `backend`, else its embedded demo `demo`."""
    if bundle is not None:
        from specrt.runtime.families import open_bundle

        return open_bundle(bundle, backend or "ort", threads)
    if backend not in (None, "torch"):
        raise SpecrtError(f"--backend {backend} needs a BUNDLE: export the demo with `specrt export --demo {demo} "
                          "--out DIR`")
    from specrt.export.demo.registry import get_demo

    return get_demo(demo).hook("torch_pipeline")(None, threads=1 if threads is None else threads)


def prompt_options_of(negative_prompt: Optional[str], no_prompt_suffix: bool) -> dict[str, Any]:
    """The pipeline keywords of --negative-prompt / --no-prompt-suffix, only those given, so a
    call without them runs exactly as before (the recipe's own unconditional row and suffix)."""
    options: dict[str, Any] = {}
    if negative_prompt is not None:
        options["negative_prompt"] = negative_prompt
    if no_prompt_suffix:
        options["prompt_suffix"] = False
    return options


def refused_prompt_options(family: Family, negative_prompt: Optional[str], no_prompt_suffix: bool) -> dict[str, bool]:
    """The refused-flag entries of --negative-prompt / --no-prompt-suffix for `family` (refuse's
    {flag: given?}): they shape a CFG row that is a prompt, which only some families have."""
    applies = family.negative_prompts
    return {"--negative-prompt": negative_prompt is not None and not applies,
            "--no-prompt-suffix": no_prompt_suffix and not applies}


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
             tokens_only: bool, tokens_path: Optional[Path], num_images: int = 1, sheet: Optional[Path] = None,
             prompt_options: Optional[dict[str, Any]] = None) -> None:
    """Generate with the family's pipeline and write images / tokens / stats / the contact sheet as
    `specrt generate` does; `num_images` images of each class or prompt (image i: seed + i).
    `prompt_options`: prompt_options_of's keywords (--negative-prompt, --no-prompt-suffix), given
    only to a family that takes them (refused before this for the others)."""
    from specrt.commands._outputs import summary_line, write_results

    kwargs = {**{k: v for k, v in sampling.items() if v is not None}, **params}  # validated where they are used
    kwargs.update(prompt_options or {})
    if family.takes_prompts:
        kwargs["prompts"] = repeated(list(prompts), num_images, "prompt")
    else:
        kwargs["class_ids"] = repeated(list(class_ids or (0,)), num_images, "class")
    result = pipe.generate(method=method, seed=seed, decode=not tokens_only, **kwargs)
    images = None if tokens_only else result.images
    paths, others = write_results(images, result.tokens, out, tokens_only, tokens_path, sheet, num_images)
    summary = {"method": method, **family.summary(result)}
    if stats_path:
        stats_path.write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(summary_line(paths, method, summary, getattr(result, "sampling", None) or {}, images, others))
