"""Draft-free Jacobi methods: SJD and SJD-PAC (adaptive continuation + proactive drafting).

`window` is the paper's L: the number of drafted tokens verified per target forward (tree nodes
count one each). The target is fed L + 1 tokens: the pending token (sampled last iteration, its
KV not yet computed; its row predicts depth 1) and the L drafts, so Method.max_window = L + 1.

The proposal carried between iterations is a list of levels after the pending token: level d
holds the candidate token(s) for depth d and the distribution q they were drawn from. A chain
level has one candidate; a proactive-drafting level has K candidates drawn without replacement
from its stale row. `003` §4.1 says: "for positions j from i+1 to i+D we sample K candidate
tokens without replacement from p(·|X_{<j}^{t−1}). This forms a K-ary tree of depth D", then
"we extend one of these paths (e.g. the first path, k = 1) as a single proposal chain up to the
full length L". A full K-ary tree of depth 3 has 4 + 16 + 64 = 84 nodes, more than L = 64, while
the paper keeps "the total number of verified tokens per step" fixed at L; so by default
(tree="spine") the K candidates of depth d are children of the first candidate of depth d − 1
only: K siblings per depth, K·D tree nodes, the first path extended as the chain.
tree="full" builds the full K-ary tree instead (every node of depths < D has the next depth's K
candidates as children, the same K tokens under each, drawn once from that depth's row) and
needs K + K² + … + K^D ≤ L. One iteration:

1. the target scores [pending, all candidates] in one forward with a tree mask;
2. the levels are verified from the top (runtime.verification.siblings.verify_siblings: exact rejection
   sampling, sequential without replacement across siblings); the accepted prefix plus the token
   sampled at the first rejection (or a bonus token from P at a leaf) are committed;
3. the next proposal is built from this iteration's own target rows along the accepted path
   continued through first children (the spine where the path ends in a leaf), rows that are
   stale past the first rejection, coupled to the last drafts by `coupling`
   (runtime.verification.coupling): independent (SJD) takes fresh drafts from them (q = that row;
   the draws come with the step, made by the sampling head); maximal (SJD-PAC's adaptive
   continuation) rejection-samples the old draft token against them (the kept or resampled token
   is a draw from the new row, so it is candidate 1 of a proactive level); gumbel takes the
   Gumbel-max draw argmax(log row + g) with the token index's fixed noise g;
   proactive drafting turns the first D levels into K-candidate levels; slots past the last
   row start from uniform random tokens (q uniform; under gumbel coupling the uniform row's
   Gumbel-max draw).

Random numbers are counter uniforms keyed as the device round keys them (runtime.decoding): a
slot's draft by the round's DRAFT uniform at its token index (the target's draws at every slot),
a fresh slot's token by the FRESH uniform of the round that made the window, the tests by TEST
(part k: sibling k), the token after the accepted prefix by NEXT, adaptive continuation's re-tests
by RETEST and RESAMPLE, proactive drafting's candidate k by CANDIDATE part k; Gumbel coupling's
noise by NOISE, the same in every round.

On the PyTorch backend's device round (runtime/rounds) SJD, and SJD-PAC (tree="spine"), run whole
on the device instead of this loop: see the pipeline's `loop`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.conditions import Conditions
from specrt.runtime.counter_random import CANDIDATE, DRAFT, FRESH, NEXT, RESAMPLE, RETEST, TEST
from specrt.runtime.decoding import Decoding
from specrt.runtime.methods.base import Batched, Method, settings_grid
from specrt.runtime.verification.chains import verify_chains
from specrt.runtime.verification.positions import verify_position, verify_positions
from specrt.runtime.verification.rules import VANILLA, AcceptanceRule
from specrt.runtime.verification.siblings import draw_without_replacement, verify_siblings
from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.coupling import COUPLINGS, host_gumbel_drafts
from specrt.runtime.verification.transport import host_rows, rows_by_position
from specrt.runtime.window import Window
from specrt.validation import Bool, Choice, Int

TREES = ("spine", "full")


@dataclass(slots=True)
class Level:
    """Candidates for one depth (first = the spine), the row q they were drawn from, and whether
    every candidate has the next level's candidates as children (full tree) or only the first."""

    candidates: list[int]
    q: np.ndarray
    fanout: bool = False


Children = Optional[list[dict[int, list[int]]]]  # per level: parent slot -> its candidates' slots; None: a chain


def build_window(pending: int, levels: list[Level]) -> tuple[Window, Children]:
    """The tree window [pending, level 1..., level 2..., ...] and, per level, the slots of its
    candidates under each parent slot that has children (a parent missing there is a leaf);
    None for a chain (level d's one candidate at slot d + 1, under slot d): SJD's windows and
    most of SJD-PAC's, whose per-level maps would cost more than the rest of the round's host work."""
    if all(len(level.candidates) == 1 for level in levels):
        return Window.chain([pending, *(level.candidates[0] for level in levels)]), None
    ids, parents, children = [pending], [-1], []
    expanding = [0]  # the slots whose children the next level holds; the first path's comes first
    for level in levels:
        kids = {}
        for parent in expanding:
            kids[parent] = list(range(len(ids), len(ids) + len(level.candidates)))
            ids += level.candidates
            parents += [parent] * len(level.candidates)
        children.append(kids)
        expanding = [slot for slots in kids.values() for slot in slots] if level.fanout else [kids[expanding[0]][0]]
    return Window.tree(ids, parents), children


def level_slots(children: Children, depth: int, parent: int) -> Optional[list[int]]:
    """The slots of level `depth`'s candidates under `parent` (None: `parent` is a leaf there)."""
    if children is None:
        return [depth + 1] if parent == depth else None
    return children[depth].get(parent)


class JacobiDecoding(Method):
    """SJD with optional adaptive continuation and proactive drafting (SJD-PAC, `003` Alg. 1)."""

    name = "sjd"
    lossless = True
    # the best window follows t(W) on the device; every coupling is exact, so each competes at each window
    auto_settings = settings_grid(window=(2, 4, 8, 16, 32), coupling=COUPLINGS)
    # window L: drafted tokens verified per step (the target sees L + 1 with the pending token);
    # branching K, tree_depth D, tree spine | full: proactive drafting's tree (module docstring);
    # coupling: how a position's next draft follows its last (runtime.verification.coupling);
    # adaptive_continuation: SJD-PAC's name for coupling maximal (true) or independent (false)
    PARAMS = {"window": Int(16, low=1, symbol="L"), "coupling": Choice("independent", choices=COUPLINGS),
              "adaptive_continuation": Bool(None, optional=True), "proactive_drafting": Bool(False),
              "branching": Int(4, low=1, symbol="K"), "tree_depth": Int(3, low=0, symbol="D"),
              "tree": Choice("spine", choices=TREES)}

    def __init__(self, **params: Any):
        if params.get("adaptive_continuation") is not None and "coupling" in params:
            raise SpecrtError(f"{self.name}: give coupling or adaptive_continuation (its older name: true is "
                              "coupling=maximal, false coupling=independent), not both")
        super().__init__(**params)

    def validate(self) -> None:
        super().validate()
        if self.adaptive_continuation is not None:
            self.coupling = "maximal" if self.adaptive_continuation else "independent"
        self.adaptive_continuation = self.coupling == "maximal"
        if self.tree != "full" or not self.proactive_drafting:
            return
        nodes, level = 0, 1
        for _ in range(self.tree_depth):  # K + K² + … + K^D, stopping as soon as it exceeds L
            level *= self.branching
            nodes += level
            if nodes > self.window:
                raise SpecrtError(f"{self.name} tree=full: a {self.branching}-ary tree of depth {self.tree_depth} "
                                  f"has more than window (L) = {self.window} nodes; raise window or use tree=spine")

    @property
    def max_window(self) -> int:
        return self.window + 1  # the pending token + L drafts

    def rule(self, ctx: Optional[Decoding]) -> AcceptanceRule:
        """The test of a chain window's drafts: SD's (lossless); GSD's grouped test in its subclass."""
        return VANILLA

    def generate(self, ctx: Decoding, conditions: Conditions) -> np.ndarray:
        """Every unfinished image runs one Jacobi iteration per target step, its own proposal
        and tree in its own window; each verifies, commits and drafts on with its own counter uniforms."""
        target, total = ctx.target, ctx.num_image_tokens
        uniform = fresh_proposal(target.spec.vocab_size, ctx.grammar)
        target.truncate(0)
        tokens = [[int(t)] for t in ctx.prefill(target, conditions).draws[:, 0]]
        ctx.stats.record_round(1, len(tokens))
        levels: list[list[Level]] = [[] for _ in tokens]
        batch = Batched(len(tokens))
        while batch.drop(ctx, [len(t) == total for t in tokens]):
            self.jacobi_round(ctx, tokens, levels, list(batch.images), uniform)
        return np.asarray(tokens, dtype=np.int64)

    def jacobi_round(self, ctx: Decoding, tokens: list[list[int]], levels: list[list[Level]], images: list[int],
                     uniform: np.ndarray) -> None:
        """One Jacobi iteration of every image in `images` (image images[p] at batch position p): its window
        filled from its levels, scored, verified and committed; its accepted tokens and next one join
        tokens[images[p]]. A complete image sits the round out with no window (generate's finished images,
        and the free slots of in-flight batching, runtime/scheduling)."""
        target, total = ctx.target, ctx.num_image_tokens
        ctx.start_round([len(tokens[i]) if len(tokens[i]) < total else None for i in images])
        windows, trees = [], []
        for p, i in enumerate(images):
            if len(tokens[i]) == total:
                windows.append(None)
                trees.append(None)
                continue
            levels[i] = self._fill(ctx.image(p), levels[i], total - len(tokens[i]) - 1, uniform, len(tokens[i]))
            window, children = build_window(tokens[i][-1], levels[i])
            windows.append(window)
            trees.append(children)
        out = ctx.run(target, windows, slot_uniforms(ctx, windows))
        paths: list[Optional[list[int]]] = []
        with ctx.stats.timing("verification"):  # chain windows together, then every image's iteration
            rows = host_rows(out.probs)  # device rows: the step's window read in one transfer
            verdicts = self._verify_chain_windows(ctx, rows, out.draws, [
                levels[i] if trees[p] is None and windows[p] is not None else None for p, i in enumerate(images)])
            done = {p: self._iteration(ctx.image(p), rows[p], out.draws[p], levels[i], trees[p], verdicts.get(p))
                    for p, i in enumerate(images) if windows[p] is not None}
        for p, i in enumerate(images):
            if p not in done:
                paths.append(None)
                continue
            accepted, path, next_token, levels[i] = done[p]
            paths.append(path)
            tokens[i] += accepted + [next_token]
            ctx.stats.record_round(len(accepted) + 1)
        target.commit(paths)

    # ---- one iteration's pieces (on host rows) ---------------------------------------------------

    def _verify_chain_windows(self, ctx: Decoding, p_block: np.ndarray, draws: Any,
                              chains: list[Optional[list[Level]]]) -> dict[int, tuple]:
        """The chain windows of a step (chains[p]: image p's levels, None for a tree window or no
        window), verified together as a batch of drafted chains (runtime.verification.chains.verify_chains
        with SD's rule: a level's one candidate tested against its stale row q, the first rejection
        resampled from Norm([P − q]_+), the bonus drawn from the row after a whole chain, both with the
        round's NEXT uniform): array operations over the batch. Per image p: _verify's verdict
        (accepted tokens, committed slots, next token, stopped by a rejection?)."""
        drafts = [[level.candidates[0] for level in levels] if levels is not None else [] for levels in chains]
        q_block = rows_by_position([[level.q for level in levels] if levels is not None else [] for levels in chains])
        if not any(levels is not None for levels in chains):
            return {}
        longest = max(len(chain) for chain in drafts)
        next_uniforms = ctx.uniforms(0, NEXT)
        lengths = np.array([len(chain) for chain in drafts], dtype=np.int64)
        bonus = np.zeros((len(drafts), longest + 1), dtype=np.int64)  # the token after each whole chain
        bonus[np.arange(len(drafts)), lengths] = inverse_cdf(np.asarray(p_block[np.arange(len(drafts)), lengths]),
                                                             next_uniforms)
        outcomes = verify_chains(p_block, q_block, drafts, self.rule(ctx), ctx.uniforms(np.arange(longest)[None], TEST),
                                 next_uniforms, bonus)
        verdicts = {}
        for p, (chain, accepted, token) in enumerate(zip(drafts, outcomes.accepted_lengths, outcomes.next_tokens)):
            if chains[p] is not None:
                verdicts[p] = chain[:accepted], list(range(accepted + 1)), token, accepted < len(chain)
        return verdicts

    def _iteration(self, ctx: Decoding, p_rows: np.ndarray, draws: Any, levels: list[Level], children: Children,
                   verdict: Optional[tuple] = None) -> tuple[list[int], list[int], int, list[Level]]:
        """One image's verification (`verdict` where its chain window was verified with the batch's)
        and next proposal: (accepted tokens, committed slots, next token, the next levels)."""
        if verdict is None:
            verdict = self._verify(ctx, p_rows, draws, levels, children)
        accepted, path, next_token, rejected = verdict
        route = row_route(path, children, len(levels))
        return accepted, path, next_token, self._next_levels(ctx, levels, p_rows, draws, route, len(accepted), rejected)

    def _verify(self, ctx: Decoding, p_rows: np.ndarray, draws: Any, levels: list[Level],
                children: Children) -> tuple[list[int], list[int], int, bool]:
        """Walk the levels: (accepted tokens, committed slots, next token, stopped by a rejection?).
        Depth d's candidate k is tested with the round's TEST uniform of part k at index n − 1 + d; the
        token after the walk (a rejection's residual, or the bonus from the last row) with NEXT."""
        key, accepted, path = ctx.key, [], [0]
        next_uniform = key.uniform(0, NEXT)
        for depth, level in enumerate(levels):
            slots = level_slots(children, depth, path[-1])
            if slots is None:  # the accepted node is a leaf (not on an extended path): take a bonus token
                break
            if len(level.candidates) == 1:  # a chain level: plain rejection sampling (= K of 1)
                kept, token = verify_position(p_rows[path[-1]], level.q, level.candidates[0], key.uniform(depth, TEST),
                                              next_uniform)
                index = 0 if kept else None
            else:
                coins = [key.uniform(depth, TEST, k) for k in range(len(level.candidates))]
                index, token = verify_siblings(p_rows[path[-1]], level.q, level.candidates, coins, next_uniform)
            if index is None:
                return accepted, path, token, True
            accepted.append(token)
            path.append(slots[index])
        return accepted, path, int(inverse_cdf(np.asarray(p_rows[path[-1]]), next_uniform)), False

    def _next_levels(self, ctx: Decoding, levels: list[Level], p_rows: np.ndarray, draws: Any,
                     route: list[int], accepted: int, rejected: bool) -> list[Level]:
        """Drafts for the depths after the new pending token (old depth accepted + 1).

        New level j sits at old depth e = accepted + 1 + j (token index n + e); its stale row is that
        of the route's slot at depth e − 1 (row_route), whose draw the head already made with the
        round's DRAFT uniform at that index (SJD's fresh draft).
        These rows stay readable through the next step (the runner's outputs are double-buffered;
        rows read from a device are the loop's own)."""
        slots = route[accepted + 1:]
        if self.coupling == "gumbel":  # each row's Gumbel-max draw with its token index's noise
            tokens = host_gumbel_drafts(ctx.key.key, ctx.key.length + accepted + 1 + np.arange(len(slots)),
                                        p_rows[slots]).tolist()
        else:
            tokens = draws[slots].tolist()
        if self.coupling == "maximal":  # keep each old draft if its new row accepts it, else resample
            old = [(j, levels[accepted + 1 + j]) for j in range(len(slots)) if accepted + 1 + j < len(levels)]
            if old:
                at, q_rows = np.asarray([slots[j] for j, _ in old]), [level.q for _, level in old]
                drafts = [level.candidates[0] for _, level in old]
                offsets = np.array([[accepted + 1 + j for j, _ in old]])
                kept = verify_positions(p_rows[at], q_rows, drafts, ctx.uniforms(offsets, RETEST)[0],
                                        ctx.uniforms(offsets, RESAMPLE)[0])
                for (j, _), token in zip(old, kept):
                    tokens[j] = token
        every = list(p_rows)  # views made in one C loop
        rows = [every[slot] for slot in slots]
        return self._proactive([Level([t], row) for t, row in zip(tokens, rows)], ctx, rejected, accepted + 1)

    def _proactive(self, new: list[Level], ctx: Decoding, rejected: bool, offset: int) -> list[Level]:
        """Proactive drafting: after a rejection the first D levels get K candidates each, drawn
        without replacement from the level's row (new level j at index n + offset + j; candidate k
        with the round's CANDIDATE uniform of part k there); the level's own draft (SJD's draw or
        adaptive continuation's token, both draws from that row) is candidate 1. A full tree fans
        out every level but the last tree level, whose first candidate carries the chain."""
        if self.proactive_drafting and rejected:
            tree = new[: self.tree_depth]
            key = ctx.key
            for depth, level in enumerate(tree, start=1):
                uniforms = [key.uniform(offset + depth - 1, CANDIDATE, k) if k else 0.0 for k in range(self.branching)]
                level.candidates = draw_without_replacement(level.q, self.branching, uniforms,
                                                            first=level.candidates[0])
                level.fanout = self.tree == "full" and depth < len(tree)
        return new

    def _fill(self, ctx: Decoding, levels: list[Level], max_depth: int, uniform: np.ndarray,
              first: int = 0) -> list[Level]:
        """Cut the proposal to the window budget (L tree nodes) and the image end; pad the chain
        with uniform random tokens (level d drafts stream token first + d: under an image grammar a
        forced token is drafted as itself, a point mass, and a sampled one from the codes alone).

        A tree window's first D levels take the slots a whole tree would (K a level on a spine, K^d
        at depth d of a full tree), whatever they hold (fewer candidates where a row ran out of mass
        or a depth had no row): the device round's fixed window layout (runtime/rounds/proactive.py),
        so both verify the same levels and draft the same tokens."""
        budget, width = self.window, 1  # width: the parents the next level hangs under
        reserved = self._reserved_slots(levels)
        kept: list[Level] = []
        for level in levels[:max_depth]:
            if budget < width:
                break
            if width * len(level.candidates) > budget:
                level = Level(level.candidates[: budget // width], level.q)
            budget -= reserved[len(kept)] if len(kept) < len(reserved) else width * len(level.candidates)
            kept.append(level)
            width = width * len(level.candidates) if level.fanout else 1
        while budget > 0 and len(kept) < max_depth:
            budget -= reserved[len(kept)] if len(kept) < len(reserved) else 1
            kept.append(self._random_level(ctx, uniform, first + len(kept)))
        return kept

    def _reserved_slots(self, levels: list[Level]) -> list[int]:
        """The window slots each of the first D levels takes in a tree window (one whose first D levels
        hold more than one candidate somewhere) where the whole tree fits the window, as the device
        round's layout has them; [] otherwise (every level takes what it holds)."""
        full = self.tree == "full"
        slots = [self.branching ** depth if full else self.branching for depth in range(1, self.tree_depth + 1)]
        if not self.proactive_drafting or sum(slots) > self.window or \
                all(len(level.candidates) == 1 for level in levels[: self.tree_depth]):
            return []
        return slots

    def _random_level(self, ctx: Decoding, uniform: np.ndarray, index: int) -> Level:
        """A fresh slot's draft for stream token `index`: a draw from `uniform` (fresh_proposal) with
        the FRESH uniform of the round that made the window (the round before; round 0 for the first
        window), as the device round draws it — under gumbel coupling its Gumbel-max draw with the
        index's noise —, or the token the grammar (ctx.grammar) forces there, as a point mass."""
        forced = -1 if ctx.grammar is None else int(ctx.grammar.forced()[index])
        if forced >= 0:
            point = np.zeros(len(uniform))
            point[forced] = 1.0
            return Level([forced], point)
        support = len(uniform) if ctx.grammar is None else ctx.grammar.image_vocab  # uniform over its first entries
        key = ctx.key
        if self.coupling == "gumbel":
            return Level([int(host_gumbel_drafts(key.key, index, uniform))], uniform)
        fresh = key.uniform(index - key.length, FRESH, earlier=True)
        return Level([min(int(fresh * support), support - 1)], uniform)


def slot_uniforms(ctx: Decoding, windows: list[Optional[Window]]) -> np.ndarray:
    """[I, W]: each window slot drawn with the round's DRAFT uniform at the token index it predicts
    (n + its depth): the draw that drafts that index in the next window, as the device round's."""
    width = max((len(window) for window in windows if window is not None), default=1)
    depths = np.zeros((len(windows), width), dtype=np.int64)
    for p, window in enumerate(windows):
        if window is not None:
            depths[p, :len(window)] = window.depths()
    return ctx.uniforms(depths, DRAFT)


def fresh_proposal(vocab: int, grammar: Any = None) -> np.ndarray:
    """The q of SJD's fresh window slots: uniform over the vocabulary, or over the codes alone under
    an image grammar (a structural token is never sampled there; where it is forced, _random_level)."""
    support = vocab if grammar is None else grammar.image_vocab
    row = np.zeros(vocab)
    row[:support] = 1.0 / support
    return row


def row_route(path: list[int], children: Children, depth: int) -> list[int]:
    """One slot per depth 0..D (`depth` = D, the window's levels) of the window whose rows draft
    the next proposal: the committed path, then first children; where a node has no children (a
    leaf sibling), the first path's slot at that depth (the rows there are as stale as any other,
    and lossless as drafts)."""
    if children is None:  # a chain: slot d at depth d, the committed path its first slots
        return list(range(depth + 1))
    route = list(path)
    spine = [0]
    for kids in children:
        spine.append(kids[spine[-1]][0])
    while len(route) < len(spine):
        kids = children[len(route) - 1].get(route[-1])
        route.append(kids[0] if kids else spine[len(route)])
    return route


class SJDPAC(JacobiDecoding):
    """SJD-PAC defaults, the paper's: both parts on, K = 4, D = 3, L = 64 verified tokens per step."""

    name = "sjd-pac"
    lossless = True
    # continuation is what SJD-PAC adds: its maximal default and Gumbel drafts, no independent ones
    auto_settings = settings_grid(window=(8, 16, 32, 64), coupling=("maximal", "gumbel"))
    # adaptive continuation is maximal coupling: on by default, as the paper's
    PARAMS = {**JacobiDecoding.PARAMS, "window": Int(64, low=1, symbol="L"),
              "coupling": Choice("maximal", choices=COUPLINGS), "proactive_drafting": Bool(True)}
