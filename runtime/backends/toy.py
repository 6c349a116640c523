"""A toy backend: context-dependent random logits over a tiny vocabulary, behind the real interface.

Why: the losslessness tests need a model whose exact sequence distribution can be enumerated,
that is cheap enough to sample 20,000 images, and that still exercises the KV/mask/position
protocol. The toy "KV cache" stores token ids; a step rebuilds each slot's context from the
cache columns and window slots its mask allows, and checks that the slot's position equals
the context length, so a wrong mask, position or commit changes the distribution and the
tests notice. Its logits go through the real sampling head (runtime/head.py, so the toy
needs torch), which is what the exported graphs and the PyTorch backend end in.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from specrt.lazy import require
from specrt.runtime.conditions import Conditions
from specrt.runtime.grammar import ImageGrammar
from specrt.runtime.runner import ModelRunner, ModelSpec, StepOutput
from specrt.runtime.vq_decoder import VQDecoder


def head_rows(logits: np.ndarray, mix: np.ndarray, uniforms: np.ndarray) -> StepOutput:
    """The sampling head over host logits [B, W, V]: what every real backend's graph ends in."""
    torch = require("torch", "the toy backend")
    from specrt.runtime.head import apply_head
    probs, draws = apply_head(torch.from_numpy(np.asarray(logits, dtype=np.float32)),
                              torch.from_numpy(np.asarray(mix, dtype=np.float32)),
                              torch.from_numpy(np.asarray(uniforms, dtype=np.float32)))
    return StepOutput(probs.numpy(), draws.numpy())


class ToyLM:
    """logits(context) for a context (class id, image tokens...), deterministic per seed.

    A draft LM is built from a target with `base=target, noise=σ`: its logits are the target's
    plus independent noise, so it agrees with the target only partly, like a real draft.
    """

    def __init__(self, vocab_size: int, seed: int, scale: float = 1.5, base: Optional["ToyLM"] = None,
                 noise: float = 1.0):
        self.vocab_size, self.seed, self.scale, self.base, self.noise = vocab_size, seed, scale, base, noise
        self._table: dict[tuple[int, ...], np.ndarray] = {}

    def logits(self, context: tuple[int, ...]) -> np.ndarray:
        row = self._table.get(context)
        if row is None:
            rng = np.random.default_rng([self.seed, len(context), *context])
            own = rng.normal(size=self.vocab_size)
            row = self.scale * own if self.base is None else self.base.logits(context) + self.noise * own
            self._table[context] = row
        return row


class ToyRunner(ModelRunner):
    """A ModelRunner over a ToyLM; its KV buffer is an int64 token table [B, capacity]."""

    def __init__(self, lm: ToyLM, spec: ModelSpec, max_window: int = 16, grammar: Optional[ImageGrammar] = None):
        super().__init__(spec, max_window)
        self.lm = lm
        self.grammar = grammar  # a unified model's image grammar, applied to the logits as its graphs do
        self._kv = np.zeros((0, 0), dtype=np.int64)
        self._present = np.zeros((0, 0), dtype=np.int64)

    def _allocate_kv(self, batch: int, capacity: int) -> None:
        self._kv = np.full((batch, capacity), -1, dtype=np.int64)
        self._present = np.zeros((batch, self.max_window), dtype=np.int64)
        self._out = np.zeros((batch, self.max_window, self.spec.vocab_size))

    @property
    def kv_buffer(self) -> np.ndarray:
        return self._kv

    def _prefill(self, rows: Conditions, uniforms: np.ndarray) -> StepOutput:
        return self._prefill_rows(np.arange(self.batch), rows, self.mix, uniforms)

    def _prefill_rows(self, model_rows: np.ndarray, rows: Conditions, mix: np.ndarray,
                      uniforms: np.ndarray) -> StepOutput:
        out = np.zeros((len(rows), 1, self.spec.vocab_size))
        for b, row in enumerate(model_rows.tolist()):
            if rows.is_prompt:  # token prompts: the ids are the toy's condition tokens
                condition = tuple(int(t) for t in rows.prompt_ids[b])
            else:
                condition = caption_tokens(rows, b) if rows.is_caption else (int(rows.class_ids[b]),)
            self._kv[row, :len(condition)] = condition
            visible = rows.caption_mask[b] if rows.is_caption or rows.is_prompt else np.ones(1, dtype=bool)
            out[b, 0] = self.lm.logits(tuple(np.asarray(condition)[visible].tolist()))
        if self.grammar is not None:  # the prefill predicts stream token 0
            out = self.grammar.constrain(out, np.zeros(out.shape[:2], dtype=np.int64))
        return head_rows(out, mix, uniforms)

    def _step(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, uniforms: np.ndarray) -> StepOutput:
        batch, size = ids.shape
        self._present[:batch, :size] = ids
        out = self._out[:batch, :size]
        cap = self.capacity
        for b in range(batch):
            # every (slot, column) the mask allows, in column order: cache rows first, then window slots
            slot, column = np.nonzero(mask[b])
            seen = np.where(column < cap, self._kv[b, np.minimum(column, cap - 1)], ids[b, np.maximum(column - cap, 0)])
            ends = np.cumsum(np.bincount(slot, minlength=size))
            seen, ends, starts = seen.tolist(), ends.tolist(), [0, *ends[:-1].tolist()]
            hidden = int(np.count_nonzero(~mask[b, 0, :self.spec.cond_len]))  # padded caption columns
            for w in range(size):
                context = tuple(seen[starts[w]:ends[w]])
                if positions[b, w] != hidden + len(context) - 1:
                    raise AssertionError(f"slot {w} at position {positions[b, w]} sees {len(context)} tokens")
                out[b, w] = self.lm.logits(context)
        if self.grammar is not None:  # slot w predicts the stream token after the one at its position
            out = self.grammar.constrain(out, positions[:batch, :size] - self.spec.cond_len + 1)
        return head_rows(out, self.mix, uniforms)

    def _write_kv(self, rows: np.ndarray, columns: np.ndarray, slots: np.ndarray) -> None:
        self._kv[rows, columns] = self._present[rows, slots]

    stages_trees = True

    def _move_kv(self, rows: np.ndarray, columns: np.ndarray, sources: np.ndarray) -> None:
        self._kv[rows, columns] = self._kv[rows, sources]

    def _write_runs(self, columns: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> None:
        images, batch = self.images, self.batch  # the buffers keep rows past the batch after a retain
        for i in np.flatnonzero(counts).tolist():
            column, start, count = int(columns[i]), int(starts[i]), int(counts[i])
            self._kv[i:batch:images, column:column + count] = self._present[i:batch:images, start:start + count]

    def _retain(self, rows: np.ndarray) -> None:
        self._kv[: len(rows)] = self._kv[rows]


UNCOND_TOKEN = 9  # the toy's uncond_embedding: a caption of this token at every position


def caption_tokens(rows: Conditions, row: int) -> tuple[int, ...]:
    """A toy caption: its embeddings' first channel read as (non-negative) token ids; an uncond
    row is the caption of UNCOND_TOKEN at every position."""
    if rows.uncond[row]:
        return (UNCOND_TOKEN,) * rows.captions.shape[1]
    return tuple(int(round(v)) for v in rows.captions[row, :, 0])


class ToyVQ(VQDecoder):
    """Paints each token as a flat grey level: enough for the pipeline's image plumbing."""

    def __init__(self, vocab_size: int, patch: int = 2):
        self.vocab_size, self.patch = vocab_size, patch
        self.downsample = patch

    def decode(self, codes: np.ndarray) -> np.ndarray:
        level = codes.astype(np.float64) / max(self.vocab_size - 1, 1) * 2.0 - 1.0
        image = np.repeat(np.repeat(level, self.patch, axis=1), self.patch, axis=2)
        return np.repeat(image[:, None], 3, axis=1)


def toy_models(vocab_size: int = 3, grid_size: int = 2, num_classes: int = 2, seed: int = 0,
               draft_noise: float = 1.0, max_window: int = 16, scale: float = 1.5,
               caption_len: int = 0, row_end: bool = False, prompt_len: int = 0) -> tuple[ToyRunner, ToyRunner, ToyVQ]:
    """A (target, draft, vq) toy family sharing one spec; `scale` sharpens the target's rows;
    caption_len > 0 makes it text-to-image (captions of up to caption_len tokens, caption_tokens),
    else class-conditional. row_end: a unified model's grammar (runtime/grammar.py) — a forced
    row-end token (head index vocab_size) after every row of grid_size codes, in both models'
    logits; the models' vocabulary is then vocab_size + 1 and their stream grid·(grid + 1).
    prompt_len > 0: conditioned on token prompts of up to prompt_len ids (model_type "prompt", the
    unified family's UnifiedPipeline runs it)."""
    grammar = ImageGrammar(grid_size, grid_size, vocab_size, row_end=True) if row_end else None
    vocab, stream = (grammar.vocab_size, grammar.stream_len) if grammar else (vocab_size, 0)
    spec = (ModelSpec(vocab_size=vocab, grid_size=grid_size, cond_len=prompt_len, model_type="prompt",
                      stream_len=stream) if prompt_len else
            ModelSpec(vocab_size=vocab, grid_size=grid_size, cond_len=caption_len, model_type="t2i", caption_dim=1,
                      stream_len=stream)
            if caption_len else ModelSpec(vocab_size=vocab, grid_size=grid_size, num_classes=num_classes,
                                          stream_len=stream))
    target_lm = ToyLM(vocab, seed, scale=scale)
    draft_lm = ToyLM(vocab, seed + 1, base=target_lm, noise=draft_noise)
    return (ToyRunner(target_lm, spec, max_window, grammar), ToyRunner(draft_lm, spec, max_window, grammar),
            ToyVQ(vocab_size))
