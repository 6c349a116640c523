"""`specrt generate`'s flags in the groups its code reads them by: what to draw, which model runs,
how it samples and where it runs (the outputs' group is specrt.commands._outputs.OutputFlags, the
checkpoint layout's specrt.commands._checkpoint_flags.CheckpointFlags).

Each group is a dataclass with one field per flag and a decorator (specrt.commands._flag_groups)
that adds its options to the command; the checks that need nothing but the group's own values
live on it, so they run before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import click

from specrt.commands._flag_groups import flag_group
from specrt.commands._help import DEMO_SHORT_HELP
from specrt.errors import SpecrtError
from specrt.export.demo.registry import demo_names
from specrt.runtime.backends.bundle_backends import BUNDLE_BACKENDS
from specrt.runtime.methods import DEFAULT_MAX_WINDOW
from specrt.runtime.rounds import LOOPS
from specrt.runtime.threads import HELP as THREADS_HELP, checked as checked_threads
from specrt.validation import count

MAX_IMAGES_PER_CALL = 1024  # images one generate call makes: --num-images times the classes or prompts


def repeated(values: list[Any], times: int, what: str) -> list[Any]:
    """Each of `values` (classes, prompts, caption rows) `times` times in a row, for --num-images.

    Why a ceiling: one call decodes every image before it writes any (in passes of the bundle's
    max_images), so a typo like --num-images 100000 would run for hours and then fill a folder;
    more than MAX_IMAGES_PER_CALL is one line, and a larger set is several calls with --seed."""
    times = count("--num-images", times, high=MAX_IMAGES_PER_CALL)
    total = len(values) * times
    if total > MAX_IMAGES_PER_CALL:
        raise SpecrtError(f"--num-images {times} of {len(values)} {what}{'es' if what == 'class' else 's'} is "
                          f"{total} images; one call makes at most {MAX_IMAGES_PER_CALL} (split it over calls with "
                          "--seed)")
    return [value for value in values for _ in range(times)]


@dataclass(frozen=True)
class Drawing:
    """What to draw: the condition of each image (--class, --prompt or --captions), how many of
    each, and the prompt options of models whose unconditional row is a prompt."""

    class_ids: tuple[int, ...] = ()
    prompts: tuple[str, ...] = ()
    captions_path: Optional[Path] = None
    num_images: int = 1
    negative_prompt: Optional[str] = None
    no_prompt_suffix: bool = False

    def check(self) -> None:
        """An empty --prompt (a caption of padding only, not an unconditional image) and a call of
        more images than one call makes are refused in one line."""
        for i, prompt in enumerate(self.prompts):
            if not prompt.strip():
                which = "" if len(self.prompts) == 1 else f" (the {_ordinal(i + 1)})"
                raise SpecrtError(f"--prompt{which} is empty; give the text to draw, e.g. --prompt \"a thick slanted "
                                  "seven\"")
        repeated(list(self.prompts or self.class_ids or (0,)), self.num_images, "prompt" if self.prompts else "class")

    def prompt_options(self) -> dict[str, Any]:
        """generate's keywords of --negative-prompt / --no-prompt-suffix, only those given, so a
        call without them runs exactly as before (the recipe's own unconditional row and suffix)."""
        options: dict[str, Any] = {}
        if self.negative_prompt is not None:
            options["negative_prompt"] = self.negative_prompt
        if self.no_prompt_suffix:
            options["prompt_suffix"] = False
        return options


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@dataclass(frozen=True)
class ModelFlags:
    """Which model runs besides a BUNDLE: an embedded demo, or checkpoints (LlamaGen files, or
    Hugging Face directories of the unified family) with a t2i model's text encoder."""

    demo: Optional[str] = None
    target: Optional[Path] = None
    draft: Optional[Path] = None
    vq: Optional[Path] = None
    text_encoder: Optional[Path] = None

    @property
    def checkpoints(self) -> bool:
        return bool(self.target or self.draft or self.vq)


@dataclass(frozen=True)
class SamplingFlags:
    """--cfg-scale, --temperature, --top-k, --top-p; None: the model's default."""

    cfg_scale: Optional[float] = None
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None

    def given(self) -> dict[str, Any]:
        """The keys given, as generate's keywords: each overrides the model's default for that key."""
        return {key: value for key, value in vars(self).items() if value is not None}


@dataclass(frozen=True)
class RunFlags:
    """Where and how the model runs: backend, torch device, CPU threads, decoding loop, compiled
    step and the torch backend's largest window."""

    backend: Optional[str] = None
    device: Optional[str] = None
    threads: Optional[int] = None
    loop: str = "auto"
    compile_step: Optional[bool] = None
    max_window: int = DEFAULT_MAX_WINDOW


def refuse_torch_flags_on_a_bundle(device: Optional[str], backend: Optional[str], loop: str,
                                   given: Callable[[str], bool]) -> None:
    """A BUNDLE runs its exported graphs where --backend says: the torch backend's flags (--device but
    cpu on onnxruntime, --max-window, --compile/--no-compile, --loop round) are one line, whatever its
    family. `given(name)`: whether the flag of parameter `name` was typed."""
    if device is not None and not (device.strip().lower() == "cpu" and backend in (None, "ort", "ort-cpu")):
        raise SpecrtError("--device picks the torch device of checkpoints or the demo; a BUNDLE runs where "
                          "--backend says (ort, ort-cuda, ort-trt, trt)")
    if given("max_window"):
        raise SpecrtError("--max-window sizes the torch backend's windows; a BUNDLE's largest window was fixed "
                          "at export (specrt export --max-window)")
    if given("compile_step"):
        raise SpecrtError("--compile/--no-compile choose how the torch backend runs its step; a BUNDLE runs its "
                          "exported graphs")
    if loop == "round":
        raise SpecrtError("--loop round runs the device round on the torch backend (checkpoints or the demo); "
                          "a BUNDLE decodes with the host loop")


drawing_flags = flag_group("drawing", Drawing, [
    click.option("--class", "class_ids", type=int, multiple=True,
                 help="Class id of a c2i model (repeat for several images; default 0)."),
    click.option("--prompt", "prompts", multiple=True, help="Prompt for a t2i model (repeat for several images)."),
    click.option("--captions", "captions_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="t2i: precomputed caption embeddings, one image each (.npy [N,L,D]; .npz/.safetensors with "
                      "'embeddings' and optional 'mask')."),
    click.option("--num-images", "-n", type=int, default=1, show_default=True,
                 help=f"Images of each --class / --prompt (image i of the call: seed + i); at most "
                      f"{MAX_IMAGES_PER_CALL} in all."),
    click.option("--negative-prompt", default=None, metavar="TEXT",
                 help="The unconditional (CFG) row as this text instead of the model's own (Emu3: its negative "
                      "prompt; Janus: the padded prompt; Lumina-mGPT: no text), so guidance steers away from it; \"\" "
                      "is the row without words. Hugging Face checkpoints, their bundles and --demo chameleon."),
    click.option("--no-prompt-suffix", is_flag=True,
                 help="Drop the fixed words the model's recipe appends to every prompt (Emu3: \" masterpiece, film "
                      "grained, best quality.\"); refused for a model without them."),
])

model_flags = flag_group("models", ModelFlags, [
    click.option("--demo", type=click.Choice(demo_names()), default=None, help=DEMO_SHORT_HELP),
    click.option("--target", type=click.Path(exists=True, path_type=Path),
                 help="LlamaGen GPT checkpoint (target), or a Hugging Face directory of Janus / Emu3 / Lumina-mGPT "
                      "(runs on PyTorch, as `specrt export --target DIR` would export it)."),
    click.option("--draft", type=click.Path(exists=True, path_type=Path),
                 help="LlamaGen GPT checkpoint (draft), or a Hugging Face directory of the target's vocabulary."),
    click.option("--vq", type=click.Path(exists=True, path_type=Path),
                 help="LlamaGen VQ checkpoint; for Lumina-mGPT directories, the folder with vqgan.ckpt + vqgan.yaml."),
    click.option("--text-encoder", type=click.Path(exists=True, file_okay=False, path_type=Path),
                 help="t2i checkpoints: a local T5 encoder directory for --prompt (a bundle carries its own)."),
])

sampling_flags = flag_group("sampling", SamplingFlags, [
    click.option("--cfg-scale", type=float, help="Classifier-free guidance scale (1 = none). Default: below."),
    click.option("--temperature", type=float, help="Sampling temperature (0 = greedy). Default: below."),
    click.option("--top-k", type=int, help="Top-k filter (0 disables). Default: below."),
    click.option("--top-p", type=float, help="Top-p filter (1 disables). Default: below."),
])

run_flags = flag_group("run", RunFlags, [
    click.option("--backend", type=click.Choice(["torch", *BUNDLE_BACKENDS]),
                 help="Default: ort for a BUNDLE, torch for checkpoints/demo. A BUNDLE also runs on ort-cuda / ort-trt "
                      "(onnxruntime's CUDA / TensorRT providers) and trt (engines from `specrt build`)."),
    click.option("--device", help="torch device (cpu, cuda); default: where the weights are."),
    click.option("--threads", type=int, callback=checked_threads,
                 help=f"{THREADS_HELP}; the embedded demo: 1 (its graphs are too small to share)."),
    click.option("--loop", type=click.Choice(LOOPS), default="auto", show_default=True,
                 help="torch backend: round = the device round (each round one function of device tensors, the host "
                      "reading once a round; ar, sd, cool-sd, lantern chains, sjd, sjd-pac without "
                      "proactive_drafting; the continuous demo's ar and cspd), host = the host loop, auto = the round "
                      "on a GPU where the method has one. A seed gives the same tokens in both."),
    click.option("--compile/--no-compile", "compile_step", default=None,
                 help="torch backend: run the step compiled by torch.compile (default: on CUDA only; the first steps "
                      "compile, cached on disk for the next run)."),
    click.option("--max-window", type=int, default=DEFAULT_MAX_WINDOW, show_default=True,
                 help="torch backend: largest step window (tokens per target step; sjd-pac at L = 64 feeds 65)."),
])
