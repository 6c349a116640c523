"""Where `specrt export` gets its three models: the embedded demo, LlamaGen checkpoints, or
random weights in a real architecture (for building and timing engines without weights).

Each source yields a ModelSet; checkpoint mismatches come back from specrt.export.checkpoints
as one-line SpecrtErrors.
"""
from __future__ import annotations

from pathlib import Path

import torch

from specrt.errors import SpecrtError
from specrt.export.bundle import ModelSet
from specrt.runtime.sampling import SamplingParams

# DESIGN.md, LlamaGen c2i sampling defaults.
LLAMAGEN_C2I_SAMPLING = SamplingParams(cfg_scale=4.0, temperature=1.0, top_k=2000, top_p=1.0)


def demo_models(path: str | Path | None = None) -> ModelSet:
    """The trained demo family shipped with the package (or from a `specrt demo train` folder)."""
    from specrt.export.demo import load_demo

    try:
        demo = load_demo(path)
    except SpecrtError as exc:
        if path is not None:
            raise
        raise SpecrtError(f"the packaged demo weights cannot be loaded ({exc}); export checkpoints with "
                          "--target/--draft/--vq, or real-size random weights with --random-weights") from exc
    where = str(path) if path else "demo"
    return ModelSet(target=demo.target, draft=demo.draft, vq=demo.vq, sampling=demo.sampling_defaults,
                    sources={"target": f"{where}:target", "draft": f"{where}:draft", "vq": f"{where}:vq"})


def checkpoint_models(target: Path, draft: Path, vq: Path, arch: str | None, draft_arch: str | None,
                      vq_arch: str | None, image_size: int | None) -> ModelSet:
    """LlamaGen checkpoints: `arch` (e.g. GPT-B) pins the target's size, None infers it; the
    draft's size is inferred unless draft_arch is given; only the VQ decoder is loaded.
    image_size None: the resolution in the target's file name (LlamaGen's naming), else 256."""
    from specrt.export.checkpoints import image_size_from_name, load_gpt, load_vq

    vq_model = load_vq(vq, config=vq_arch, decoder_only=True)
    downsample = vq_model.config.downsample
    image_size = image_size or image_size_from_name(target) or 256
    if image_size % downsample:
        raise SpecrtError(f"--image-size must be a multiple of the VQ's downsampling {downsample}, got {image_size}")
    target_model = load_gpt(target, config=arch, image_size=image_size, downsample=downsample)
    draft_model = load_gpt(draft, config=draft_arch, image_size=image_size, downsample=downsample)
    return ModelSet(target=target_model, draft=draft_model, vq=vq_model, sampling=LLAMAGEN_C2I_SAMPLING,
                    sources={"target": str(target), "draft": str(draft), "vq": str(vq)})


def random_models(arch: str, draft_arch: str, vq_arch: str, image_size: int, seed: int = 0) -> ModelSet:
    """Random weights in real LlamaGen layouts: graphs with the real dims and cost, no checkpoint."""
    from specrt.export.llamagen_gpt import GPT, gpt_config
    from specrt.export.llamagen_vq import VQ_ARCHS, VQDecoder

    if vq_arch not in VQ_ARCHS:
        raise SpecrtError(f"unknown VQ arch {vq_arch!r}; known: {', '.join(VQ_ARCHS)}")
    vq_config = VQ_ARCHS[vq_arch]
    if image_size % vq_config.downsample:
        raise SpecrtError(f"--image-size must be a multiple of {vq_config.downsample}, got {image_size}")
    torch.manual_seed(seed)
    try:
        target = GPT(gpt_config(arch, image_size=image_size, downsample=vq_config.downsample)).eval()
        draft = GPT(gpt_config(draft_arch, image_size=image_size, downsample=vq_config.downsample)).eval()
    except ValueError as exc:
        raise SpecrtError(str(exc)) from None
    vq = VQDecoder(vq_config).eval()
    return ModelSet(target=target, draft=draft, vq=vq, sampling=LLAMAGEN_C2I_SAMPLING,
                    sources={"target": f"random {arch}", "draft": f"random {draft_arch}", "vq": f"random {vq_arch}"})
