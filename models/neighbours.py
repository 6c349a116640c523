"""LANTERN's latent-proximity table: the k nearest VQ codewords of every token.

LANTERN relaxes acceptance by pooling target probability over tokens whose codewords sit
close together in latent space (paper 004). The table is computed once at export from the
codebook *as used at lookup* (L2-normalised for LlamaGen's VQ), with Euclidean distance,
and shipped in the bundle so the runtime needs no VQ weights and no torch.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from specrt.errors import SpecrtError

DEFAULT_K = 32


def codebook_of(vq: Any) -> Optional[np.ndarray]:
    """A VQ module's codebook as used at lookup, float [codes, dim], or None when it has none: its
    own `codebook()` (LlamaGen's VQModel: L2-normalised), its quantizer's, or the raw
    `quantize.embedding` rows of taming / transformers layouts (normalised here when the module's
    config says lookups are, Janus's `l2_norm`). The one reader for export and the PyTorch backend."""
    quantize = getattr(vq, "quantize", None)
    if callable(getattr(vq, "codebook", None)):
        table = vq.codebook()
    elif callable(getattr(quantize, "codebook", None)):
        table = quantize.codebook()
    elif hasattr(quantize, "embedding"):
        table = quantize.embedding.weight
    else:
        return None
    table = table.detach().float().cpu().numpy()
    if not callable(getattr(quantize, "codebook", None)) and getattr(getattr(vq, "config", None), "l2_norm", False):
        table = table / np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), 1e-12)
    return table


def neighbour_count(requested: int, codebook_size: int) -> tuple[int, Optional[str]]:
    """(k, note): the neighbours per token a table of `codebook_size` codewords can hold.

    The one rule for export and runtime alike: a codeword has codebook_size − 1 others, so a
    larger request is clamped to that, with a note saying so (None when nothing changed).
    Small codebooks are legitimate (custom VQs), so this is not an error.
    """
    if requested < 1:
        raise SpecrtError(f"neighbour count must be >= 1, got {requested}")
    if codebook_size < 2:
        raise SpecrtError(f"a {codebook_size}-entry codebook has no neighbours to list")
    if requested < codebook_size:
        return requested, None
    k = codebook_size - 1
    return k, f"{requested} neighbours asked, a {codebook_size}-entry codebook has {k} other codewords: using k={k}"


def codebook_neighbours(codebook: np.ndarray, k: int, chunk_rows: int = 1024) -> np.ndarray:
    """int32 [V, k]: row v lists the k codewords nearest to codeword v, nearest first.

    A token is never its own neighbour (even when another codeword is an exact duplicate,
    the duplicate is listed, v itself is not). The result is deterministic; equal distances
    among the selected neighbours are ordered by token id. Distances are computed in float64 in row chunks, so a 16384-entry
    codebook needs ~130 MB at a time instead of a full V×V matrix.
    """
    codebook = np.asarray(codebook, dtype=np.float64)
    if codebook.ndim != 2:
        raise SpecrtError(f"codebook must be [V, dim], got shape {codebook.shape}")
    vocab = codebook.shape[0]
    if not 1 <= k < vocab:
        raise SpecrtError(f"neighbour count k must be in 1..{vocab - 1} for a {vocab}-entry codebook, got {k}")
    squared_norms = (codebook**2).sum(axis=1)
    table = np.empty((vocab, k), dtype=np.int32)
    for start in range(0, vocab, chunk_rows):
        rows = np.arange(start, min(start + chunk_rows, vocab))
        sq_dist = squared_norms[rows, None] + squared_norms[None, :] - 2.0 * codebook[rows] @ codebook.T
        np.maximum(sq_dist, 0.0, out=sq_dist)
        sq_dist[np.arange(len(rows)), rows] = np.inf  # a token is not its own neighbour
        candidates = np.argpartition(sq_dist, k, axis=1)[:, : k + 1]
        cand_dist = np.take_along_axis(sq_dist, candidates, axis=1)
        order = np.lexsort((candidates, cand_dist), axis=1)  # by distance, then token id
        table[rows] = np.take_along_axis(candidates, order, axis=1)[:, :k]
    return table
