"""`specrt generate`: one image per class id (c2i) or prompt (t2i) with a decoding method, saved as PNG.

Flags map onto specrt.runtime.Pipeline: a BUNDLE runs on onnxruntime (from_bundle); --target
and --vq checkpoints run on PyTorch (from_torch over specrt.export.sources.checkpoint_models,
which reads them exactly as `specrt export` does); with
no model arguments the embedded demo models run on PyTorch. Method parameters go through
--param key=value (e.g. --param relaxation_budget=2 --param draft_len=4). --threads is the
intra-op thread count on whichever library runs (specrt.runtime.threads); --loop sets the
pipeline's `loop` (runtime.rounds.LOOPS: the device round or the host loop); --tokens-only maps
onto generate(decode=False), --save-tokens writes result.tokens as .npy.
Text-to-image models take --prompt (through the bundle's text encoder, or --text-encoder DIR
with checkpoints) or --captions FILE (precomputed embeddings, runtime.text.load_caption_file).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click

from specrt import validation
from specrt.commands._checkpoint_flags import CHECKPOINT_FLAG_NAMES, CheckpointFlags, checkpoint_flags
from specrt.commands._help import COMMON, DEMO_SHORT_HELP, sectioned
from specrt.commands import _family
from specrt.commands._outputs import check_sheet, image_output, summary_line, write_results
from specrt.errors import SpecrtError
from specrt.export.demo.registry import DEFAULT_DEMO, demo_names, help_text as demo_help
from specrt.runtime.methods import DEFAULT_MAX_WINDOW
from specrt.runtime.threads import HELP as THREADS_HELP, checked as checked_threads, resolve as resolve_threads
from specrt.runtime.backends.bundle_backends import BUNDLE_BACKENDS
from specrt.runtime.pipeline import SAMPLING_KEYS
from specrt.runtime.rounds import LOOPS

METHOD_NAMES = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac")
DEMO_NAMES, DEMO_HELP = demo_names(), demo_help()


def parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    """--param key=value pairs; values stay strings and the method converts them to its types."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecrtError(f"--param needs key=value, got {pair!r}")
        out[key.strip().replace("-", "_")] = value.strip()
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


def check_outputs(out: Path, stats_path: Optional[Path], tokens_path: Optional[Path], tokens_only: bool) -> None:
    """Every file generate will write, checked before a model loads (specrt.paths): its folder
    exists and takes new files; no folder is created."""
    from specrt.paths import output_file

    if not tokens_only:
        output_file("--out", out)
    elif tokens_path is None:
        output_file("--out", out.with_suffix(".npy"))
    output_file("--stats", stats_path)
    output_file("--save-tokens", tokens_path)


def check_prompts(prompts: tuple[str, ...]) -> None:
    """An empty --prompt is a mistake (a caption of padding only), not an unconditional image."""
    for i, prompt in enumerate(prompts):
        if not prompt.strip():
            which = "" if len(prompts) == 1 else f" (the {_ordinal(i + 1)})"
            raise SpecrtError(f"--prompt{which} is empty; give the text to draw, e.g. --prompt \"a thick slanted seven\"")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


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
        if device is not None and not (device.strip().lower() == "cpu" and backend in (None, "ort", "ort-cpu")):
            raise SpecrtError("--device picks the torch device of checkpoints or the demo; a BUNDLE runs where "
                              "--backend says (ort, ort-cuda, ort-trt, trt)")
        if _given("max_window"):
            raise SpecrtError("--max-window sizes the torch backend's windows; a BUNDLE's largest window was fixed "
                              "at export (specrt export --max-window)")
        if _given("compile_step"):
            raise SpecrtError("--compile/--no-compile choose how the torch backend runs its step; a BUNDLE runs its "
                              "exported graphs")
        if loop == "round":
            raise SpecrtError("--loop round runs the device round on the torch backend (checkpoints or the demo); "
                              "a BUNDLE decodes with the host loop")
    validation.torch_device(device)


def build_pipeline(bundle: Optional[Path], backend: Optional[str], target: Optional[Path], draft: Optional[Path],
                   vq: Optional[Path], checkpoint: CheckpointFlags, max_window: int, device: Optional[str],
                   threads: Optional[int] = None, text_encoder: Optional[Path] = None,
                   demo: Optional[str] = None, compile_step: Optional[bool] = None) -> Any:
    """The Pipeline the flags describe (bundle on ort, checkpoints or the demo `demo` on torch),
    with `threads` intra-op threads on whichever library runs it (None: specrt.runtime.threads'
    default, one per CPU; 1 for the embedded demo, whose graphs are too small to share).
    `compile_step`: the torch backend's step compiled (None: on CUDA only; Pipeline.from_torch)."""
    from specrt.export.demo.registry import get_demo
    from specrt.runtime.pipeline import Pipeline

    if demo is not None and (bundle is not None or target or draft or vq):
        raise SpecrtError("--demo picks an embedded demo; drop it to run a BUNDLE or checkpoints")

    if text_encoder and not (target or vq):
        raise SpecrtError("--text-encoder goes with t2i checkpoints (--target/--vq); a bundle carries its own")
    if bundle is not None:
        if target or draft or vq:
            raise SpecrtError("give either a BUNDLE or --target/--vq checkpoints, not both")
        if backend == "torch":
            raise SpecrtError("a BUNDLE runs on ort, ort-cpu, ort-cuda, ort-trt or trt; torch runs checkpoints or the demo")
        return Pipeline.from_bundle(bundle, backend=backend or "ort", threads=resolve_threads(threads))
    if backend not in (None, "torch"):
        raise SpecrtError(f"--backend {backend} needs a BUNDLE directory (export one with `specrt export`)")
    if target or vq or draft:
        if not (target and vq):
            raise SpecrtError("checkpoints need both --target and --vq (--draft only for sd, cool-sd and lantern)")
        from specrt.export.sources import checkpoint_models

        target_choice, draft_choice = checkpoint.choices()
        models = checkpoint_models(target, draft, vq, target_choice, draft_choice, checkpoint.vq_arch,
                                   checkpoint.image_size, where="specrt generate")
        encoder = None
        if text_encoder:
            from specrt.runtime.text import T5TextEncoder

            encoder = T5TextEncoder(text_encoder, max_length=models.target.config.cond_len, device=device)
        # the loader `specrt export` uses: same models, same grid, same sampling defaults as the bundle
        return Pipeline.from_torch(models.target, models.draft, models.vq, max_window=max_window, device=device,
                                   sampling_defaults=models.sampling_defaults, threads=resolve_threads(threads),
                                   text_encoder=encoder, compile=compile_step)
    # ---- embedded demo (export.demo.registry): its torch_pipeline hook ----
    # the demo is tiny: intra-op threads only add synchronisation, and on a busy machine
    # spinning OpenMP threads make it 100x slower
    return get_demo(demo).hook("torch_pipeline")(None, max_window=max_window, device=device,
                                                 threads=1 if threads is None else threads, compile=compile_step)


def condition_args(model_type: str, class_ids: tuple[int, ...], prompts: tuple[str, ...],
                   captions_path: Optional[Path], num_images: int = 1) -> dict[str, Any]:
    """Pipeline.generate's condition keyword from the flags, each class, prompt or caption row
    `num_images` times in a row (--num-images); a c2i model defaults to class 0."""
    if model_type == "c2i":
        if prompts or captions_path:
            raise SpecrtError("this model is class-conditional: give --class, not --prompt or --captions")
        return {"class_ids": _family.repeated(list(class_ids or (0,)), num_images, "class")}
    if class_ids:
        raise SpecrtError("this model is text-to-image: give --prompt or --captions, not --class")
    if bool(prompts) == bool(captions_path):
        raise SpecrtError("this model is text-to-image: give --prompt \"...\" (repeatable) or --captions FILE, one of them")
    if prompts:
        return {"prompts": _family.repeated(list(prompts), num_images, "prompt")}
    import numpy as np

    from specrt.runtime.text import load_caption_file

    embeddings, mask = load_caption_file(captions_path)
    rows = _family.repeated(list(range(len(embeddings))), num_images, "caption")
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
    ("Method parameters", ["params"]),
    ("Output", ["sheet", "stats_path", "tokens_path", "tokens_only"]),
    ("Performance", ["backend", "device", "threads", "loop", "compile_step", "max_window"]),
])
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--method", "-m", type=click.Choice(METHOD_NAMES + ("cspd",)), default="ar", show_default=True,
              help="Decoding method (cspd: continuous models only; there ar and cspd).")
@click.option("--class", "class_ids", type=int, multiple=True,
              help="Class id of a c2i model (repeat for several images; default 0).")
@click.option("--prompt", "prompts", multiple=True, help="Prompt for a t2i model (repeat for several images).")
@click.option("--captions", "captions_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="t2i: precomputed caption embeddings, one image each (.npy [N,L,D]; .npz/.safetensors with "
                   "'embeddings' and optional 'mask').")
@click.option("--text-encoder", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="t2i checkpoints: a local T5 encoder directory for --prompt (a bundle carries its own).")
@click.option("--demo", type=click.Choice(DEMO_NAMES), default=None, help=DEMO_SHORT_HELP)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed: same seed, same image. The images of a call are decoded together; image i uses "
                   "seed + i, so it is the image that class (or prompt) alone gives with seed + i.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("img.png"), show_default=True,
              help="Image to write, in the type its suffix names (.png, .jpg, .webp, ...; none: .png is added); "
                   "numbered when several images are asked for.")
@click.option("--num-images", "-n", type=int, default=1, show_default=True,
              help=f"Images of each --class / --prompt (image i of the call: seed + i); at most "
                   f"{_family.MAX_IMAGES_PER_CALL} in all.")
@click.option("--sheet", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write one contact sheet here: every image of the call on a grid (a row per class or "
                   "prompt with --num-images).")
@click.option("--backend", type=click.Choice(["torch", *BUNDLE_BACKENDS]),
              help="Default: ort for a BUNDLE, torch for checkpoints/demo. A BUNDLE also runs on ort-cuda / ort-trt "
                   "(onnxruntime's CUDA / TensorRT providers) and trt (engines from `specrt build`).")
@click.option("--target", type=click.Path(exists=True, path_type=Path),
              help="LlamaGen GPT checkpoint (target), or a Hugging Face directory of Janus / Emu3 / Lumina-mGPT "
                   "(runs on PyTorch, as `specrt export --target DIR` would export it).")
@click.option("--draft", type=click.Path(exists=True, path_type=Path),
              help="LlamaGen GPT checkpoint (draft), or a Hugging Face directory of the target's vocabulary.")
@click.option("--vq", type=click.Path(exists=True, path_type=Path),
              help="LlamaGen VQ checkpoint; for Lumina-mGPT directories, the folder with vqgan.ckpt + vqgan.yaml.")
@click.option("--device", help="torch device (cpu, cuda); default: where the weights are.")
@click.option("--max-window", type=int, default=DEFAULT_MAX_WINDOW, show_default=True,
              help="torch backend: largest step window (tokens per target step; sjd-pac at L = 64 feeds 65).")
@click.option("--loop", type=click.Choice(LOOPS), default="auto", show_default=True,
              help="torch backend: round = the device round (each round one function of device tensors, the host "
                   "reading once a round; ar, sd, cool-sd, lantern chains, sjd, sjd-pac without "
                   "proactive_drafting), host = the host loop, auto = the round on a GPU where the method has one. "
                   "A seed's tokens differ between the two.")
@click.option("--compile/--no-compile", "compile_step", default=None,
              help="torch backend: run the step compiled by torch.compile (default: on CUDA only; the first steps "
                   "compile, cached on disk for the next run).")
@click.option("--cfg-scale", type=float, help="Classifier-free guidance scale (1 = none). Default: below.")
@click.option("--temperature", type=float, help="Sampling temperature (0 = greedy). Default: below.")
@click.option("--top-k", type=int, help="Top-k filter (0 disables). Default: below.")
@click.option("--top-p", type=float, help="Top-p filter (1 disables). Default: below.")
@click.option("--negative-prompt", default=None, metavar="TEXT",
              help="The unconditional (CFG) row as this text instead of the model's own (Emu3: its negative prompt; "
                   "Janus: the padded prompt; Lumina-mGPT: no text), so guidance steers away from it; \"\" is the row "
                   "without words. Hugging Face checkpoints, their bundles and --demo chameleon.")
@click.option("--no-prompt-suffix", is_flag=True,
              help="Drop the fixed words the model's recipe appends to every prompt (Emu3: \" masterpiece, film "
                   "grained, best quality.\"); refused for a model without them.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Method parameter, repeatable, e.g. --param draft_len=4 --param relaxation_budget=2 "
                   "(each method's parameters: docs/concepts/methods.md).")
@click.option("--stats", "stats_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write the stats as JSON here.")
@click.option("--save-tokens", "tokens_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the image tokens here as .npy (int64 [N, grid, grid], N = number of --class).")
@click.option("--tokens-only", is_flag=True,
              help="Skip the VQ decode and the PNG: write only the tokens (to --save-tokens, default: --out as .npy).")
@click.option("--threads", type=int, callback=checked_threads, help=f"{THREADS_HELP}; the embedded demo: 1 (its graphs are too small to share).")
@checkpoint_flags
def command(bundle, method, class_ids, prompts, captions_path, text_encoder, demo, seed, out, num_images, sheet, backend,
            target, draft, vq, checkpoint, device, max_window, loop, compile_step, cfg_scale, temperature, top_k, top_p,
            negative_prompt, no_prompt_suffix, params, stats_path, tokens_path, tokens_only, threads) -> None:
    """Generate images for class ids or prompts with a decoding method (the embedded demo models
    by default; --demo t2i takes prompts, e.g. --demo t2i --prompt "a thick slanted seven").
    """
    method_params = parse_params(params)
    out = out if tokens_only else image_output(out)
    check_outputs(out, stats_path, tokens_path, tokens_only)
    sheet = check_sheet(sheet, out, tokens_only)
    check_prompts(prompts)
    _family.repeated(list(prompts or class_ids or (0,)), num_images, "prompt" if prompts else "class")  # the bound
    from specrt.runtime.families import family_for

    prompt_options = _family.prompt_options_of(negative_prompt, no_prompt_suffix)
    if target is not None and target.is_dir():  # a Hugging Face directory: the unified family on PyTorch
        _generate_unified_checkpoint(target, draft, vq, method, prompts, class_ids, seed, out, max_window, device,
                                     compile_step, threads, {"cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k,
                                               "top_p": top_p}, method_params, stats_path, tokens_only, tokens_path,
                                     bundle or demo or captions_path or text_encoder or checkpoint.given(),
                                     num_images, sheet, prompt_options, loop)
        return
    family = family_for(bundle, demo)  # a damaged manifest is one line here, before any other check
    if family.name != "llamagen":  # another family: through its plug-in alone (commands/_family.py)
        if demo is not None and (bundle or target or vq or draft):
            raise SpecrtError("--demo picks an embedded demo: give it without a BUNDLE or checkpoints")
        refused = {"--top-k": top_k is not None and "top_k" not in family.sampling_keys,
                   "--top-p": top_p is not None and "top_p" not in family.sampling_keys,
                   "--prompt": prompts and not family.takes_prompts, "--class": class_ids and family.takes_prompts,
                   "--captions": captions_path, "--text-encoder": text_encoder, "--target/--draft/--vq": target or vq or draft,
                   "--device": device is not None and device.strip().lower() != "cpu",  # it runs on the CPU
                   "--max-window": _given("max_window"), "--compile/--no-compile": _given("compile_step"),
                   "--loop": _given("loop"),
                   **_family.refused_prompt_options(family, negative_prompt, no_prompt_suffix),
                   **{name: True for name in checkpoint.given()}}
        validation.seed(seed, "--seed")
        _family.refuse(family, method, refused)  # before the model loads
        if family.takes_prompts and not prompts:
            raise SpecrtError(f"a {family.description} model draws what a prompt says: give --prompt \"...\" "
                              "(repeatable)")
        pipe = _family.open_pipeline(family, bundle, demo, backend, threads)
        _family.generate(family, pipe, method, class_ids, seed, out, prompts,
                         {"cfg_scale": cfg_scale, "temperature": temperature, "top_k": top_k, "top_p": top_p},
                         method_params, stats_path, tokens_only, tokens_path, num_images, sheet, prompt_options)
        return
    refused = [flag for flag, given in _family.refused_prompt_options(family, negative_prompt, no_prompt_suffix).items()
               if given]
    if refused:  # a LlamaGen model's unconditional row is a learned embedding, not a prompt
        raise SpecrtError(f"{refused[0]} applies to Janus / Emu3 / Lumina-mGPT prompts; a {family.description} "
                          "model's unconditional (CFG) row is a learned embedding, not a prompt")
    sampling = {k: v for k, v in (("cfg_scale", cfg_scale), ("temperature", temperature), ("top_k", top_k),
                                  ("top_p", top_p)) if v is not None}
    check_before_loading(method, seed, max_window, checkpoint.image_size, threads, sampling, method_params)
    check_applicable(bundle, demo, target, draft, vq, checkpoint, device, backend, loop)
    pipe = build_pipeline(bundle, backend, target, draft, vq, checkpoint, max_window, device, threads, text_encoder,
                          demo, compile_step)
    pipe.loop = loop  # a method with no round under --loop round: Pipeline.generate's one-line error
    conditions = condition_args(pipe.target.spec.model_type, class_ids, prompts, captions_path, num_images)
    result = pipe.generate(**conditions, method=method, seed=seed, decode=not tokens_only, **sampling,
                           **method_params)
    paths, others = write_results(result.images, result.tokens, out, tokens_only, tokens_path, sheet, num_images)
    summary = result.stats.summary()
    if stats_path:
        stats_path.write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(summary_line(paths, method, summary, result.sampling, result.images, others))


def _generate_unified_checkpoint(target: Path, draft: Optional[Path], vq: Optional[Path], method: str,
                                 prompts: tuple[str, ...], class_ids: tuple[int, ...], seed: int, out: Path,
                                 max_window: int, device: Optional[str], compile_step: Optional[bool],
                                 threads: Optional[int],
                                 sampling: dict[str, Any], method_params: dict[str, str], stats_path: Optional[Path],
                                 tokens_only: bool, tokens_path: Optional[Path], inapplicable: Any,
                                 num_images: int = 1, sheet: Optional[Path] = None,
                                 prompt_options: Optional[dict[str, Any]] = None, loop: str = "auto") -> None:
    """`specrt generate --target HF_DIR [--draft HF_DIR] --prompt ...`: the checkpoint's models, decoder and
    recipe (export.unified.sources, what `specrt export` would write) on PyTorch."""
    from specrt.export.unified.sources import unified_models
    from specrt.export.unified.tokenizer import read_tokenizer
    from specrt.runtime.families import family as plugin
    from specrt.runtime.families.unified.pipeline import UnifiedPipeline
    from specrt.runtime.families.unified.prompts import PromptEncoder

    unified = plugin("unified")
    if inapplicable:
        raise SpecrtError("a Hugging Face checkpoint directory runs alone: drop the BUNDLE, --demo, --captions, "
                          "--text-encoder and the LlamaGen size flags")
    if draft is not None and not draft.is_dir():
        raise SpecrtError(f"--draft {draft} must be a Hugging Face directory like --target")
    validation.seed(seed, "--seed")
    _family.refuse(unified, method, {"--class": class_ids})
    if loop == "round":  # before the model loads (Pipeline.generate would say so too, after)
        raise SpecrtError(f"--loop round: a {unified.description} model decodes under an image grammar, which has no "
                          "device round; use --loop host or auto")
    if not prompts:
        raise SpecrtError(f"a {unified.description} model draws what a prompt says: give --prompt \"...\" (repeatable)")
    validation.torch_device(device)
    if threads is not None:
        from specrt.runtime.threads import set_torch_threads

        set_torch_threads(validation.threads("--threads", threads))
    models = unified_models(target, draft, vq, progress=click.echo)
    tokenizer, _ = read_tokenizer(target)
    pipe = UnifiedPipeline.from_torch(models.target, models.draft, models.vq,
                                      prompts=PromptEncoder(models.prompt, models.target.config.cond_len, tokenizer),
                                      max_window=max_window, device=device, sampling_defaults=models.sampling_defaults,
                                      compile=compile_step)
    pipe.loop = loop
    if models.vq is None and not tokens_only:
        raise SpecrtError("this checkpoint has no image decoder here: add --tokens-only, or --vq DIR with vqgan.ckpt "
                          "and vqgan.yaml")
    _family.generate(unified, pipe, method, class_ids, seed, out, prompts, sampling, method_params, stats_path,
                     tokens_only, tokens_path, num_images, sheet, prompt_options)
