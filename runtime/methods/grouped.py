"""GSD: Grouped Speculative Decoding (So et al., ICCV 2025) on SJD's Jacobi windows.

The window machinery is SJD's (runtime/methods/jacobi.py: the target scores [pending, L drafts], the
drafts come from the previous iteration's own rows, fresh slots start from random tokens); only the
test of a window's drafts differs: GSD's grouped acceptance (runtime/verification/grouped.py), which
accepts x with the odds of its cluster of interchangeable tokens. Relaxed: the images are not samples
of the target's distribution. On the PyTorch backend's device round the same rule runs inside
runtime/rounds/jacobi.py's round.

Parameters and how the paper's defaults scale to a model:
- `window` L = 16: the paper's code drafts 16 tokens per iteration.
- `group` G = 30: the cluster's candidates are the tokens ranked within ±G/2 of x. The paper reports
  G = 25 (COCO) and 50 (Parti) on Lumina-mGPT's 8,192 image tokens; its code takes ±7 (G = 14). G
  counts candidates beside x in the ranking, which the other two tests thin out, so it stays a count
  and is not scaled by the vocabulary (scaled to a 512-token vocabulary it would be below 1: no
  grouping). 30 lies in the paper's range; on the demo G = 60 cost class accuracy, G = 14 saved fewer
  forwards (bench/results/gsd-demo.md).
- `gap` δ = 0.15: the bound on |p(x′) − p(x)|, a probability, the same at any vocabulary size.
- `radius` d = 4: the bound on ‖e(x′) − e(x)‖², in units of the table's nearest-neighbour scale
  (runtime/token_embeddings.py: the median squared distance from a token to its nearest other one),
  because the code's 0.5 is in Lumina-mGPT's embedding units, which mean nothing for another model
  (and its scale there is not published). On the demo's 192-dimensional table d = 4 admits 99% of
  all token pairs and d = 2 half of them (squared distances there span 0 to 5.4 times the scale), so
  at the default the demo's clusters are set by G and δ.
- `theorem2`: report the Cool-SD paper's Theorem-2 estimates per window (expected accepted length,
  TV bound) as the drafted relaxed methods do; f and the resampling Norm([p − q]_+) fit its form.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.decoding import Decoding
from specrt.runtime.methods.base import settings_grid
from specrt.runtime.methods.jacobi import JacobiDecoding, Level
from specrt.runtime.token_embeddings import TokenEmbeddings, missing_embeddings_message
from specrt.runtime.verification.grouped import GroupedRule
from specrt.runtime.verification.theory import theorem2_along_path
from specrt.validation import Bool, Float, Int

MAX_GROUP = 256  # candidates beside x: each costs a gather of its embedding per drafted position
TREE_PARAMS = ("proactive_drafting", "branching", "tree_depth", "tree")  # SJD-PAC's trees: not GSD's


class GroupedDecoding(JacobiDecoding):
    """SJD's Jacobi windows tested with GSD's grouped acceptance (module docstring)."""

    name = "gsd"
    auto_settings = settings_grid(window=(4, 8, 16))  # relaxed (lossless is not declared): --relaxed only
    PARAMS = {**{key: spec for key, spec in JacobiDecoding.PARAMS.items() if key not in TREE_PARAMS},
              "window": Int(16, low=1, symbol="L"),
              "group": Int(30, low=0, high=MAX_GROUP, symbol="G"),
              "gap": Float(0.15, low=0.0, high=1.0, symbol="δ"),
              "radius": Float(4.0, low=0.0, high=1e6, symbol="d"),
              "theorem2": Bool(False)}  # per-window Eq. 7-9 estimates cost f at every token: opt-in
    # proactive drafting's trees are verified with SD's sibling test; GSD runs the chain windows only
    proactive_drafting, branching, tree_depth, tree = False, 4, 3, "spine"
    embeddings: Optional[TokenEmbeddings] = None  # set by the pipeline from the bundle / the target module

    def rule(self, ctx: Optional[Decoding]) -> GroupedRule:
        if self.embeddings is None:
            raise SpecrtError(missing_embeddings_message(self.name))
        return GroupedRule(self.embeddings.table, group=self.group, gap=self.gap,
                           radius=self.radius * self.embeddings.neighbour_scale)

    def generate(self, ctx: Decoding, conditions: Any) -> np.ndarray:
        vocab = ctx.target.spec.vocab_size
        if self.embeddings is not None and self.embeddings.table.shape[0] != vocab:
            raise SpecrtError(f"gsd: the token embedding table has {self.embeddings.table.shape[0]} rows but the "
                              f"target samples {vocab} tokens")
        self._rule = self.rule(ctx)  # one rule (and its scale) for the whole call
        return super().generate(ctx, conditions)

    def _verify_chain_windows(self, ctx: Decoding, p_block: np.ndarray, draws: Any,
                              chains: list[Optional[list[Level]]]) -> dict[int, tuple]:
        verdicts = super()._verify_chain_windows(ctx, p_block, draws, chains)
        if self.theorem2:  # opt-in estimates, image by image, along each window's drafts
            for p, levels in enumerate(chains):
                if levels:
                    estimate = theorem2_along_path(np.asarray(p_block[p], dtype=np.float64),
                                                   [level.q for level in levels],
                                                   [level.candidates[0] for level in levels], self._rule)
                    ctx.stats.theorem2_accepted_length.append(estimate.expected_accepted_length)
                    ctx.stats.theorem2_tv_bound.append(estimate.tv_bound)
        return verdicts
