"""Draft-free Jacobi methods: SJD and SJD-PAC (adaptive continuation + proactive drafting).

The proposal carried between iterations is a list of levels after the pending token: level d
holds the candidate token(s) for depth d and the distribution q they were drawn from. A chain
level has one candidate; a proactive-drafting level has K candidates drawn without replacement,
all children of the first candidate of the level above ("the first path is extended"), so the
window is a tree whose spine is a chain. One iteration:

1. the target scores [pending, all candidates] in one forward with a tree mask;
2. the levels are verified from the top (runtime.verification.verify_siblings: exact rejection
   sampling, sequential without replacement across siblings); the accepted prefix plus the token
   sampled at the first rejection (or a bonus token from P at a leaf) are committed;
3. the next proposal is built from this iteration's own target rows along the spine, which
   are stale past the first rejection: SJD takes fresh drafts from them (q = that row; the
   draws come with the step, made by the sampling head);
   adaptive continuation instead rejection-samples the old draft token against them; proactive
   drafting turns the first D levels into K-candidate levels; slots past the last row start
   from uniform random tokens (q uniform).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.runtime.methods.base import Decoding, OneImageAtATime
from specrt.runtime.verification import draw_without_replacement, verify_position, verify_positions, verify_siblings
from specrt.runtime.window import Window
from specrt.validation import Bool, Int


@dataclass
class Level:
    """Candidates for one depth (first = the spine) and the row q they were drawn from."""

    candidates: list[int]
    q: np.ndarray


def build_window(pending: int, levels: list[Level]) -> tuple[Window, list[list[int]]]:
    """The tree window [pending, level 1..., level 2..., ...] and each level's slot indices."""
    if all(len(level.candidates) == 1 for level in levels):  # SJD and most SJD-PAC steps: a chain
        return Window.chain([pending, *(level.candidates[0] for level in levels)]), \
            [[slot] for slot in range(1, len(levels) + 1)]
    ids, parents, slots = [pending], [-1], []
    parent = 0
    for level in levels:
        first = len(ids)
        slots.append(list(range(first, first + len(level.candidates))))
        ids += level.candidates
        parents += [parent] * len(level.candidates)
        parent = first
    return Window.tree(ids, parents), slots


class JacobiDecoding(OneImageAtATime):
    """SJD with optional adaptive continuation and proactive drafting (SJD-PAC, `003` Alg. 1)."""

    name = "sjd"
    # window: pending token + drafts; branching K, tree_depth D: proactive drafting's tree
    PARAMS = {"window": Int(16, low=2, symbol="L"), "adaptive_continuation": Bool(False),
              "proactive_drafting": Bool(False),
              "branching": Int(4, low=1, symbol="K"), "tree_depth": Int(3, low=0, symbol="D")}

    @property
    def max_window(self) -> int:
        return self.window

    def generate_one(self, ctx: Decoding, class_id: int) -> np.ndarray:
        target = ctx.target
        vocab = target.spec.vocab_size
        uniform = np.full(vocab, 1.0 / vocab)
        tokens = [int(self.start(ctx, target, class_id).draws[0, 0])]
        ctx.stats.record_round(1)
        levels: list[Level] = []
        while len(tokens) < ctx.num_image_tokens:
            levels = self._fill(ctx, levels, ctx.num_image_tokens - len(tokens) - 1, uniform)
            window, slots = build_window(tokens[-1], levels)
            out = ctx.run(target, window)
            p_rows, draws = out.probs[0], out.draws[0]
            with ctx.stats.timing("verification"):
                accepted, path, next_token, rejected = self._verify(ctx, p_rows, draws, levels, slots)
                spine = [0] + [s[0] for s in slots]  # the slot whose row predicts depth d + 1
                levels = self._next_levels(ctx, levels, p_rows, draws, spine, len(accepted), rejected)
            target.commit(path)
            tokens += accepted + [next_token]
            ctx.stats.record_round(len(accepted) + 1)
        return np.asarray(tokens, dtype=np.int64)

    # ---- one iteration's pieces ----------------------------------------------------------------

    def _verify(self, ctx: Decoding, p_rows: np.ndarray, draws: np.ndarray, levels: list[Level],
                slots: list[list[int]]):
        """Walk the levels: (accepted tokens, committed slots, next token, stopped by a rejection?)."""
        accepted, path = [], [0]
        for level, level_slots in zip(levels, slots):
            if len(level.candidates) == 1:  # a chain level: plain rejection sampling (= K of 1)
                kept, token = verify_position(p_rows[path[-1]], level.q, level.candidates[0], ctx.rng)
                index = 0 if kept else None
            else:
                index, token = verify_siblings(p_rows[path[-1]], level.q, level.candidates, ctx.rng)
            if index is None:
                return accepted, path, token, True
            accepted.append(token)
            path.append(level_slots[index])
            if index != 0:  # only the first candidate has children: a leaf, take a bonus token
                break
        return accepted, path, int(draws[path[-1]]), False  # the head's draw from the last row

    def _next_levels(self, ctx: Decoding, levels: list[Level], p_rows: np.ndarray, draws: np.ndarray,
                     spine: list[int], accepted: int, rejected: bool) -> list[Level]:
        """Drafts for the depths after the new pending token (old depth accepted + 1).

        New level j sits at old depth e = accepted + 1 + j; its stale row is that of spine slot
        e − 1, whose draw the head already made (SJD's fresh draft). These rows stay readable
        through the next step (the runner's outputs are double-buffered)."""
        slots = [spine[e - 1] for e in range(accepted + 2, len(spine) + 1)]
        tokens = [int(draws[slot]) for slot in slots]
        if self.adaptive_continuation:  # keep each old draft if its new row accepts it, else resample
            old = [(j, levels[accepted + 1 + j]) for j in range(len(slots)) if accepted + 1 + j < len(levels)]
            if old:
                kept = verify_positions(p_rows[np.asarray([slots[j] for j, _ in old])], [level.q for _, level in old],
                                        [level.candidates[0] for _, level in old], ctx.rng)
                for (j, _), token in zip(old, kept):
                    tokens[j] = token
        return self._proactive([Level([t], p_rows[slot]) for t, slot in zip(tokens, slots)], ctx, rejected)

    def _proactive(self, new: list[Level], ctx: Decoding, rejected: bool) -> list[Level]:
        """Proactive drafting: after a rejection the first D levels get K candidates each."""
        if self.proactive_drafting and rejected:
            for level in new[: self.tree_depth]:
                level.candidates = draw_without_replacement(level.q, self.branching, ctx.rng,
                                                            first=level.candidates[0])
        return new

    def _fill(self, ctx: Decoding, levels: list[Level], max_depth: int, uniform: np.ndarray) -> list[Level]:
        """Cut the proposal to the window budget and the image end; pad with uniform random tokens."""
        budget = self.window - 1
        kept: list[Level] = []
        for level in levels[:max_depth]:
            if budget <= 0:
                break
            if len(level.candidates) > budget:
                level = Level(level.candidates[:budget], level.q)
            kept.append(level)
            budget -= len(level.candidates)
        while budget > 0 and len(kept) < max_depth:
            kept.append(Level([int(ctx.rng.integers(len(uniform)))], uniform))
            budget -= 1
        return kept


class SJDPAC(JacobiDecoding):
    """SJD-PAC defaults: both parts on, K = 4, D = 3, window L = 64."""

    name = "sjd-pac"
    PARAMS = {**JacobiDecoding.PARAMS, "window": Int(64, low=2, symbol="L"), "adaptive_continuation": Bool(True),
              "proactive_drafting": Bool(True)}
