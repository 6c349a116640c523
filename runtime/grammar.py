"""An image's token grammar: which tokens of the generated stream are sampled and which are forced.

Unified-vocabulary generators (Emu3, Lumina-mGPT / Chameleon) do not emit a bare grid of VQ codes:
after every row of the image comes a row-end token, which their own sample code forces (a
prefix-constrained logits processor allows only that token there). Janus, like LlamaGen, emits
the bare grid. The runtime decodes a *stream*: stream token k sits at sequence position
`cond_len + k`, exactly like LlamaGen's image token k, and its value is a *head index*: a VQ code
in 0..image_vocab − 1, or a structural token after them (the row end is index image_vocab).

Why the grammar lives in the model's logits and not in the methods: a forced position's
distribution is a point mass for the target and for every draft (the graphs set every other
logit to FORCED_LOGIT), so any exact method accepts a forced token with probability 1 and never
resamples it (p = q = 1 at the forced token), and a sampled position gives the structural tokens
probability 0 — no method needs to know the grammar exists, and a method that mishandles it
fails the exactness tests like any other bug. The runtime only needs the stream's length and
how to read the grid back (`grid`); drafters that initialise windows without a model (SJD)
may start forced slots at their forced token (`forced`).

This module is torch-free (the runtime's side); the torch side that applies the table to logits
is specrt.export.unified.model.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

# The logit every token but the allowed one gets at a forced position, and the structural
# tokens get at a sampled one: finite (CFG's mix of two such rows must not make inf − inf),
# far enough below any real logit that softmax gives it exactly 0 in float32 at any temperature
# a user sets (the head divides by T inside `mix`; T >= 1e-3 keeps it below −1e12 / 1e3).
FORCED_LOGIT = -1e9


@dataclass(frozen=True)
class ImageGrammar:
    """The stream of one image: `rows` rows of `cols` sampled codes, each row followed by a
    forced row-end token when `row_end` (head index `image_vocab`)."""

    rows: int
    cols: int
    image_vocab: int
    row_end: bool = False

    def __post_init__(self) -> None:
        if min(self.rows, self.cols, self.image_vocab) < 1:
            raise ValueError(f"an image grammar needs positive rows, cols and image_vocab, got {self}")

    @property
    def vocab_size(self) -> int:
        """The head's vocabulary: the codes, then the structural tokens."""
        return self.image_vocab + int(self.row_end)

    @property
    def row_end_index(self) -> int:
        """The row-end token's head index (only meaningful when row_end)."""
        return self.image_vocab

    @property
    def row_len(self) -> int:
        return self.cols + int(self.row_end)

    @property
    def stream_len(self) -> int:
        """Tokens generated per image (what the runtime's methods decode)."""
        return self.rows * self.row_len

    def forced(self) -> np.ndarray:
        """int64 [stream_len] (read-only): the head index stream token k must be, −1 where it is sampled."""
        return _forced_table(self.stream_len, self.cols, self.row_len, self.row_end_index if self.row_end else -1)

    def constrain(self, logits: np.ndarray, next_index: np.ndarray) -> np.ndarray:
        """Host logits [..., vocab_size] of rows predicting stream tokens `next_index` [...] ->
        the grammar's logits: a point mass (0 at the forced token, FORCED_LOGIT elsewhere) where
        the token is forced, the structural tokens at FORCED_LOGIT where it is sampled. The
        exported graphs do the same in torch (specrt.export.unified.model); this is the host's
        copy for backends without a model (the toy) and the tests' reference."""
        logits = np.asarray(logits, dtype=np.float32)
        index = np.clip(np.asarray(next_index), 0, self.stream_len - 1)
        forced = self.forced()[index][..., None]
        columns = np.arange(self.vocab_size)
        free = np.where(columns < self.image_vocab, logits, FORCED_LOGIT)
        return np.where(forced >= 0, np.where(columns == forced, 0.0, FORCED_LOGIT), free).astype(np.float32)

    def grid(self, stream: np.ndarray) -> np.ndarray:
        """[..., stream_len] -> [..., rows, cols]: the VQ codes, structural tokens dropped."""
        stream = np.asarray(stream)
        if stream.shape[-1] != self.stream_len:
            raise ValueError(f"an image stream has {self.stream_len} tokens, got {stream.shape[-1]}")
        return stream.reshape(*stream.shape[:-1], self.rows, self.row_len)[..., : self.cols]

    def stream(self, grid: np.ndarray) -> np.ndarray:
        """[..., rows, cols] codes -> [..., stream_len] with the forced tokens in place (teacher forcing)."""
        grid = np.asarray(grid)
        if grid.shape[-2:] != (self.rows, self.cols):
            raise ValueError(f"an image grid is {self.rows}x{self.cols}, got {grid.shape[-2:]}")
        if not self.row_end:
            return grid.reshape(*grid.shape[:-2], self.stream_len)
        ends = np.full((*grid.shape[:-1], 1), self.row_end_index, dtype=grid.dtype)
        return np.concatenate([grid, ends], axis=-1).reshape(*grid.shape[:-2], self.stream_len)

    def is_valid(self, stream: np.ndarray) -> np.ndarray:
        """bool [...]: each stream obeys the grammar (forced tokens in place, codes elsewhere)."""
        stream = np.asarray(stream)
        forced = self.forced()
        free = forced < 0
        codes_ok = ((stream[..., free] >= 0) & (stream[..., free] < self.image_vocab)).all(axis=-1)
        return codes_ok & (stream[..., ~free] == forced[~free]).all(axis=-1)


@functools.lru_cache(maxsize=16)
def _forced_table(stream_len: int, cols: int, row_len: int, row_end: int) -> np.ndarray:
    table = np.full(stream_len, -1, dtype=np.int64)
    if row_end >= 0:
        table[cols::row_len] = row_end
    table.setflags(write=False)
    return table


def head_neighbours(code_neighbours: np.ndarray, grammar: ImageGrammar) -> np.ndarray:
    """LANTERN's neighbour table over the head vocabulary: the codes' own rows (from the VQ
    codebook) and, for each structural token, the first k codes. A structural token has no
    latent neighbours; where it is forced both p and q are point masses on it, so its relaxed
    acceptance never depends on the row, which only has to satisfy the table's contract (k ids,
    none its own)."""
    table = np.asarray(code_neighbours, dtype=np.int32)
    extra = grammar.vocab_size - grammar.image_vocab
    if table.shape[0] != grammar.image_vocab:
        raise ValueError(f"a code neighbour table has {grammar.image_vocab} rows, got {table.shape[0]}")
    rows = np.broadcast_to(np.arange(table.shape[1], dtype=np.int32), (extra, table.shape[1]))
    return np.concatenate([table, rows])
