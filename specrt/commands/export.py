"""`specrt export`: PyTorch models -> a bundle directory (ONNX graphs + neighbours + manifest).

Flags map onto specrt.export.sources (which models), ExportOptions (what graphs) and
write_bundle / verify_bundle (where, and whether to check them in onnxruntime).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specrt import validation
from specrt.bundle_dir import refuse_existing
from specrt.commands._checkpoint_flags import (CHECKPOINT_FLAG_NAMES, CheckpointFlags, checkpoint_flags,
                                               refuse_folder_without_config)
from specrt.commands._help import COMMON, DEMO_SHORT_HELP, sectioned
from specrt.commands._path_flags import nonblank
from specrt.errors import SpecrtError
from specrt.export.demo.registry import DEFAULT_DEMO, demo_names
from specrt.runtime.threads import HELP as THREADS_HELP, checked as checked_threads, resolve as resolve_threads
from specrt.manifest import DEFAULT_MAX_IMAGES
from specrt.runtime.methods import DEFAULT_MAX_WINDOW


def _models(target, draft, vq, checkpoint: CheckpointFlags, random_weights, demo_path, text_encoder, demo=None):
    from specrt.export import sources
    from specrt.export.demo.registry import get_demo

    given = [name for name, value in (("--target", target), ("--draft", draft), ("--vq", vq)) if value]
    if demo is not None and (given or random_weights):
        raise SpecrtError(f"--demo {demo} exports an embedded demo; drop {', '.join(given) or '--random-weights'}")
    if text_encoder and not given:
        raise SpecrtError("--text-encoder goes with t2i checkpoints (--target/--draft/--vq)")
    if random_weights:
        if given:
            raise SpecrtError(f"--random-weights makes its own weights; drop {', '.join(given)}")
        return sources.random_models(checkpoint.arch or "GPT-B", checkpoint.draft_arch or "GPT-B",
                                     checkpoint.vq_arch or "VQ-16", checkpoint.image_size or 256)
    if given:
        missing = [n for n in ("--target", "--vq") if n not in given]
        if missing:
            raise SpecrtError(f"exporting checkpoints needs --target and --vq (--draft is optional); "
                              f"missing {', '.join(missing)}")
        target_choice, draft_choice = checkpoint.choices()
        return sources.checkpoint_models(Path(target), Path(draft) if draft else None, Path(vq), target_choice,
                                         draft_choice,
                                         checkpoint.vq_arch, checkpoint.image_size, where="specrt export",
                                         text_encoder=text_encoder)
    return get_demo(demo).hook("model_set")(demo_path)


def _refuse_inapplicable(checkpoint: CheckpointFlags, target, draft, vq, random_weights: bool, demo,
                         continuous: bool) -> None:
    """Checkpoint flags where nothing reads them are one line, never ignored (before any model loads)."""
    if continuous:
        checkpoint.refuse("describes LlamaGen checkpoints; the continuous family has no such flag")
    elif random_weights:
        checkpoint.refuse("describes a checkpoint's custom size; --random-weights takes the named sizes --arch / "
                          "--draft-arch", "n_head", "n_kv_head", "draft_n_head", "draft_n_kv_head")
    elif target or draft or vq:
        if draft is None:
            checkpoint.refuse("describes the --draft checkpoint, and no --draft is given",
                              "draft_arch", "draft_n_head", "draft_n_kv_head")
    else:
        checkpoint.refuse(f"describes LlamaGen checkpoints (--target/--vq) or --random-weights; the embedded demo "
                          f"({demo or DEFAULT_DEMO}) has a fixed architecture and image size")


@sectioned("export", sections=[
    (COMMON, ["out", "force", "demo", "target", "draft", "vq", "verify", "help"]),
    ("Model and checkpoints", ["family", "random_weights", "demo_weights", "text_encoder", "eagle",
                               *CHECKPOINT_FLAG_NAMES]),
    ("Hugging Face checkpoints", ["grid", "max_prompt_tokens", "weights_dtype"]),
    ("Bundle shape", ["max_window", "max_batch", "opset", "kv_inputs"]),
    ("Method graphs", ["neighbours_k", "draft_chain", "draft_tree", "draft_growth", "no_hidden"]),
    ("Performance", ["threads"]),
])
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("bundle"), show_default=True,
              help="Bundle directory to write (refused if it exists, unless --force).")
@click.option("--force", is_flag=True, help="Replace an existing --out (only once the new bundle is complete).")
@click.option("--target", type=click.Path(path_type=Path),
              help="LlamaGen GPT checkpoint (target model), or a Hugging Face checkpoint directory of Janus / Janus-Pro, "
                   "Emu3-Gen or Lumina-mGPT (config.json, safetensors, tokenizer.json; the architecture comes from "
                   "config.json).")
@click.option("--draft", type=click.Path(path_type=Path),
              help="LlamaGen GPT checkpoint (draft model), or a smaller Hugging Face checkpoint directory of the "
                   "target's family and vocabulary. Optional: without it the bundle runs ar, sjd and sjd-pac.")
@click.option("--vq", type=click.Path(path_type=Path),
              help="LlamaGen VQ checkpoint (decoder and codebook). Hugging Face checkpoints carry their own VQ (Janus, "
                   "Emu3); Lumina-mGPT needs Chameleon's VQGAN: the directory holding vqgan.ckpt and vqgan.yaml.")
@click.option("--grid", metavar="ROWSxCOLS", default=None,
              help="Hugging Face checkpoints: the image grid in VQ tokens (Emu3 / Lumina-mGPT choose it per bundle; "
                   "Janus has its own). Default: the model's usual resolution.")
@click.option("--max-prompt-tokens", type=int, default=None,
              help="Hugging Face checkpoints: the longest prompt (template included) the bundle takes, in tokens "
                   "(default 128).")
@click.option("--dtype", "weights_dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32",
              show_default=True, help="Hugging Face checkpoints: the graphs' weight dtype (the sampling head and "
                                      "logits stay float32).")
@click.option("--text-encoder", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="t2i: a local T5 encoder directory (flan-t5-xl for LlamaGen) exported into the bundle with its "
                   "tokenizer, so the bundle takes prompts (needs specrt[t2i]).")
@click.option("--random-weights", is_flag=True, help="Random weights in the --arch / --draft-arch / --vq-arch layouts "
                                                   "(real dims, no checkpoint; GPT-B, VQ-16, 256 px unless given).")
@click.option("--demo", type=click.Choice(demo_names()), default=None, help=DEMO_SHORT_HELP)
@click.option("--demo-weights", type=click.Path(file_okay=False, path_type=Path),
              help="A `specrt demo train --demo NAME` output folder instead of the packaged weights of that demo.")
@click.option("--max-window", type=int, default=DEFAULT_MAX_WINDOW, show_default=True,
              help="Largest step window W (profile max): tokens per target step; sjd-pac at L = 64 feeds 65.")
@click.option("--max-batch", type=int, default=DEFAULT_MAX_IMAGES, show_default=True,
              help="Most images one pass decodes together (with or without CFG); the graphs' batch profile is "
                   "derived: 2 rows per image for CFG's [cond; uncond] pair. A larger generate call runs in passes "
                   "of this many images (the same images: each draws from its own seed).")
@click.option("--opset", type=int, default=18, show_default=True,
              help="ONNX opset: 18 (TensorRT 10.3, attention as MatMul/Softmax) or 23 (ONNX Attention, newer stacks).")
@click.option("--kv-inputs", "kv_inputs", type=click.Choice(["auto", "layers", "stacked"]), default="auto",
              show_default=True,
              help="How the step graphs take the KV cache: layers (an input per layer's keys and values, which "
                   "onnxruntime's CPU provider reads without copying the cache each step), stacked (one past_kv input, "
                   "what TensorRT binds); auto: layers where no TensorRT or onnxruntime GPU provider is installed. "
                   "LlamaGen-family step graphs only.")
@click.option("--eagle", "eagle", metavar="HEAD", callback=nonblank,
              help="Draft with an EAGLE head instead of --draft: a LANTERN-layout drafter (directory with config.json "
                   "and pytorch_model.bin / model.safetensors, or a weight file; `specrt train-draft` writes one), "
                   "or `demo` for the head shipped with the demo target.")
@click.option("--no-hidden", is_flag=True, help="Drop the target's `hidden` output (only EAGLE-style drafts need it).")
@click.option("--neighbours", "neighbours_k", type=int, default=32, show_default=True,
              help="LANTERN neighbours per token (clamped, with a note, to the codebook size − 1).")
@click.option("--draft-chain", "draft_chain", type=int, default=4, show_default=True,
              help="Drafts per call of the draft_chain graph (a round's draft steps in one graph run; "
                   "sd/cool-sd/lantern use it when their draft_len equals it and no top-k/top-p/greedy applies); "
                   "0: no chain graph.")
@click.option("--draft-tree", "draft_tree", default=None, metavar="TREE", callback=nonblank,
              help="The static tree the draft_tree graph drafts in one call (every depth of a round's tree in one "
                   "graph run; sd/cool-sd/lantern with tree=static use it when their static_tree is this one and no "
                   "top-k/top-p/greedy applies): a static tree name or a `specrt plan-tree` plan file; none: no tree "
                   "graph. Default: mc_sim_7b_63 (the methods' default) where --max-window holds it.")
@click.option("--draft-growth", "draft_growth", default=None, metavar="DEPTH,TOP_K",
              help="The dynamic tree the draft_growth graph grows in one call (EAGLE-2's passes in one graph run; "
                   "sd/cool-sd/lantern with tree=dynamic use it when their depth and tree_top_k are these and no "
                   "top-k/top-p/greedy applies); none: no growth graph. Default: 6,8 (the methods' default) where "
                   "--max-window holds the nodes it feeds.")
@click.option("--verify", is_flag=True, help="Afterwards run every graph in onnxruntime against PyTorch (exit 1 above tolerance).")
@click.option("--family", type=click.Choice(["llamagen", "continuous"]), default="llamagen", show_default=True,
              help="Model family: LlamaGen GPT + VQ, or the continuous MAR-style family (export/mar: the mar demo, "
                   "its --demo-weights, or --random-weights).")
@click.option("--threads", type=int, default=None, callback=checked_threads, help=f"{THREADS_HELP}.")
@click.pass_context
@checkpoint_flags
def command(ctx: click.Context, out, force, target, draft, vq, grid, max_prompt_tokens, weights_dtype, checkpoint,
            random_weights, demo, demo_weights, text_encoder, max_window, max_batch, opset, eagle, no_hidden,
            neighbours_k, draft_chain, draft_tree, draft_growth, verify, family, threads, kv_inputs) -> None:
    """Export target, draft (optional) and VQ decoder to an ONNX bundle: the embedded demo by
    default, LlamaGen c2i or t2i checkpoints (--target/--vq files; the model type comes from the
    weights), or a Hugging Face directory of Janus / Janus-Pro, Emu3-Gen or Lumina-mGPT (--target DIR)."""
    from specrt.lazy import require
    from specrt.paths import output_folder

    output_folder("--out", out)  # its parent exists and takes files: before any model loads
    unified = _is_hf_directory(target) or demo == "chameleon"
    if not unified:
        for flag, value in (("--grid", grid), ("--max-prompt-tokens", max_prompt_tokens),
                            ("--dtype", weights_dtype != "float32")):
            if value:
                raise SpecrtError(f"{flag} applies to Hugging Face checkpoint directories (--target DIR) only")
        for flag, value in (("--target", target), ("--draft", draft), ("--vq", vq)):
            if value is not None and value.is_dir():
                refuse_folder_without_config(flag, value)  # what the folder is, when it is no checkpoint
                raise SpecrtError(f"{flag} {value} is a Hugging Face checkpoint directory: it goes with a Hugging "
                                  "Face --target directory")
    _refuse_inapplicable(checkpoint, target, draft, vq, random_weights, demo, demo == "mar" or family == "continuous")
    if not unified:
        from specrt.export.checkpoints import refuse_non_checkpoint

        for flag, value in (("--target", target), ("--draft", draft), ("--vq", vq)):
            if value is not None:
                refuse_non_checkpoint(flag, value)  # a PNG named as a PNG, not met later as a missing image size
    if kv_inputs != "auto" and (unified or demo == "mar" or family == "continuous"):
        raise SpecrtError("--kv-inputs applies to LlamaGen-family bundles; this model's step graphs take one KV input")
    refuse_existing(out, force)  # before loading multi-GB checkpoints
    torch = require("torch", "specrt export")
    threads = resolve_threads(threads)
    torch.set_num_threads(threads)
    if unified:
        _export_unified(ctx, out, force, target, draft, vq, grid, max_prompt_tokens, weights_dtype, demo, demo_weights,
                        random_weights or text_encoder or eagle or no_hidden or checkpoint.given(), verify,
                        dict(opset=opset, max_window=max_window, max_batch=max_batch, neighbours_k=neighbours_k,
                             draft_chain=draft_chain, draft_growth="" if draft_growth == "none" else draft_growth))
        return
    if demo == "mar" or family == "continuous":
        if demo not in (None, "mar"):
            raise SpecrtError(f"--demo {demo} is a LlamaGen-family demo: drop --family continuous")
        _export_continuous(ctx, out, force, random_weights, (target, draft, vq), demo_weights, verify)
        return
    from specrt.export.bundle import ExportOptions, write_bundle

    options = ExportOptions(opset=opset, max_window=max_window, max_batch=max_batch,
                            target_hidden=not no_hidden, neighbours_k=neighbours_k, draft_chain=draft_chain,
                            draft_tree="" if draft_tree == "none" else draft_tree,  # None: the default
                            draft_growth="" if draft_growth == "none" else draft_growth,
                            kv_inputs=None if kv_inputs == "auto" else kv_inputs)
    if eagle and draft:
        raise SpecrtError("--eagle replaces the draft model: give --draft or --eagle, not both")
    models = _models(target, draft, vq, checkpoint, random_weights, demo_weights, text_encoder, demo)
    if eagle:
        from specrt.export.sources import with_eagle_head

        models = with_eagle_head(models, eagle)
    manifest = write_bundle(models, out, options, force=force, progress=click.echo)
    click.echo(f"wrote bundle {manifest.root} ({len(manifest.graphs)} graphs); check it with: specrt inspect {out}")
    if verify:
        from specrt.export.verify import verify_bundle

        click.echo("verifying graphs in onnxruntime (CPU) against PyTorch ...")
        report = verify_bundle(manifest, models, threads=threads)
        click.echo(report.format())
        if not report.passed:
            ctx.exit(1)


def _is_hf_directory(path: Path | None) -> bool:
    """A Hugging Face checkpoint directory (config.json inside): the unified-vocabulary export."""
    return path is not None and path.is_dir() and (path / "config.json").is_file()


def _export_unified(ctx: click.Context, out: Path, force: bool, target: Path | None, draft: Path | None,
                    vq: Path | None, grid: str | None, max_prompt_tokens: int | None, weights_dtype: str,
                    demo: str | None, demo_weights: Path | None, inapplicable: Any, verify: bool,
                    options: dict[str, Any]) -> None:
    """A unified-vocabulary bundle (export/unified) from Hugging Face checkpoint directories, or the
    chameleon demo's."""
    from specrt.export.bundle import ExportOptions
    from specrt.export.demo.unified.hooks import model_set
    from specrt.export.unified.sources import parse_grid, unified_models
    from specrt.export.unified.writer import write_unified_bundle

    if inapplicable:
        raise SpecrtError("--random-weights, --text-encoder, --eagle, --no-hidden and the LlamaGen size flags do not "
                          "apply to Hugging Face checkpoint directories")
    if draft is not None and not _is_hf_directory(draft):
        raise SpecrtError(f"--draft {draft} must be a Hugging Face checkpoint directory (config.json inside) like --target")
    if demo == "chameleon":
        if target is not None or draft is not None or vq is not None:
            raise SpecrtError("--demo chameleon exports the embedded demo; drop --target/--draft/--vq")
        models = model_set(demo_weights, dtype=weights_dtype)
    else:
        if max_prompt_tokens is not None:
            validation.count("--max-prompt-tokens", max_prompt_tokens)
        models = unified_models(target, draft, vq, grid=parse_grid(grid), cond_len=max_prompt_tokens,
                                dtype=weights_dtype, progress=click.echo)
    manifest = write_unified_bundle(models, out, ExportOptions(**options), force=force, progress=click.echo)
    click.echo(f"wrote bundle {manifest.root} ({len(manifest.graphs)} graphs, {models.target.config.architecture}); "
               f"generate with: specrt generate {out} --prompt \"...\"")
    if verify:
        from specrt.export.verify import verify_bundle

        click.echo("verifying graphs in onnxruntime (CPU) against PyTorch ...")
        report = verify_bundle(manifest, models)
        click.echo(report.format())
        if not report.passed:
            ctx.exit(1)


def _export_continuous(ctx: click.Context, out: Path, force: bool, random_weights: bool, given: tuple,
                       demo_weights: Path | None, verify: bool) -> None:
    """The continuous family: the mar demo (or its --demo-weights) with its tokenizer decoder, or a
    random-weight target/draft pair (export.mar); and its --verify."""
    from specrt.export.mar.export import export_bundle, verify_bundle
    from specrt.models.mar.model import RANDOM_DRAFT, RANDOM_TARGET, random_mar

    if any(given):
        raise SpecrtError("the continuous family exports the mar demo (--demo-weights DIR for retrained weights) or "
                          "--random-weights; LTH14/mar checkpoints load in Python (specrt.export.mar.checkpoint)")
    if random_weights and demo_weights:
        raise SpecrtError("--random-weights makes its own weights; drop --demo-weights")
    refuse_existing(out, force)
    if random_weights:
        export_bundle(random_mar(RANDOM_TARGET, seed=0), random_mar(RANDOM_DRAFT, seed=1), out)
        click.echo(f"wrote continuous bundle {out} (target and draft step + head graphs)")
    else:
        from specrt.export.mar.hooks import export_bundle as export_demo

        export_demo(out, demo_weights)
        click.echo(f"wrote continuous bundle {out} (the mar demo: target and draft step + head graphs, tokenizer "
                   f"decoder); generate with: specrt generate {out} --method cspd")
    if verify:
        click.echo("verifying graphs in onnxruntime (CPU) against PyTorch ...")
        try:
            for line in verify_bundle(out):
                click.echo(f"  {line}")
        except SpecrtError as err:
            click.echo(f"FAILED: {err}")
            ctx.exit(1)
