"""Random rows, drafts and rules shared by the runtime.verification tests (test_verification_*.py),
and the per-image definition of chain verification they hold the batched code to."""
from __future__ import annotations

import numpy as np

from specrt.runtime.sampling import inverse_cdf
from specrt.runtime.verification.formulas import relaxation_schedule
from specrt.runtime.verification.rules import CoolRule, LanternRule, VanillaRule


VOCAB, DRAFT_LEN = 12, 4


LENGTHS = [4, 0, 2, 4, 1, 3]  # per image; 0: nothing drafted (the bonus token only)


NEIGHBOURS = np.array([[j for j in sorted(range(VOCAB), key=lambda j: (abs(i - j), j)) if j != i][:5]
                       for i in range(VOCAB)])


RULES = {
    "sd": VanillaRule(),
    "cool-sd": CoolRule(relaxation_schedule("exp", DRAFT_LEN, 2.0)),
    "lantern": LanternRule(NEIGHBOURS, tvd_budget=0.2),
    "lantern++-gstar": LanternRule(NEIGHBOURS, ratio=2.0, resampling="gstar"),
}


def random_batch(seed: int, lengths=LENGTHS):
    """p_block [images, L+1, V], per-image q rows and drafts (drawn from their q), the head's draws
    [images, L+1] (random: only each image's bonus draw, after its chain, is used)."""
    rng = np.random.default_rng(seed)
    sharp = lambda n: rng.dirichlet(np.full(VOCAB, 0.3), size=n).astype(np.float32)  # noqa: E731
    p_block = sharp(len(lengths) * (DRAFT_LEN + 1)).reshape(len(lengths), DRAFT_LEN + 1, VOCAB)
    q_rows = [list(sharp(n)) for n in lengths]
    drafts = [[int(inverse_cdf(row.astype(np.float64), rng.random())) for row in rows] for rows in q_rows]
    draws = rng.integers(0, VOCAB, size=(len(lengths), DRAFT_LEN + 1))
    return p_block, q_rows, drafts, draws


def uniforms(seed: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per image: its tests' uniforms [count, L] and its draw after the accepted prefix [count]."""
    values = np.random.default_rng(seed).random((count, DRAFT_LEN + 1))
    return values[:, :DRAFT_LEN], values[:, DRAFT_LEN]


def one_image(p_rows, q_rows, drafts, rule, coins, next_uniform, draws) -> tuple[int, int]:
    """The per-image definition, one position at a time: accept x̃_i while coins[i] ≤
    rule.accept_probability; at the first rejection draw from rule.resample's row with next_uniform;
    else the bonus token (the head's draw from the row after the chain)."""
    for i, token in enumerate(drafts):
        if coins[i] > rule.accept_probability(p_rows[i], q_rows[i], token, i + 1):
            row = rule.resample(np.asarray(p_rows[i], dtype=np.float64), np.asarray(q_rows[i], dtype=np.float64),
                                token, i + 1)
            return i, int(inverse_cdf(row, next_uniform))
    return len(drafts), int(draws[len(drafts)])
