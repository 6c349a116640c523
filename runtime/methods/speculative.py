"""Draft-then-verify methods: SD, Cool-SD (and UniformRSD), LANTERN.

One round (Cool-SD Alg. 1): the draft model proposes L tokens autoregressively, the target
scores [pending, x̃_1..x̃_L] in one forward, runtime.verification accepts a prefix and samples
one more token. The three methods differ only in the AcceptanceRule they verify with.
`tree` = static | dynamic drafts a token tree instead of a chain (runtime.methods.tree_loop):
`static_tree` names the static shape (or a `specrt plan-tree` plan file), `total_tokens`, `depth` and `tree_top_k` size the dynamic
one (tree_top_k, not top_k: that is the sampling filter's name); draft_len is the chain's.
`fused_drafting` (default true) drafts a round's chain or tree in one draft call where the
draft's runner can (runtime/chain.py); false drafts one pass per position or depth, the
reference those calls reproduce token for token, kept selectable so a device can be measured
both ways in one `specrt bench` run. On the PyTorch backend's device round (runtime/rounds) the
whole round runs on the device instead of this loop: see the pipeline's `loop`.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.runtime.conditions import Conditions
from specrt.runtime.counter_random import DRAFT, NEXT, TEST
from specrt.runtime.decoding import Decoding
from specrt.runtime.drafting import finish_round, make_drafter
from specrt.runtime.methods.base import Batched, Method, settings_grid
from specrt.runtime.methods.tree_loop import generate_trees
from specrt.runtime.model_drafter import ModelDrafter
from specrt.runtime.runner import StepOutput
from specrt.runtime.sampling import needs_restriction
from specrt.runtime.tree import DEFAULT_GROWTH, DEFAULT_STATIC_TREE, TREES, StaticTreeParam, static_shape
from specrt.runtime.verification.chains import ChainOutcomes, verify_chains
from specrt.runtime.verification.formulas import SCHEDULES, relaxation_schedule
from specrt.runtime.verification.rules import AcceptanceRule, CoolRule, LanternRule, VanillaRule
from specrt.runtime.verification.theory import theorem2_along_path
from specrt.runtime.verification.transport import by_position, rows_by_position, stack_rows, take
from specrt.runtime.window import chains
from specrt.validation import Bool, Choice, Float, Int

MAX_DECAY = 10.0


class DraftThenVerify(Method):
    """Speculative decoding with a draft model; subclasses choose the acceptance rule.

    Chains (tree=chain): the whole batch runs each round together: up to L draft steps (an
    image whose own draft is shorter, near its end, sits the extra steps out with an empty
    window), one target step over every image's [pending, drafts], then one verification of all
    chains as array operations (runtime.verification.chains.verify_chains; each image with its own
    counter uniforms), and each image commits its own accepted prefix, driving an independent draft
    model's runner directly. Trees (runtime.methods.tree_loop), and chains from any other Drafter
    (runtime.drafter: an EAGLE head), go through the Drafter protocol, batched the same way.
    """

    needs_draft = True
    # tree chain | static | dynamic; static_tree: the static shape; dynamic (EAGLE-2): total_tokens
    # drafts kept, depth levels, tree_top_k children per expanded node and nodes expanded per level
    PARAMS = {"draft_len": Int(4, low=1, symbol="L"), "tree": Choice("chain", choices=TREES),
              "static_tree": StaticTreeParam(DEFAULT_STATIC_TREE),  # a STATIC_TREES name or a plan file
              "total_tokens": Int(63, low=1), "depth": Int(DEFAULT_GROWTH[0], low=1),
              "tree_top_k": Int(DEFAULT_GROWTH[1], low=1, symbol="top_k"), "fused_drafting": Bool(True)}
    theorem2 = False  # relaxed methods: report Theorem-2 estimates per round (Stats)

    def validate(self) -> None:
        if self.tree != "chain" and self.theorem2:
            raise SpecrtError(f"{self.name} theorem2 estimates follow one drafted chain: use tree=chain with theorem2")

    @property
    def max_window(self) -> int:
        """Tokens per target pass: the pending token and the drafts (every node of a tree)."""
        if self.tree == "static":
            return static_shape(self.static_tree).size + 1
        if self.tree == "dynamic":
            return self.total_tokens + 1
        return self.draft_len + 1

    @property
    def positions(self) -> int:
        """Draft positions on the longest drafted path (Cool-SD's L): draft_len, or the tree's depth."""
        if self.tree == "static":
            return static_shape(self.static_tree).depth
        return self.depth if self.tree == "dynamic" else self.draft_len

    def rule(self, ctx: Decoding) -> AcceptanceRule:
        return VanillaRule()

    def generate(self, ctx: Decoding, conditions: Conditions) -> np.ndarray:
        if self.tree != "chain":  # tree drafting: runtime.methods.tree_loop
            return generate_trees(self, ctx, conditions)
        if type(make_drafter(ctx)) is not ModelDrafter:  # a drafter this loop does not drive (an EAGLE head)
            return self._generate_chain_drafted(ctx, conditions)
        target, draft, total = ctx.target, ctx.draft, ctx.num_image_tokens
        rule = self.rule(ctx)
        target.truncate(0)
        draft.truncate(0)
        tokens = [[int(t)] for t in ctx.prefill(target, conditions).draws[:, 0]]
        ctx.prefill(draft, conditions)
        ctx.stats.record_round(1, len(tokens))
        batch = Batched(len(tokens))
        while batch.drop(ctx, [len(t) == total for t in tokens]):
            self.chain_round(ctx, tokens, list(batch.images), rule)
        return np.asarray(tokens, dtype=np.int64)

    def chain_round(self, ctx: Decoding, tokens: list[list[int]], images: list[int], rule: AcceptanceRule) -> None:
        """One round of an independent draft's chains: image images[p] at batch position p drafts,
        is scored and verified, and its accepted tokens and next one join tokens[images[p]]; an
        image whose tokens are complete sits the round out with no window (generate's finished
        images, and the free slots of in-flight batching, runtime/scheduling)."""
        target, draft, cond_len, total = ctx.target, ctx.draft, ctx.target.spec.cond_len, ctx.num_image_tokens
        draft_lens = [min(self.draft_len, total - len(tokens[i]) - 1) for i in images]  # 0 or less: finished
        ctx.start_round([len(tokens[i]) if length >= 0 else None for i, length in zip(images, draft_lens)])
        drafts, q_block = self._draft(ctx, [tokens[i] for i in images], draft_lens)
        scored = self._score(ctx, chains([[tokens[i][-1], *drafts[p]] if draft_lens[p] >= 0 else None
                                          for p, i in enumerate(images)]))
        verified = [length >= 0 for length in draft_lens]  # the others finished: no window, no drafts
        outcomes = self._verify(ctx, scored, q_block, drafts, rule, verified)
        commits: list[Optional[range]] = []
        for p, (i, accepted, token) in enumerate(zip(images, outcomes.accepted_lengths, outcomes.next_tokens)):
            commits.append(range(accepted + 1) if verified[p] else None)
            if verified[p]:
                tokens[i] += drafts[p][:accepted] + [token]
                ctx.stats.record_round(accepted + 1)
        target.commit(commits)
        draft.truncate([cond_len + len(tokens[i]) - 1 for i in images])

    def _draft(self, ctx: Decoding, sequences: list[list[int]], draft_lens: list[int]) -> tuple[list[list[int]], Any]:
        """Each image's drafts after its committed sequence (sequences[p], pending token last; up
        to draft_lens[p] of them, none where that is 0 or less) and the rows they were drawn
        from as verify_chains' q_block [L, images, V] (None: no drafts). The draft catches up on
        the tokens it has not cached; its cache then holds them and every draft but the last.

        One call where the draft runner draws a whole chain (runner.chain, a draft_chain graph or
        the PyTorch chain module) and the head's rows are the sampling distribution; else one
        step per draft position. The same drafts either way."""
        draft, cond_len, longest = ctx.draft, ctx.draft.spec.cond_len, max(draft_lens, default=0)
        if longest <= 0:
            return [[] for _ in sequences], None
        if self.fused_drafting and draft.can_chain(self.draft_len) and not needs_restriction(ctx.sampling):
            feeds = [sequence[draft.lengths[p] - cond_len:] if draft_lens[p] > 0 else None
                     for p, sequence in enumerate(sequences)]
            out = ctx.run_chain(draft, chains(feeds), draft_lens, self.draft_len)
            draft.commit_chain([len(f) if f is not None else 0 for f in feeds], draft_lens)
            drafts = [row[:max(n, 0)] for row, n in zip(out.draws.tolist(), draft_lens)]
            return drafts, by_position(out.probs, longest)  # valid until the draft's second next call
        drafts: list[list[int]] = [[] for _ in sequences]
        q_steps = []  # per draft position, the rows [images, V] the batch's drafts were drawn from
        for step in range(longest):
            # each drafting image catches its draft up on every token it has not cached (pending + drafts)
            feeds = [(sequence + drafts[p])[draft.lengths[p] - cond_len:] if step < draft_lens[p] else None
                     for p, sequence in enumerate(sequences)]
            out = ctx.run(draft, chains(feeds), ctx.uniforms(step, DRAFT))  # draft step + 1 at index n + step
            draft.commit([range(len(f)) if f is not None else None for f in feeds])
            index = np.arange(len(sequences)), np.array([len(f) - 1 if f is not None else 0 for f in feeds])
            q_steps.append(take(out.probs, index))  # one gather, a copy: the buffer is reused two steps on
            for chain, feed, token in zip(drafts, feeds, out.draws[index].tolist()):
                if feed is not None:
                    chain.append(int(token))
        return drafts, stack_rows(q_steps)

    def _generate_chain_drafted(self, ctx: Decoding, conditions: Conditions) -> np.ndarray:
        """Chain rounds through the Drafter protocol (runtime.drafter), for drafters the loop above
        does not drive, the whole batch at once; the same tokens as that loop for an independent draft."""
        target, rule, total = ctx.target, self.rule(ctx), ctx.num_image_tokens
        target.truncate(0)
        first = ctx.prefill(target, conditions)
        tokens = [[int(t)] for t in first.draws[:, 0]]
        drafter = make_drafter(ctx, self.fused_drafting)
        drafter.start(ctx, conditions, [t[0] for t in tokens], first)
        ctx.stats.record_round(1, len(tokens))
        batch = Batched(len(tokens))
        while batch.drop(ctx, [len(t) == total for t in tokens], drafter):
            images = list(batch.images)
            draft_lens = [min(self.draft_len, total - len(tokens[i]) - 1) for i in images]  # < 0: finished
            ctx.start_round([len(tokens[i]) if length >= 0 else None for i, length in zip(images, draft_lens)])
            drafts, q_rows = drafter.propose_chain(ctx, [max(n, 0) for n in draft_lens])
            scored = self._score(ctx, chains([[tokens[i][-1], *drafts[p]] if draft_lens[p] >= 0 else None
                                              for p, i in enumerate(images)]))
            verified = [length >= 0 for length in draft_lens]
            outcomes = self._verify(ctx, scored, rows_by_position(q_rows), drafts, rule, verified)
            paths: list[Optional[list[int]]] = []
            new: list[Optional[list[int]]] = []
            for p, (accepted, token) in enumerate(zip(outcomes.accepted_lengths, outcomes.next_tokens)):
                paths.append(list(range(accepted + 1)) if verified[p] else None)
                new.append(drafts[p][:accepted] + [token] if verified[p] else None)
            finish_round(ctx, drafter, tokens, images, scored, paths, new)
        return np.asarray(tokens, dtype=np.int64)

    def _score(self, ctx: Decoding, windows: Any) -> StepOutput:
        """The target's step over a round's chains, every slot drawn with the round's NEXT uniform
        (the slot after an image's last draft gives its bonus token)."""
        return ctx.run(ctx.target, windows, ctx.uniforms(0, NEXT))

    def _verify(self, ctx: Decoding, scored: StepOutput, q_block: Any, drafts: list[list[int]], rule: AcceptanceRule,
                verified: list[bool]) -> ChainOutcomes:
        """Every image's chain (batch position p: drafts[p], drafted from q_block[:, p]) against its
        target rows in one verify_chains, draft i + 1 tested with the round's TEST uniform at index
        n + i and a rejection resampled with its NEXT uniform; `verified` marks the images that had
        a pass (the others pass no drafts and their outcome is ignored)."""
        with ctx.stats.timing("verification"):
            longest = max((len(chain) for chain in drafts), default=0)
            outcomes = verify_chains(scored.probs, q_block, drafts, rule, ctx.uniforms(np.arange(longest)[None], TEST),
                                     ctx.uniforms(0, NEXT), scored.draws)
            if self.theorem2:  # opt-in estimates, image by image
                for p, chain in enumerate(drafts):
                    if verified[p]:
                        rows = q_block[:, p] if chain else []
                        estimate = theorem2_along_path(scored.probs[p], rows, chain, rule)
                        ctx.stats.theorem2_accepted_length.append(estimate.expected_accepted_length)
                        ctx.stats.theorem2_tv_bound.append(estimate.tv_bound)
        return outcomes


class SpeculativeDecoding(DraftThenVerify):
    """Vanilla SD: lossless."""

    name = "sd"
    lossless = True
    # chains of a few lengths (the best one follows t(W) and the draft's cost) and the two tree kinds
    auto_settings = settings_grid({"tree": "static"}, {"tree": "dynamic"}, draft_len=(1, 2, 3, 4, 6, 8))


class CoolSD(DraftThenVerify):
    """Cool-SD: annealed relaxation ω_i (schedule 'exp', 'linear' or 'uniform' = UniformRSD), G* resampling.

    relaxation_budget δ is the mean of ω over the L draft positions (Σ ω_i = δ·L): 'uniform' gives
    every position δ (δ = 1 is vanilla SD); 'exp' (Eq. 16) and 'linear' (Eq. 17) move weight to the
    first positions, so they relax early positions at every δ ≥ 1, δ = 1 included.
    """

    name = "cool-sd"
    auto_settings = settings_grid(draft_len=(2, 4, 6))  # relaxed (lossless is False): with --relaxed only
    # δ >= 1 (1 = lossless); ν > 0, at most MAX_DECAY so exp(−ν·i) stays representable
    PARAMS = {**DraftThenVerify.PARAMS, "relaxation_budget": Float(2.0, low=1.0, symbol="δ"),
              "schedule": Choice("exp", choices=SCHEDULES),
              "decay": Float(0.7, low=0.0, high=MAX_DECAY, low_open=True, symbol="ν"),
              "slope_len": Int(8, low=1, symbol="ℓ"),
              "theorem2": Bool(False)}  # per-round Eq. 7-9 estimates cost a few V-sized passes: opt-in

    def validate(self) -> None:
        super().validate()
        if self.schedule == "linear" and 2 * self.slope_len <= self.positions + 1:
            # Eq. 17's raw weights (ℓ − i) must sum positive over i = 1..L
            length = "draft_len" if self.tree == "chain" else "the tree's depth"
            raise SpecrtError(f"cool-sd linear schedule needs slope_len (ℓ) > ({length} + 1) / 2 = "
                              f"{(self.positions + 1) / 2:g}, got {self.slope_len}")

    def weights(self) -> np.ndarray:
        """ω_1..ω_L for the configured draft length, or a tree's depth (ω_d for the nodes at depth d);
        positions of a shorter last round use the first ones."""
        return relaxation_schedule(self.schedule, self.positions, self.relaxation_budget, self.decay, self.slope_len)

    def rule(self, ctx: Decoding) -> AcceptanceRule:
        return CoolRule(self.weights())


class Lantern(DraftThenVerify):
    """LANTERN (tvd_budget δ) or LANTERN++ (ratio λ) over the VQ codebook's neighbour table.

    `ratio` λ is LANTERN's code's convention: neighbour mass ≤ (λ − 1)·p(x̃), so p̃(x̃) ≤ λ·p(x̃).
    The Cool-SD paper's Eq. 4-5 bound the neighbour mass by λ·p(x̃) instead (its λ = ratio − 1);
    its Table 1 setting "LANTERN++ (λ = 2, k = 10)" is LANTERN++'s own, i.e. ratio=2,
    neighbours_k=10. `neighbours_k` counts neighbours only, never the token itself (0: the whole
    table, 32 in an exported bundle); LANTERN's paper text counts the token in its k.
    """

    name = "lantern"
    auto_settings = settings_grid(draft_len=(2, 4, 6))  # relaxed: with --relaxed only
    # tvd_budget δ in [0, 1] or ratio λ >= 1 (None: not given); neighbours_k 0 = the whole table
    PARAMS = {**DraftThenVerify.PARAMS,
              "tvd_budget": Float(None, optional=True, low=0.0, high=1.0, symbol="δ"),
              "ratio": Float(None, optional=True, low=1.0, symbol="λ"),
              "neighbours_k": Int(0, low=0, symbol="k"),
              "resampling": Choice("lantern", choices=("lantern", "gstar")),
              "theorem2": Bool(False)}  # p̃ at every token costs V·k per position: opt-in
    neighbours: Optional[np.ndarray] = None  # set by the pipeline from the bundle / VQ codebook

    def validate(self) -> None:
        super().validate()
        if self.tvd_budget is None and self.ratio is None:
            self.tvd_budget = 0.1
        if self.tvd_budget is not None and self.ratio is not None:
            raise SpecrtError("lantern takes either tvd_budget (δ, LANTERN) or ratio (λ, LANTERN++), not both")

    def rule(self, ctx: Decoding) -> AcceptanceRule:
        if self.neighbours is None:
            raise SpecrtError("lantern needs a codebook neighbour table (bundle neighbours.npy or a VQ model)")
        if self.neighbours_k > self.neighbours.shape[1]:
            raise SpecrtError(f"lantern neighbours_k must be an integer in [0, {self.neighbours.shape[1]}] "
                              f"(the neighbour table's k), got {self.neighbours_k}")
        table = self.neighbours if not self.neighbours_k else self.neighbours[:, : self.neighbours_k]
        return LanternRule(table, tvd_budget=self.tvd_budget, ratio=self.ratio, resampling=self.resampling)
