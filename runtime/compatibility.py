"""Which models can run together, and what conditioning a checkpoint was trained for.

A target, a draft and a VQ decoder must agree on the token language (vocabulary, grid,
classes) or the pipeline produces plausible-looking wrong images; a text-to-image GPT fed
class ids ends in a matrix-shape traceback deep inside the model. Every path that combines
models (`specrt export`, `specrt generate` on checkpoints, `Pipeline.from_torch`) checks
them here first, so each mistake is one line naming the disagreeing numbers. Torch-free:
it reads config attributes and state_dict key names only.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from specrt.errors import SpecrtError

CLASS_CONDITIONAL = "c2i"
TEXT_CONDITIONAL = "t2i"
# The keys LlamaGen's two condition embedders leave in a GPT state_dict.
CLASS_EMBEDDING_KEY = "cls_embedding.embedding_table.weight"  # LabelEmbedder (c2i)
CAPTION_PROJECTION_KEY = "cls_embedding.cap_proj.fc1.weight"  # CaptionEmbedder (t2i)


def conditioning_from_keys(keys: Iterable[str]) -> str:
    """'c2i' or 't2i' from a GPT state_dict's key names (the weights say it; no flag needed).

    A file with neither embedder (or, impossibly, both) is not a LlamaGen GPT we can run.
    """
    keys = set(keys)
    found = [kind for kind, key in ((CLASS_CONDITIONAL, CLASS_EMBEDDING_KEY), (TEXT_CONDITIONAL, CAPTION_PROJECTION_KEY))
             if key in keys]
    if len(found) != 1:
        what = "both" if found else "neither"
        raise SpecrtError(f"cannot tell the GPT's conditioning: it has {what} of {CLASS_EMBEDDING_KEY} (class-conditional) "
                          f"and {CAPTION_PROJECTION_KEY} (text-conditional)")
    return found[0]


def require_class_conditional(model_type: str, what: str, where: str) -> None:
    """Refuse, in one line, a model that `where` (a class-id-only path) cannot condition."""
    if model_type != CLASS_CONDITIONAL:
        raise SpecrtError(f"{what} is a text-to-image ({model_type}) model; {where} runs class-conditional (c2i) "
                          "models only for now")


def check_compatible(target: Any, draft: Optional[Any], vq: Any, where: str) -> None:
    """Target, optional draft and VQ configs (GPTConfig / VQConfig attributes) can run together.

    The draft must speak the target's token language, take the same condition (class ids,
    or captions of the same length and width) and the VQ must decode the tokens.
    """
    if target.model_type not in (CLASS_CONDITIONAL, TEXT_CONDITIONAL):
        raise SpecrtError(f"{where} runs c2i and t2i models; the target is {target.model_type!r}")
    if draft is not None:
        if draft.model_type != target.model_type:
            raise SpecrtError(f"the draft is {draft.model_type} but the target is {target.model_type}: "
                              "both must take the same condition")
        condition = (("number of classes", target.num_classes, draft.num_classes) if target.model_type == CLASS_CONDITIONAL
                     else ("caption dim", target.caption_dim, draft.caption_dim))
        for name, t_value, d_value in (("vocab size", target.vocab_size, draft.vocab_size),
                                       ("grid size", target.grid_size, draft.grid_size),
                                       ("condition length", target.cond_len, draft.cond_len), condition):
            if t_value != d_value:
                raise SpecrtError(f"draft {name} {d_value} != target {name} {t_value}: "
                                  "the draft must share the target's tokenizer")
    if vq.codebook_size != target.vocab_size:
        raise SpecrtError(f"VQ codebook size {vq.codebook_size} != GPT vocab size {target.vocab_size}")
