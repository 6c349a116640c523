"""The flags that say what a LlamaGen checkpoint cannot say about itself, shared by every
command that reads checkpoints (`specrt generate`, `specrt export`), so both read a file
the same way (specrt.export.sources.checkpoint_models).
Where there is no checkpoint to describe (the embedded demo, a BUNDLE) they are refused in
one line (CheckpointFlags.refuse), never ignored.

The weights give vocab, dim, layers, conditioning, codebook and the VQ's downsampling; the
head count (for sizes LlamaGen does not name) and the image size must come from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import click

from specrt.commands._flag_groups import flag_group

GPT_ARCH_NAMES = "GPT-B, GPT-L, GPT-XL, GPT-XXL, GPT-XXXL, GPT-1B, GPT-3B, GPT-7B"


@dataclass(frozen=True)
class CheckpointFlags:
    """The values of the flags below, one field per flag."""

    arch: Optional[str] = None
    n_head: Optional[int] = None
    n_kv_head: Optional[int] = None
    draft_arch: Optional[str] = None
    draft_n_head: Optional[int] = None
    draft_n_kv_head: Optional[int] = None
    vq_arch: Optional[str] = None
    image_size: Optional[int] = None

    def given(self, *fields: str) -> list[str]:
        """The flags (as typed: --arch, --draft-n-head, ...) among `fields` (default: all) that were given."""
        names = fields or tuple(self.__dataclass_fields__)
        return [f"--{name.replace('_', '-')}" for name in names if getattr(self, name) is not None]

    def refuse(self, reason: str, *fields: str) -> None:
        """SpecrtError naming the first given flag among `fields` (default: all), which `reason` says
        does not apply here: a flag that would be ignored is refused, never ignored."""
        from specrt.errors import SpecrtError

        given = self.given(*fields)
        if given:
            raise SpecrtError(f"{given[0]} {reason}")

    def choices(self) -> tuple[Any, Any]:
        """(target, draft) specrt.export.sources.GPTChoice (imported here: it needs torch)."""
        from specrt.export.sources import GPTChoice

        return (GPTChoice(self.arch, self.n_head, self.n_kv_head),
                GPTChoice(self.draft_arch, self.draft_n_head, self.draft_n_kv_head, flag_prefix="draft-"))


HF_DIRECTORY = "a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json)"


def refuse_folder_without_config(flag: str, path: Path) -> None:
    """SpecrtError unless the folder `path` is a Hugging Face checkpoint directory (config.json in
    it), saying what the folder is instead: a bundle, an empty folder, or other files."""
    from specrt.errors import SpecrtError
    from specrt.manifest import MANIFEST_NAME

    if (path / "config.json").is_file():
        return
    if (path / MANIFEST_NAME).is_file():
        raise SpecrtError(f"{flag} {path} is a specrt bundle, not a checkpoint: it is exported already "
                          f"(run it with `specrt generate {path}`)")
    what = "an empty folder" if next(path.iterdir(), None) is None else "a folder without config.json"
    raise SpecrtError(f"{flag} {path} is {what}: give a LlamaGen checkpoint file (.pt, .safetensors) or {HF_DIRECTORY}")


CHECKPOINT_FLAG_NAMES = tuple(CheckpointFlags.__dataclass_fields__)  # their parameter names, for help sections

_OPTIONS = [
    click.option("--arch", help=f"Target's LlamaGen size ({GPT_ARCH_NAMES}); fixes its head count. "
                                "Default: read from the weights."),
    click.option("--n-head", type=int,
                 help="Target's attention heads, for sizes LlamaGen does not name (checked against the weights)."),
    click.option("--n-kv-head", type=int,
                 help="Target's key/value heads (GQA); read from the weights once the head count is known."),
    click.option("--draft-arch", help="Draft's LlamaGen size; default: read from the weights."),
    click.option("--draft-n-head", type=int, help="Draft's attention heads (custom sizes)."),
    click.option("--draft-n-kv-head", type=int, help="Draft's key/value heads."),
    click.option("--vq-arch", help="VQ layout (VQ-16, VQ-8); default: read from the VQ decoder's weights."),
    click.option("--image-size", type=int,
                 help="Image size in pixels (not in the weights; grid = size ÷ the VQ's downsampling). "
                      "Default: the resolution in the target's file name (c2i_XL_384.pt)."),
]


checkpoint_flags = flag_group("checkpoint", CheckpointFlags, _OPTIONS)  # hands a command `checkpoint: CheckpointFlags`
