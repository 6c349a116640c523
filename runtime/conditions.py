"""What a batch of images is conditioned on, in the form the prefill graphs take it.

Class-conditional (c2i) models take one class id per image. Text-to-image (t2i) models take
caption embeddings [N, cond_len, caption_dim] with a padding mask [N, cond_len], arranged
exactly as LlamaGen's own t2i sampling feeds them (autoregressive/sample/sample_t2i.py):
a T5 encoder pads each caption on the right; the caption is then *left*-padded (its real
tokens moved to the end, so the last condition token, whose logits predict image token 0,
is a real one), padded positions are zeroed, and the mask hides them from every later token.
Under CFG the unconditional rows keep the same mask and are flagged `uncond`: the graph
replaces their captions by the checkpoint's own `uncond_embedding` (LlamaGen's generate()).

Unified-vocabulary models (Janus, Emu3, Lumina-mGPT) take their prompt as token ids of their own
vocabulary, left-padded the same way (docs/contracts.md, "Unified-vocabulary models"); under CFG
the unconditional rows carry their own ids (the unconditional prompt each model's code builds),
padded to the same length, so `with_uncond` stacks them instead of flagging rows.

Methods never look inside: they pass a Conditions through Decoding.prefill to the runners,
which hand `feeds()` to the graph and keep `caption_mask` for the attention mask of every
later step (docs/contracts.md, "Attention mask").
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence, Union

import numpy as np

from specrt.errors import SpecrtError


@dataclass(frozen=True)
class Conditions:
    """Per-row conditions of one model batch: class ids, or captions + mask + CFG flags."""

    class_ids: Optional[np.ndarray] = None     # int32 [N]
    captions: Optional[np.ndarray] = None      # float32 [N, cond_len, caption_dim]
    caption_mask: Optional[np.ndarray] = None  # bool [N, cond_len], False = padded position (captions or prompts)
    uncond: Optional[np.ndarray] = None        # bool [N], True = CFG row (t2i)
    prompt_ids: Optional[np.ndarray] = None    # int32 [N, cond_len] token prompts (their mask: caption_mask)
    null_ids: Optional[np.ndarray] = None      # int32 [N, cond_len] each row's unconditional prompt (CFG)
    null_mask: Optional[np.ndarray] = None     # bool [N, cond_len] its padding mask

    @classmethod
    def of_classes(cls, class_ids: Union[Sequence[int], np.ndarray, int]) -> "Conditions":
        return cls(class_ids=np.atleast_1d(np.asarray(class_ids)).astype(np.int32))

    @classmethod
    def of_captions(cls, embeddings: np.ndarray, mask: Optional[np.ndarray] = None,
                    cond_len: Optional[int] = None, left_pad: bool = True) -> "Conditions":
        """Caption embeddings as a T5 encoder returns them: [N, L, D], real tokens first, and
        their attention mask [N, L] (None: every position is real). Padded or cut to cond_len
        (refused if that would drop a real token), then left-padded and zeroed like LlamaGen."""
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.ndim == 2:
            embeddings = embeddings[None]
        if embeddings.ndim != 3 or embeddings.shape[0] == 0:
            raise SpecrtError(f"caption embeddings must be [captions, tokens, dim], got shape {embeddings.shape}")
        count, length, _ = embeddings.shape
        mask = np.ones((count, length), dtype=bool) if mask is None else np.asarray(mask).astype(bool).reshape(count, -1)
        if mask.shape != (count, length):
            raise SpecrtError(f"caption mask has shape {mask.shape}, embeddings have {embeddings.shape[:2]}")
        if not np.all(np.isfinite(embeddings)):
            raise SpecrtError("caption embeddings contain NaN or infinity")
        real = mask.sum(axis=1)
        if np.any(real == 0):
            raise SpecrtError(f"caption {int(np.argmin(real))} has no real token (its mask is all False)")
        if np.any(mask != (np.arange(length)[None] < real[:, None])):
            raise SpecrtError("caption masks must mark each caption's first tokens (a T5 encoder's right padding)")
        cond_len = cond_len or length
        if int(real.max()) > cond_len:
            raise SpecrtError(f"a caption has {int(real.max())} tokens; this model reads at most {cond_len}")
        if length < cond_len:
            embeddings = np.concatenate([embeddings, np.zeros((count, cond_len - length, embeddings.shape[2]), np.float32)], 1)
        embeddings, mask = embeddings[:, :cond_len], np.arange(cond_len)[None] < real[:, None]
        if left_pad:
            embeddings, mask = left_align(embeddings, mask)
        return cls(captions=np.ascontiguousarray(embeddings * mask[..., None]), caption_mask=mask,
                   uncond=np.zeros(count, dtype=bool))

    @classmethod
    def of_prompt_ids(cls, ids: np.ndarray, mask: np.ndarray, null_ids: Optional[np.ndarray] = None,
                      null_mask: Optional[np.ndarray] = None) -> "Conditions":
        """Token prompts [N, cond_len], left-padded (mask: False = padding, real tokens last), and
        each row's unconditional prompt in the same form (None: the model runs without CFG)."""
        ids, mask = np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool)
        if ids.ndim != 2 or ids.shape != mask.shape or not len(ids):
            raise SpecrtError(f"prompt ids must be [prompts, cond_len] with a mask of that shape, got {ids.shape} "
                              f"and {mask.shape}")
        if not mask[:, -1].all():
            raise SpecrtError("prompt ids must be left-padded: each row's last token real")
        if null_ids is not None:
            null_ids, null_mask = np.asarray(null_ids, dtype=np.int32), np.asarray(null_mask, dtype=bool)
            if null_ids.shape != ids.shape or null_mask.shape != ids.shape:
                raise SpecrtError(f"unconditional prompts {null_ids.shape} must match the prompts {ids.shape}")
        return cls(prompt_ids=ids, caption_mask=mask, null_ids=null_ids, null_mask=null_mask)

    @classmethod
    def concatenated(cls, parts: Sequence["Conditions"]) -> "Conditions":
        """The images of `parts` (conditions of one kind, prepared one request at a time) as one batch,
        in order: what a scheduler prefills together for the requests it admits between two rounds."""
        if not parts:
            raise ValueError("no conditions to concatenate")
        return cls(**{item.name: None if getattr(parts[0], item.name) is None
                      else np.concatenate([getattr(part, item.name) for part in parts]) for item in fields(cls)})

    @property
    def is_caption(self) -> bool:
        return self.captions is not None

    @property
    def is_prompt(self) -> bool:
        return self.prompt_ids is not None

    @property
    def kind(self) -> str:
        """The model_type these conditions are for: 'c2i' (class ids), 't2i' (caption embeddings)
        or 'prompt' (token prompts of a unified-vocabulary model)."""
        return "prompt" if self.is_prompt else "t2i" if self.is_caption else "c2i"

    def __len__(self) -> int:
        rows = self.prompt_ids if self.is_prompt else self.captions if self.is_caption else self.class_ids
        return len(rows)

    def image(self, index: int) -> "Conditions":
        """The conditions of one image (a batch of one)."""
        return self.part(index, index + 1)

    def part(self, start: int, stop: int) -> "Conditions":
        """The conditions of images start..stop − 1 (a pipeline's chunk of a larger call)."""
        return self.take(slice(start, stop))

    def take(self, rows: Union[slice, Sequence[int], np.ndarray]) -> "Conditions":
        """The conditions of these images (a slice or row indices, repeats allowed), every field alike."""
        return Conditions(*(None if a is None else a[rows] for a in (self.class_ids, self.captions,
                                                                       self.caption_mask, self.uncond,
                                                                       self.prompt_ids, self.null_ids, self.null_mask)))

    def with_uncond(self, null_class: int) -> "Conditions":
        """[cond; uncond]: the CFG batch. c2i: the null class id; t2i: the same captions and
        mask, flagged uncond (the graph swaps in uncond_embedding); token prompts: each row's
        unconditional prompt."""
        if self.is_prompt:
            if self.null_ids is None:
                raise SpecrtError("these prompts carry no unconditional prompt, which classifier-free guidance needs: "
                                  "generate with cfg_scale=1, or give the pipeline the model's prompt recipe "
                                  "(a bundle has it; UnifiedPipeline.from_torch(prompts=PromptEncoder(...)))")
            return Conditions(prompt_ids=np.concatenate([self.prompt_ids, self.null_ids]),
                              caption_mask=np.concatenate([self.caption_mask, self.null_mask]))
        if not self.is_caption:
            return Conditions(class_ids=np.concatenate([self.class_ids, np.full_like(self.class_ids, null_class)]))
        count = len(self)
        return Conditions(captions=np.concatenate([self.captions, self.captions]),
                          caption_mask=np.concatenate([self.caption_mask, self.caption_mask]),
                          uncond=np.concatenate([self.uncond, np.ones(count, dtype=bool)]))

    def feeds(self) -> dict[str, np.ndarray]:
        """The prefill graph's condition inputs by name (docs/contracts.md)."""
        if self.is_prompt:
            return {"input_ids": self.prompt_ids, "prompt_mask": self.caption_mask}
        if not self.is_caption:
            return {"class_ids": self.class_ids}
        return {"captions": self.captions, "caption_mask": self.caption_mask, "uncond": self.uncond}


def left_align(embeddings: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sample_t2i.py's left padding: each row's real tokens (a prefix) moved to the end, mask flipped."""
    real = mask.sum(axis=1)
    shifted = np.stack([np.roll(row, -int(n), axis=0) for row, n in zip(embeddings, real)])
    return shifted, mask[:, ::-1].copy()


def as_conditions(value: Union["Conditions", Sequence[int], np.ndarray, int]) -> "Conditions":
    """Conditions as given, or class ids made into Conditions (the c2i call sites' shorthand)."""
    return value if isinstance(value, Conditions) else Conditions.of_classes(value)
