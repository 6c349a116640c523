"""The target's token embeddings, for GSD's clusters (runtime/verification/grouped.py): one row per token
of the target's sampling vocabulary, exactly as the target embeds that token as an input.

Why shipped: GSD keeps a token in x's cluster only where their embeddings lie within squared L2
distance d, a test made per drafted position against whichever tokens rank next to x, so the whole
table is needed at run time (a precomputed neighbour list, as LANTERN's, cannot know the ranking). The
export writes it beside the graphs as a plain float32 .npy (manifest entry `token_embeddings`); the
PyTorch pipelines read it from their models.

Why a scale: GSD's d (0.5 in its code) is in the units of Lumina-mGPT's embedding table, which says
nothing about another model's. The method gives d relative to `neighbour_scale`, the median squared
distance from a token to its nearest other token, so d = 1 keeps about half the tokens' nearest
neighbours, whatever the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError

EMBEDDINGS_FILE = "token_embeddings.npy"
SCALE_SAMPLE = 512  # tokens whose nearest-neighbour distance sets the scale (evenly spaced ids)


@dataclass
class TokenEmbeddings:
    """A [V, D] float32 table and its nearest-neighbour scale (computed once, when first asked)."""

    table: np.ndarray
    _scale: Optional[float] = field(default=None, init=False, repr=False)

    @property
    def neighbour_scale(self) -> float:
        """The median, over up to SCALE_SAMPLE evenly spaced tokens, of the squared L2 distance to
        the nearest other token (> 0: duplicate rows are skipped; 1.0 for a table of one distinct row)."""
        if self._scale is None:
            self._scale = neighbour_scale(self.table)
        return self._scale


def neighbour_scale(table: np.ndarray, sample: int = SCALE_SAMPLE) -> float:
    """TokenEmbeddings.neighbour_scale for a table [V, D]: sample · V · D operations (≈ 10 GFLOP for a
    16384 × 1280 table), once per pipeline."""
    table = np.asarray(table, dtype=np.float64)
    rows = np.unique(np.linspace(0, len(table) - 1, min(sample, len(table))).astype(np.int64))
    squared = (table ** 2).sum(axis=1)
    distances = squared[rows, None] + squared[None, :] - 2.0 * table[rows] @ table.T
    distances[np.arange(len(rows)), rows] = np.inf  # a token is not its own neighbour
    distances[distances <= 1e-12 * max(float(squared.max()), 1e-30)] = np.inf  # nor a duplicate row
    nearest = distances.min(axis=1)
    nearest = nearest[np.isfinite(nearest)]
    return float(np.median(nearest)) if nearest.size else 1.0


def embedding_table_of(module: Any) -> Optional[np.ndarray]:
    """A PyTorch target's token embeddings over its sampling vocabulary, float32 [V, D], or None where
    it has none: a unified model's input embedding of each head index (`embed_stream`: the image
    tokens' rows of the LM's table, Janus's generation embedding through its aligner), a LlamaGen GPT's
    `tok_embeddings`."""
    import torch

    with torch.no_grad():
        if callable(getattr(module, "embed_stream", None)):
            vocab = int(module.config.grammar.vocab_size)
            device = next(module.parameters()).device
            table = module.embed_stream(torch.arange(vocab, device=device)[None])[0]
        elif hasattr(module, "tok_embeddings"):
            table = module.tok_embeddings.weight
        else:
            return None
        return table.detach().float().cpu().numpy()


def load_token_embeddings(raw: Any, root: Any, vocab_size: int) -> Optional[np.ndarray]:
    """The bundle's table, checked: float32 [vocab, dim] as the manifest entry `raw` says ({"file",
    "dim"}, files under `root`); None when the bundle has none (exported before GSD)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("file"), str):
        raise SpecrtError(f"manifest: token_embeddings must be an object with a file name, got {raw!r:.60}")
    try:
        table = np.load(root / raw["file"], allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise SpecrtError(f"bundle: cannot read {raw['file']} as a .npy array ({type(exc).__name__})") from None
    dim = validation.integer("manifest token_embeddings.dim", raw.get("dim", table.shape[-1] if table.ndim else 0),
                             low=1, strings=False)
    if table.dtype != np.float32 or table.shape != (vocab_size, dim):
        raise SpecrtError(f"bundle: {raw['file']} is {table.dtype} {list(table.shape)} but the manifest needs float32 "
                          f"[{vocab_size}, {dim}] (vocab_size, token_embeddings.dim)")
    if not np.isfinite(table).all():
        raise SpecrtError(f"bundle: {raw['file']} holds non-finite numbers")
    return table


def missing_embeddings_message(method: str) -> str:
    """The one line a method that needs the table gives where a pipeline has none."""
    return (f"{method} needs the target's token embeddings ({EMBEDDINGS_FILE}), which this bundle lacks: "
            "it was exported by an older specrt; re-export it with `specrt export`")
