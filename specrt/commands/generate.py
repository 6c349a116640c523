"""`specrt generate`: one image per class id (c2i) or prompt (t2i) with a decoding method, saved as PNG.

A thin layer over the Python API: choose_route picks what runs from the flags (a BUNDLE of any
model family, LlamaGen checkpoint files, a Hugging Face checkpoint directory of the unified family,
or an embedded demo), every flag is checked against that route and its family before a model
loads (check_flags), and build_pipeline makes one Python call per route:
runtime.families.open_bundle (the manifest read once, handed down), Pipeline.from_torch over
specrt.export.sources.checkpoint_models (which reads checkpoints exactly as `specrt export` does),
UnifiedPipeline.from_torch, or the demo's torch_pipeline hook. One Pipeline.generate call follows
for every route, and OutputFlags.report writes its files.

Method parameters go through --param key=value (e.g. --param relaxation_budget=2 --param
draft_len=4). --threads is the intra-op thread count on whichever library runs
(specrt.runtime.threads); --loop sets the pipeline's `loop` (runtime.rounds.LOOPS: the device
round or the host loop); --tokens-only maps onto generate(decode=False), --save-tokens writes
result.tokens as .npy. Text-to-image models take --prompt (through the bundle's text encoder, or
--text-encoder DIR with checkpoints) or --captions FILE (precomputed embeddings,
runtime.text.load_caption_file).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import click

from specrt import validation
from specrt.commands import _family
from specrt.commands._auto import AutoRequest, choose as choose_auto, closing_note, model_identity
from specrt.commands._checkpoint_flags import (CHECKPOINT_FLAG_NAMES, CheckpointFlags, checkpoint_flags,
                                               refuse_folder_without_config)
from specrt.commands._generate_flags import (Drawing, ModelFlags, RunFlags, SamplingFlags, drawing_flags, model_flags,
                                             refuse_torch_flags_on_a_bundle, repeated, run_flags, sampling_flags)
from specrt.commands._help import COMMON, sectioned
from specrt.commands._outputs import OutputFlags, output_flags
from specrt.errors import SpecrtError
from specrt.export.demo.registry import DEFAULT_DEMO, demo_names, help_text as demo_help
from specrt.runtime.family_registry import ManifestFile, family, family_for, open_bundle, read_manifest_file
from specrt.runtime.family import Family
from specrt.runtime.pipeline import SAMPLING_KEYS
from specrt.runtime.threads import resolve as resolve_threads

METHOD_NAMES = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac", "gsd")
DEMO_NAMES, DEMO_HELP = demo_names(), demo_help()

# what a generate call runs (Route.kind)
BUNDLE, CHECKPOINTS, HF_CHECKPOINTS, DEMO = "bundle", "checkpoints", "Hugging Face checkpoints", "demo"


def parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    """--param key=value pairs; values stay strings and the method converts them to its types."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SpecrtError(f"--param needs key=value, got {pair!r}")
        name = key.strip().replace("-", "_")
        if name in out:  # which one the user meant is theirs to say, not the last one's to win
            raise SpecrtError(f"--param {name} given twice ({name}={out[name]} and {name}={value.strip()}); give it once")
        out[name] = value.strip()
    return out


def check_before_loading(method: str, seed: int, max_window: int, image_size: Optional[int], threads: Optional[int],
                         sampling: dict[str, Any], method_params: dict[str, str]) -> None:
    """Every value that needs no model, checked (specrt.validation) before a model loads: a typo
    costs a second, not a model load. Pipeline.generate checks them again with the model's
    defaults, and the class ids against the model."""
    from specrt.runtime.methods import make_method
    from specrt.runtime.sampling import SamplingParams

    validation.seed(seed, "--seed")
    validation.count("--max-window", max_window)
    if threads is not None:
        validation.threads("--threads", threads)
    if image_size is not None:
        validation.count("--image-size", image_size)
    given_twice = sorted(set(sampling) & set(method_params))
    if given_twice:
        raise SpecrtError(f"{given_twice[0]} given both as --{given_twice[0].replace('_', '-')} and as --param")
    SamplingParams(**sampling, **{k: v for k, v in method_params.items() if k in SAMPLING_KEYS})
    make_method(method, **{k: v for k, v in method_params.items() if k not in SAMPLING_KEYS})


def _given(name: str) -> bool:
    """Whether the flag of parameter `name` was typed (not its default) on the running command."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def check_applicable(bundle: Optional[Path], demo: Optional[str], target: Optional[Path], draft: Optional[Path],
                     vq: Optional[Path], checkpoint: CheckpointFlags, device: Optional[str],
                     backend: Optional[str] = None, loop: str = "auto") -> None:
    """A flag that does not apply to what runs is refused in one line, never ignored; --device is
    checked against the installed torch (specrt.validation.torch_device) before a model loads."""
    if not (target or vq or draft):
        if bundle is not None:
            checkpoint.refuse("describes LlamaGen checkpoints (--target/--vq); a BUNDLE's architecture and image size "
                              "were fixed when it was exported")
        else:
            checkpoint.refuse(f"describes LlamaGen checkpoints (--target/--vq); the embedded demo "
                              f"({demo or DEFAULT_DEMO}) has a fixed architecture and image size")
    elif not draft:
        checkpoint.refuse("describes the --draft checkpoint, and no --draft is given",
                          "draft_arch", "draft_n_head", "draft_n_kv_head")
    if bundle is not None:
        refuse_torch_flags_on_a_bundle(device, backend, loop, _given)
    validation.torch_device(device)


@dataclass(frozen=True)
class Route:
    """What one generate call runs (choose_route): `kind` (BUNDLE, CHECKPOINTS, HF_CHECKPOINTS or
    DEMO), the family whose plug-in every later step asks, and a BUNDLE's manifest.json, read
    once here and handed down to open the bundle."""

    kind: str
    family: Family
    manifest: Optional[ManifestFile] = None


def choose_route(bundle: Optional[Path], models: ModelFlags) -> Route:
    """The route the flags ask for; a BUNDLE's damaged manifest is one line here, before any other
    check, and its family is the one its manifest names."""
    if models.target is not None and models.target.is_dir():  # a Hugging Face directory: unified, on PyTorch
        refuse_folder_without_config("--target", models.target)
        return Route(HF_CHECKPOINTS, family("unified"))
    if bundle is not None:
        manifest = read_manifest_file(bundle)
        return Route(BUNDLE, manifest.family, manifest)
    if models.checkpoints:
        return Route(CHECKPOINTS, family("llamagen"))
    return Route(DEMO, family_for(None, models.demo))


def check_flags(route: Route, bundle: Optional[Path], method: str, seed: int, params: dict[str, str], drawing: Drawing,
                models: ModelFlags, checkpoint: CheckpointFlags, sampling: SamplingFlags, run: RunFlags) -> None:
    """Every flag against the route and its family, before a model loads: a flag that does not
    apply is one line, never ignored."""
    if route.kind == HF_CHECKPOINTS:
        _family.check_hf_checkpoint(route.family, bundle, method, seed, drawing, models, checkpoint, run)
        return
    if route.family.name != "llamagen":  # another family: through its plug-in alone (commands/_family.py)
        _family.check_flags(route.family, bundle, method, seed, drawing, models, checkpoint, sampling, run, _given)
        return
    refused = [flag for flag, given in _family.refused_prompt_options(route.family, drawing).items() if given]
    if refused:  # a LlamaGen model's unconditional row is a learned embedding, not a prompt
        raise SpecrtError(f"{refused[0]} applies to Janus / Emu3 / Lumina-mGPT prompts; a {route.family.description} "
                          "model's unconditional (CFG) row is a learned embedding, not a prompt")
    check_before_loading(method, seed, run.max_window, checkpoint.image_size, run.threads, sampling.given(), params)
    check_applicable(bundle, models.demo, models.target, models.draft, models.vq, checkpoint, run.device, run.backend,
                     run.loop)
    if route.kind == CHECKPOINTS:
        from specrt.export.checkpoints import refuse_non_checkpoint

        for flag, path in (("--target", models.target), ("--draft", models.draft), ("--vq", models.vq)):
            if path is not None:
                refuse_non_checkpoint(flag, path)  # a PNG named as a PNG, not met later as a missing image size


def build_pipeline(bundle: Any, models: ModelFlags, checkpoint: CheckpointFlags = CheckpointFlags(),
                   run: RunFlags = RunFlags()) -> Any:
    """The pipeline the flags describe, one Python call per route: a BUNDLE (its folder, or its
    manifest read before: runtime.families.open_bundle) of any family on `run.backend`; LlamaGen
    checkpoints or a Hugging Face checkpoint directory on PyTorch; else the embedded demo.
    `run.threads`: intra-op threads on whichever library runs it (None: specrt.runtime.threads'
    default, one per CPU, on onnxruntime and for checkpoints; a model on the torch backend keeps
    its own default: 1 for the embedded demos and continuous bundles, whose graphs are too small to
    share). `run.compile_step`: the torch backend's step compiled (None: on CUDA only)."""
    target, vq, backend, threads = models.target, models.vq, run.backend, run.threads
    if models.demo is not None and (bundle is not None or models.checkpoints):
        raise SpecrtError("--demo picks an embedded demo; drop it to run a BUNDLE or checkpoints")
    if models.text_encoder and not (target or vq):
        raise SpecrtError("--text-encoder goes with t2i checkpoints (--target/--vq); a bundle carries its own")
    if bundle is not None:
        if models.checkpoints:
            raise SpecrtError("give either a BUNDLE or --target/--vq checkpoints, not both")
        return open_bundle(bundle, backend or "ort", threads if backend == "torch" else resolve_threads(threads))
    if backend not in (None, "torch"):
        raise SpecrtError(f"--backend {backend} needs a BUNDLE directory (export one with `specrt export`)")
    if target is not None and target.is_dir():
        return _hf_checkpoint_pipeline(models, run)
    if models.checkpoints:
        if not (target and vq):
            raise SpecrtError("checkpoints need both --target and --vq (--draft only for sd, cool-sd and lantern)")
        return _checkpoint_pipeline(models, checkpoint, run)
    from specrt.export.demo.registry import get_demo

    # the demos are tiny: intra-op threads only add synchronisation, and on a busy machine
    # spinning OpenMP threads make them 100x slower
    return get_demo(models.demo).hook("torch_pipeline")(None, max_window=run.max_window, device=run.device,
                                                        threads=1 if threads is None else threads,
                                                        compile=run.compile_step)


def _checkpoint_pipeline(models: ModelFlags, checkpoint: CheckpointFlags, run: RunFlags) -> Any:
    """Pipeline.from_torch over LlamaGen checkpoints, read by the loader `specrt export` uses: same
    models, same grid, same sampling defaults as the bundle exported from them."""
    from specrt.export.sources import checkpoint_models
    from specrt.runtime.pipeline import Pipeline

    target_choice, draft_choice = checkpoint.choices()
    loaded = checkpoint_models(models.target, models.draft, models.vq, target_choice, draft_choice, checkpoint.vq_arch,
                               checkpoint.image_size, where="specrt generate")
    encoder = None
    if models.text_encoder:
        from specrt.runtime.text import T5TextEncoder

        encoder = T5TextEncoder(models.text_encoder, max_length=loaded.target.config.cond_len, device=run.device)
    return Pipeline.from_torch(loaded.target, loaded.draft, loaded.vq, max_window=run.max_window, device=run.device,
                               sampling_defaults=loaded.sampling_defaults, threads=resolve_threads(run.threads),
                               text_encoder=encoder, compile=run.compile_step)


def _hf_checkpoint_pipeline(models: ModelFlags, run: RunFlags) -> Any:
    """UnifiedPipeline.from_torch over a Hugging Face checkpoint directory: its models, decoder and
    recipe (export.unified.sources, what `specrt export` would write) on PyTorch."""
    from specrt.export.unified.sources import unified_models
    from specrt.export.unified.tokenizer import read_tokenizer
    from specrt.runtime.families.unified.pipeline import UnifiedPipeline
    from specrt.runtime.families.unified.prompts import PromptEncoder
    from specrt.runtime.threads import set_torch_threads

    set_torch_threads(None if run.threads is None else validation.threads("--threads", run.threads))
    loaded = unified_models(models.target, models.draft, models.vq, progress=click.echo)
    tokenizer, _ = read_tokenizer(models.target)
    return UnifiedPipeline.from_torch(loaded.target, loaded.draft, loaded.vq,
                                      prompts=PromptEncoder(loaded.prompt, loaded.target.config.cond_len, tokenizer),
                                      max_window=run.max_window, device=run.device,
                                      sampling_defaults=loaded.sampling_defaults, compile=run.compile_step)


def condition_args(conditions: str, drawing: Drawing) -> dict[str, Any]:
    """Pipeline.generate's condition keyword from the flags, for a model conditioned on
    `conditions` (Family.conditions: "class ids" or "prompts"), each class, prompt or caption row
    `drawing.num_images` times in a row (--num-images); class ids default to class 0."""
    class_ids, prompts, captions_path, num_images = (drawing.class_ids, drawing.prompts, drawing.captions_path,
                                                      drawing.num_images)
    if conditions == "class ids":
        if prompts or captions_path:
            raise SpecrtError("this model is class-conditional: give --class, not --prompt or --captions")
        return {"class_ids": repeated(list(class_ids or (0,)), num_images, "class")}
    if class_ids:
        raise SpecrtError("this model is text-to-image: give --prompt or --captions, not --class")
    if bool(prompts) == bool(captions_path):
        raise SpecrtError("this model is text-to-image: give --prompt \"...\" (repeatable) or --captions FILE, one of them")
    if prompts:
        return {"prompts": repeated(list(prompts), num_images, "prompt")}
    import numpy as np

    from specrt.runtime.text import load_caption_file

    embeddings, mask = load_caption_file(captions_path)
    rows = repeated(list(range(len(embeddings))), num_images, "caption")
    return {"captions": (np.asarray(embeddings)[rows], None if mask is None else np.asarray(mask)[rows])}


def sampling_epilog() -> str:
    """Which sampling defaults apply on which route (the --help epilog)."""
    from specrt.runtime.defaults import describe, families_help

    from specrt.export.demo.registry import DEMOS

    demos = []
    for entry in DEMOS.values():
        try:
            demos.append(f"  --demo {entry.name}: {describe(entry.hook('packaged_sampling_defaults')())}")
        except (OSError, KeyError, ValueError, ImportError, SpecrtError):  # a broken install still shows its help
            demos.append(f"  --demo {entry.name}: its weights' JSON")
    lines = ["Sampling defaults (a --cfg-scale, --temperature, --top-k or --top-p given overrides that key,",
             "the same way on every route):",
             "  BUNDLE: the manifest's (`specrt inspect BUNDLE` shows them)",
             *(f"  --target {line}" for line in families_help()),
             *demos]
    return "\b\n" + "\n".join(lines)


@sectioned("generate", epilog=sampling_epilog(), sections=[
    (COMMON, ["method", "class_ids", "prompts", "demo", "num_images", "seed", "out", "help"]),
    ("Model and checkpoints", ["target", "draft", "vq", "text_encoder", "captions_path", *CHECKPOINT_FLAG_NAMES]),
    ("Sampling", ["cfg_scale", "temperature", "top_k", "top_p"]),
    ("Prompts of Janus, Emu3, Lumina-mGPT", ["negative_prompt", "no_prompt_suffix"]),
    ("Method parameters", ["params", "relaxed", "remeasure"]),
    ("Output", ["sheet", "stats_path", "tokens_path", "tokens_only"]),
    ("Performance", ["backend", "device", "threads", "loop", "compile_step", "max_window"]),
])
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--method", "-m", type=click.Choice(METHOD_NAMES + ("cspd", "auto")), default="ar", show_default=True,
              help="Decoding method (cspd: continuous models only; there ar and cspd). auto: the fastest lossless "
                   "setting measured on this device, backend and batch (--relaxed admits relaxed methods), "
                   "measured on the first call and cached.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed: same seed, same image. The images of a call are decoded together; image i uses seed + i, so "
                   "it is the image that class (or prompt) alone gives with seed + i.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Method parameter, repeatable, e.g. --param draft_len=4 --param relaxation_budget=2 (each method's "
                   "parameters: docs/concepts/methods.md).")
@click.option("--relaxed", is_flag=True,
              help="--method auto: relaxed methods (cool-sd, lantern, ...) may be chosen too; they do not sample the "
                   "target's exact distribution.")
@click.option("--remeasure", is_flag=True,
              help="--method auto: measure again instead of reading the cached choice (and replace it).")
@drawing_flags
@model_flags
@sampling_flags
@output_flags
@run_flags
@checkpoint_flags
def command(bundle: Optional[Path], method: str, seed: int, params: tuple[str, ...], drawing: Drawing,
            models: ModelFlags, sampling: SamplingFlags, outputs: OutputFlags, run: RunFlags,
            checkpoint: CheckpointFlags, relaxed: bool = False, remeasure: bool = False) -> None:
    """Generate images for class ids or prompts with a decoding method (the embedded demo models
    by default; --demo t2i takes prompts, e.g. --demo t2i --prompt "a thick slanted seven").
    """
    method_params = parse_params(params)
    outputs = outputs.checked()
    drawing.check()
    route = choose_route(bundle, models)
    auto = AutoRequest.checked(method, relaxed, remeasure, method_params, route.family.sampling_keys)
    check_flags(route, bundle, "ar" if auto else method, seed, method_params, drawing, models, checkpoint, sampling,
                run)
    pipe = build_pipeline(route.manifest or bundle, models, checkpoint, run)
    if route.manifest is not None:  # a quantized bundle on a backend its graphs were not made for: one line
        from specrt.commands._backend_advice import warn_backend

        warn_backend(route.manifest.raw, route.manifest.root, run.backend or "ort")
    if run.loop != "auto":  # a method with no round under --loop round: Pipeline.generate's one-line error
        pipe.loop = run.loop
    if route.kind == HF_CHECKPOINTS and pipe.vq is None and not outputs.tokens_only:
        raise SpecrtError("this checkpoint has no image decoder here: add --tokens-only, or --vq DIR with vqgan.ckpt "
                          "and vqgan.yaml")
    conditions, note = condition_args(route.family.conditions(pipe), drawing), None
    if auto:  # measured on the first call, read from the cache on later ones (specrt/commands/_auto.py)
        choice = choose_auto(auto, pipe, model_identity(route.kind, route.manifest, models.demo,
                                                        (models.target, models.draft, models.vq)),
                             run, bundle, conditions, {**sampling.given(), **method_params},
                             route.family.conditions(pipe) != "class ids", lambda line: click.echo(line, err=True))
        method, method_params, note = choice.method, {**choice.params, **method_params}, closing_note(choice)
    result = pipe.generate(**conditions, method=method, seed=seed, decode=not outputs.tokens_only, **sampling.given(),
                           **method_params, **drawing.prompt_options())
    click.echo(outputs.report(route.family, result, f"auto:{note['chose']}" if note else method, drawing.num_images,
                              auto=note))
