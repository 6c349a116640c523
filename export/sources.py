"""Where `specrt export` gets its three models: LlamaGen checkpoints, or random weights in a real
architecture (for building and timing engines without weights); the embedded demos' models come
from their own hooks (export/demo/registry.py).

Each source yields a ModelSet; checkpoint mismatches come back from specrt.export.checkpoints
as one-line SpecrtErrors.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specrt.errors import SpecrtError
from specrt.export.bundle import ModelSet
from specrt.runtime.compatibility import check_compatible


def with_eagle_head(models: ModelSet, head: str | Path) -> ModelSet:
    """`models` with the draft replaced by an EAGLE head for their target: a LANTERN-layout
    directory or weight file (`specrt train-draft` writes one), or `demo` (the packaged demo head)."""
    from dataclasses import replace

    from specrt.export.eagle.checkpoint import load_eagle_head, resolve_head

    return replace(models, draft=load_eagle_head(resolve_head(head), models.target),
                   sources={**models.sources, "draft": f"eagle:{head}"})


@dataclass(frozen=True)
class GPTChoice:
    """What a GPT checkpoint cannot say about itself; each field is one CLI flag
    (--arch / --n-head / --n-kv-head, or --draft-... for the draft: `flag_prefix`)."""

    arch: str | None = None
    n_head: int | None = None
    n_kv_head: int | None = None
    flag_prefix: str = ""


def checkpoint_image_size(image_size: int | None, target: Path) -> int:
    """The image size to generate: the flag, else the resolution in the target's file name
    (LlamaGen's c2i_XL_384.pt), else a one-line error asking for --image-size."""
    from specrt.export.checkpoints import image_size_from_name

    found = image_size or image_size_from_name(target)
    if found is None:
        raise SpecrtError(f"the image size is not in the weights nor in the name {target.name}: give --image-size "
                          "(LlamaGen: 256, 384 or 512)")
    return found


def checkpoint_models(target: Path, draft: Path | None, vq: Path, target_choice: GPTChoice = GPTChoice(),
                      draft_choice: GPTChoice = GPTChoice(flag_prefix="draft-"), vq_arch: str | None = None,
                      image_size: int | None = None, where: str = "specrt export",
                      text_encoder: Path | None = None) -> ModelSet:
    """LlamaGen checkpoints, read the same way by `specrt export` and `specrt generate`.

    Everything in the weights is read from them (sizes, conditioning, the VQ's downsampling
    from its decoder); the rest comes from the choices and the image size, checked against
    the weights; the grid is image_size ÷ the VQ's own downsampling. Only the VQ decoder is
    loaded. The draft is optional (LlamaGen publishes none; ar, sjd and sjd-pac need none).
    The ModelSet's sampling defaults are the target family's (specrt.runtime.defaults), so
    the bundle and the PyTorch route sample alike. `where` names the command in messages.
    t2i: `text_encoder` names a local T5 directory to export into the bundle, tokenising to
    the GPT's cond_len (LlamaGen: flan-t5-xl, 120 tokens).
    """
    from specrt.export.checkpoints import image_grid, load_gpt, load_vq, refuse_non_checkpoint

    for flag, path in (("--target", target), ("--draft", draft), ("--vq", vq)):
        if path is not None:
            refuse_non_checkpoint(flag, path)  # its first bytes, before the image size is asked for
    image_size = checkpoint_image_size(image_size, target)  # before loading anything: a missing flag costs nothing
    vq_model = load_vq(vq, config=vq_arch, decoder_only=True)
    grid = image_grid(image_size, vq_model.config.downsample)

    def gpt(path: Path, choice: GPTChoice) -> torch.nn.Module:
        return load_gpt(path, config=choice.arch, grid_size=grid, n_head=choice.n_head, n_kv_head=choice.n_kv_head,
                        flag_prefix=choice.flag_prefix)

    target_model = gpt(target, target_choice)
    draft_model = gpt(draft, draft_choice) if draft is not None else None
    check_compatible(target_model.config, draft_model.config if draft_model is not None else None, vq_model.config, where)
    encoder = None
    if text_encoder is not None:
        if target_model.config.model_type != "t2i":
            raise SpecrtError("--text-encoder goes with text-to-image checkpoints; the target is class-conditional")
        from specrt.runtime.text import T5TextEncoder

        encoder = T5TextEncoder(text_encoder, max_length=target_model.config.cond_len)
    sources = {"target": str(target), "vq": str(vq), **({"draft": str(draft)} if draft is not None else {})}
    return ModelSet(target=target_model, draft=draft_model, vq=vq_model, sources=sources, text_encoder=encoder)


def random_models(arch: str, draft_arch: str, vq_arch: str, image_size: int, seed: int = 0) -> ModelSet:
    """Random weights in real LlamaGen layouts: graphs with the real dims and cost, no checkpoint."""
    from specrt.export.checkpoints import image_grid
    from specrt.models.llamagen_gpt import GPT, gpt_config
    from specrt.models.llamagen_vq import VQ_ARCHS, VQDecoder

    if vq_arch not in VQ_ARCHS:
        raise SpecrtError(f"unknown VQ arch {vq_arch!r}; known: {', '.join(VQ_ARCHS)}")
    vq_config = VQ_ARCHS[vq_arch]
    grid = image_grid(image_size, vq_config.downsample)
    torch.manual_seed(seed)
    try:
        target = GPT(gpt_config(arch, grid_size=grid)).eval()
        draft = GPT(gpt_config(draft_arch, grid_size=grid)).eval()
    except ValueError as exc:
        raise SpecrtError(str(exc)) from None
    vq = VQDecoder(vq_config).eval()
    return ModelSet(target=target, draft=draft, vq=vq,
                    sources={"target": f"random {arch}", "draft": f"random {draft_arch}", "vq": f"random {vq_arch}"})
