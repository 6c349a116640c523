"""Where every random number of continuous decoding comes from: counter uniforms keyed by the draw.

Why: the host loop (methods.py) and the device round (rounds.py) must give a seed the same tokens,
so a number that decides the same thing — a chain's noise, an acceptance coin, a residual
proposal — has to be the same number in both, whichever loop draws it, in numpy or in torch,
alone or in a batch. Each number is runtime.counter_random.counter_uniforms of the draw's own
coordinates, computed here once for both loops:

  (image seed: its low and high 32 bits, token index, kind of draw, image round, part)

The token index and the kind make the position coordinate (index + 2^16·kind), the part and the
image's round the slot (part + 2^20·(round mod 2^12)). The round is the image's count of rounds
since its first token — one per token in ar and in token pre-filling, one per draft-verify round
in cspd, plus one for every RESIDUAL_PROPOSALS proposals its residual draw has used: the device
round draws that many a round and leaves a draw open to the next round, and the host loop's
unbounded acceptance-rejection keys its proposal m by (round + m // K, group m mod K), so both take
the same first accepted proposal. (Not counter_random.draw_slot's layout, whose 256 parts a draw
are fewer than one chain's noise takes: (T+1)·C numbers a token, K chains a residual.)

Gaussian noise is Box–Muller, one implementation for both loops (`normals`): `count` normals of
one group g of a draw come from P = ceil(count / 2) pairs of uniforms, pair p from parts
g·2P + 2p (radius r) and g·2P + 2p + 1 (angle θ); the first P normals are r·cos θ, the next r·sin θ.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from specrt.runtime.arrays import is_host, namespace
from specrt.runtime.counter_random import counter_uniforms

# what a number is for, at one token index of one round. The target's own token (ar, a pre-filled
# token, a bonus token) is its first proposal: PROPOSAL_NOISE, group 0, as in cspd's rounds, so
# cspd with every token pre-filled is ar, token for token.
DRAFT_NOISE, TEST, PROPOSAL_NOISE, PROPOSAL_TEST = range(4)
INDEX_SPAN = 1 << 16   # token indices below this: the kind sits above them in the position coordinate
PART_SPAN = 1 << 20    # parts of one draw below this: the round sits above them in the slot coordinate
ROUND_SPAN = 1 << 12   # rounds wrap here, far past any image's rounds
# K: residual proposals a device round draws per image (rounds.py's docstring has the measurement);
# the host loop keys its proposals by it so both take the same one
RESIDUAL_PROPOSALS = 8


def uniforms(seed_low: Any, seed_high: Any, round_: Any, index: Any, kind: int, part: Any = 0) -> Any:
    """float64 uniforms of draws `kind` at token indices `index` of rounds `round_` of images whose
    seeds are (seed_low, seed_high), one per broadcast element (int64 numpy arrays or torch tensors;
    `part` an int or such an array, below PART_SPAN)."""
    return counter_uniforms(seed_low, seed_high, index + INDEX_SPAN * kind, part + PART_SPAN * (round_ % ROUND_SPAN))


def normals(seed_low: Any, seed_high: Any, round_: Any, index: Any, kind: int, count: int, group: Any = 0) -> Any:
    """float32 standard normals [*S, count] (S: the broadcast shape of the coordinates, `group`
    included: which block of `count` within the draw), by Box–Muller (the module docstring)."""
    pairs = (count + 1) // 2
    xp = namespace(index)
    within = xp.reshape(xp.arange(2 * pairs, device=getattr(index, "device", None)), (pairs, 2))
    lift = lambda a: a if isinstance(a, int) else a[..., None, None]  # noqa: E731  [*S] -> [*S, 1, 1]
    u = uniforms(lift(seed_low), lift(seed_high), lift(round_), lift(index), kind, lift(group) * (2 * pairs) + within)
    radius, angle = -2.0 * _log(u[..., 0]), 2.0 * math.pi * u[..., 1]
    if is_host(u):
        radius = np.sqrt(radius)
        values = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=-1)
        return values[..., :count].astype(np.float32)
    radius = radius.sqrt()
    return xp.concat([radius * angle.cos(), radius * angle.sin()], axis=-1)[..., :count].float()


def chain_noise(rows: Any, steps: int, channels: int) -> Any:
    """Normals [..., (T+1)·C] (the leading dimensions' rows in order) as chains' noise [T+1, rows, C]:
    index T is x_T, index t < T the ε of step t."""
    return rows.reshape(-1, steps + 1, channels).swapaxes(0, 1)


def _log(u: Any) -> Any:
    return np.log(u) if is_host(u) else u.log()
