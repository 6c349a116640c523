"""The unified demo in transformers alone: teacher-forced losses and a reference sampler.

Why not `ChameleonForConditionalGeneration.forward` / `generate`: transformers' forward sets every
image token's logit to the dtype's minimum (Meta's Chameleon was released unable to draw);
Lumina-mGPT's own class does not. So, as DESIGN.md says for Lumina-mGPT, logits are the trunk
(`model.model`) and `lm_head`. The sampler is Lumina-mGPT's generation loop made explicit: the
prompt ends with the image-start and size tokens, classifier-free guidance mixes in a second
row that is those three tokens alone (`scale · (cond − uncond) + uncond`), a row end is forced
after every row, the other positions sample image tokens only. It is what the demo's quality
figures are measured with, independently of specrt's exporter and runtime.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from specrt.lazy import require

torch = require("torch", "the unified demo")
F = torch.nn.functional

from specrt.export.demo.unified import vocabulary as voc  # noqa: E402

IGNORE = -100


def logits_of(model, input_ids: "torch.Tensor", **kwargs) -> tuple["torch.Tensor", object]:
    """Full-vocabulary logits from the trunk and lm_head (no image-token masking) and the cache."""
    out = model.model(input_ids=input_ids, **kwargs)
    return model.lm_head(out.last_hidden_state), out.past_key_values


def right_padded(rows: Sequence[tuple[list[int], int]]) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(ids, first label) rows -> input ids and next-token labels [B, T], padded on the right
    (causal attention: padding after a row changes nothing before it, and positions stay 0..)."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), voc.VOCAB[voc.PAD], dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (row, first) in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        labels[i, first:len(row)] = ids[i, first:len(row)]
    return ids, labels


def sequence_loss(model, ids: "torch.Tensor", labels: "torch.Tensor") -> "torch.Tensor":
    """Mean next-token cross-entropy over the labelled positions."""
    logits, _ = logits_of(model, ids, use_cache=False)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE)


@torch.no_grad()
def image_nll(model, tokenizer, captions: Sequence[Optional[str]], codes: np.ndarray,
              batch_size: int = 128) -> dict[str, float]:
    """Teacher-forced NLL (nats per token) of images `codes` [N, 64] under `captions` (None: the
    unconditional input): `codes`, over the 64 image tokens (comparable with the t2i demo's
    held-out NLL, log 512 = 6.24 for a uniform guess); `stream`, over everything the model is
    trained to predict (row ends, image end and end of turn included)."""
    model.eval()
    totals = {"codes": [0.0, 0], "stream": [0.0, 0]}
    for start in range(0, len(codes), batch_size):
        part = slice(start, min(start + batch_size, len(codes)))
        texts = list(captions[part])
        prompts = voc.encode_prompts(tokenizer, [t for t in texts if t is not None])
        prompts_iter = iter(prompts)
        rows = [voc.training_sequence(next(prompts_iter) if t is not None else None, c)
                for t, c in zip(texts, codes[part])]
        ids, labels = right_padded(rows)
        logits, _ = logits_of(model, ids, use_cache=False)
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=IGNORE, reduction="none")
        target = labels[:, 1:]
        is_code = (target >= voc.FIRST_IMAGE_ID) & (target < voc.FIRST_IMAGE_ID + voc.CODEBOOK_SIZE)
        totals["codes"][0] += nll[is_code].sum().item()
        totals["codes"][1] += int(is_code.sum())
        totals["stream"][0] += nll[target != IGNORE].sum().item()
        totals["stream"][1] += int((target != IGNORE).sum())
    return {k: s / max(n, 1) for k, (s, n) in totals.items()}


def _left_padded(prompts: Sequence[list[int]]) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """Prompts -> ids, attention mask and positions [B, L], real tokens last; position of real
    token j is j (what transformers' generate gives a left-padded row)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), voc.VOCAB[voc.PAD], dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return ids, mask, positions


class _Row:
    """One batch of prompts fed token by token with its own cache (Lumina's CFG runs the
    unconditional branch as a second, unbatched model call; here each branch is a batch)."""

    def __init__(self, model, prompts: Sequence[list[int]]):
        self.model = model
        self.ids, self.mask, positions = _left_padded(prompts)
        self.next_position = positions[:, -1:] + 1
        logits, self.cache = logits_of(model, self.ids, attention_mask=self.mask, position_ids=positions,
                                       use_cache=True)
        self.last = logits[:, -1]

    def feed(self, tokens: "torch.Tensor") -> None:
        self.mask = torch.cat([self.mask, torch.ones_like(tokens[:, None])], 1)
        logits, self.cache = logits_of(self.model, tokens[:, None], attention_mask=self.mask,
                                       position_ids=self.next_position, past_key_values=self.cache, use_cache=True)
        self.next_position = self.next_position + 1
        self.last = logits[:, -1]


@torch.no_grad()
def generate(model, tokenizer, captions: Sequence[str], cfg_scale: float = 3.0, temperature: float = 1.0,
             top_k: int = 0, seed: int = 0) -> np.ndarray:
    """Codes [N, 8, 8] sampled for `captions` (temperature 0: greedy), Lumina-mGPT's way."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    cond = _Row(model, voc.encode_prompts(tokenizer, captions))
    uncond = _Row(model, [voc.image_prefix_ids()] * len(captions)) if cfg_scale != 1.0 else None
    image_ids = slice(voc.FIRST_IMAGE_ID, voc.FIRST_IMAGE_ID + voc.CODEBOOK_SIZE)
    row_end = torch.full((len(captions),), voc.VOCAB[voc.ROW_END], dtype=torch.long)
    codes = []
    for k in range(voc.GRID * (voc.GRID + 1)):
        if k % (voc.GRID + 1) == voc.GRID:  # forced: the row end costs no sampling
            token = row_end
        else:
            logits = cond.last[:, image_ids]
            if uncond is not None:
                free = uncond.last[:, image_ids]
                logits = cfg_scale * (logits - free) + free
            if temperature == 0:
                code = logits.argmax(-1)
            else:
                logits = logits / temperature
                if 0 < top_k < logits.shape[-1]:
                    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                code = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]
            codes.append(code)
            token = code + voc.FIRST_IMAGE_ID
        if k + 1 < voc.GRID * (voc.GRID + 1):
            cond.feed(token)
            if uncond is not None:
                uncond.feed(token)
    return torch.stack(codes, 1).view(len(captions), voc.GRID, voc.GRID).numpy()
