"""Counter-based uniforms: each one a pure function of (seed, image, position, slot).

Why: a speculative round that runs on the device, captured whole as a CUDA graph, cannot ask the
host for random numbers between its stages, and a numpy stream per image drawn step by step ties
an image's draws to the order the host happened to draw them in. A counter-based generator
computes the number a draw needs from the draw's own coordinates instead — which image (its
seed, its index), which token position, which use within that position (the draft's proposal,
the acceptance test, the residual draw...) — with integer operations every array library has.
So numpy on the host, torch on a GPU (inside a graph) and an exported ONNX graph (BitwiseXor,
BitShift, Mul, BitwiseAnd) compute the same numbers, and an image draws the same numbers alone
or in any batch.

The mix is a 32-bit integer hash (x ^= x >> 16; x *= 0x45d9f3b; twice; x ^= x >> 16), applied to
each coordinate in turn with a distinct odd offset; the multiplier is below 2^27, so every
product of a 32-bit value fits a signed 64-bit integer and no array library overflows. Two such
hashes give 53 bits, a float64 in (0, 1) — never 0 or 1, so an inverse-CDF draw never falls on a
boundary by construction.

Both loops draw every number from here, with the same coordinates for the same draw: the token
index the draw decides, and a slot (`draw_slot`) made of the image's round (its count of target
passes since its prefill), the kind of draw (DRAFT, TEST, NEXT, ...) and its part (a sibling's or a
candidate's number). So the device round (runtime/rounds), the host loop (runtime/methods, on any
backend: PyTorch, onnxruntime, TensorRT) and an image decoded alone or in any batch give the same
tokens for a seed, up to float rounding at a CDF boundary or an acceptance test's edge.
"""
from __future__ import annotations

from typing import Any

from specrt.runtime.arrays import namespace

_MASK32 = 0xFFFFFFFF
_MULTIPLIER = 0x45D9F3B  # < 2^27: (2^32 − 1) · multiplier < 2^63
# distinct odd offsets per coordinate, so (a, b) and (b, a) hash apart
_SEED, _IMAGE, _POSITION, _SLOT, _SECOND = 0x3C6EF372, 0x1B873593, 0x5BD1E995, 0x68E31DA4, 0x2545F491


# what a uniform is for, at one token index of one round; `part` numbers the draws of one kind there
# (a sibling's test, a candidate drawn without replacement); NOISE: a token index's Gumbel noise,
# one uniform per vocabulary entry and the same in every round (noise_slots)
DRAFT, TEST, NEXT, FRESH, RETEST, RESAMPLE, CANDIDATE, NOISE = range(8)
KINDS, PARTS = 8, 256  # every kind's slot is kind + KINDS·(...), and more parts than any branching or tree has nodes


def draw_slot(kind: int, part: Any, round_: Any) -> Any:
    """The slot coordinate of a draw: its kind and part within the image's round `round_` (ints, or
    int64 arrays / tensors that broadcast). Distinct (round, part, kind) give distinct slots."""
    return kind + KINDS * (part + PARTS * round_)


def noise_slots(tokens: Any) -> Any:
    """The slot coordinates of a token index's noise, one per vocabulary entry in `tokens` (an int64
    array or tensor of token ids): kind NOISE with the token id where other kinds put (part, round),
    so the noise of a token index is the same in every round (coupled Jacobi drafts re-draw a position
    with the same noise each iteration) and no other draw's slot equals one of these (the kind differs)."""
    return NOISE + KINDS * tokens


def seed_halves(seed: int) -> tuple[int, int]:
    """A 64-bit seed as the (seed, image) coordinates of counter_uniforms: its low and high 32 bits."""
    return int(seed) & _MASK32, int(seed) >> 32


def mix32(x: Any) -> Any:
    """The 32-bit hash of int64 values in [0, 2^32), elementwise, in their own array library."""
    x = ((x >> 16) ^ x) * _MULTIPLIER & _MASK32
    x = ((x >> 16) ^ x) * _MULTIPLIER & _MASK32
    return (x >> 16) ^ x


def image_key(seed: Any, image: Any) -> Any:
    """The hash of an image's (seed, image) coordinates: the first two steps of each of its uniforms,
    which a host loop computes once per image rather than once per draw (arrays, tensors or ints)."""
    return mix32(mix32((seed & _MASK32) ^ _SEED) ^ ((image & _MASK32) ^ _IMAGE))


def _bits(key: Any, position: Any, slot: Any) -> Any:
    """53 random bits of a draw from its image's key, token position and slot."""
    key = mix32(key ^ ((position & _MASK32) ^ _POSITION))
    high = mix32(key ^ ((slot & _MASK32) ^ _SLOT))
    low = mix32(high ^ _SECOND)
    return (high >> 5) * (1 << 26) + (low >> 6)  # 27 + 26 = 53 bits, below 2^53: exact in float64


def keyed_uniforms(key: Any, position: Any, slot: Any) -> Any:
    """counter_uniforms from image_key(seed, image) (int64 arrays or tensors that broadcast)."""
    bits = _bits(key, position, slot)
    xp = namespace(bits)
    return (xp.astype(bits, xp.float64) + 0.5) / float(1 << 53)


def counter_uniforms(seed: Any, image: Any, position: Any, slot: Any) -> Any:
    """float64 uniforms in (0, 1), one per broadcast element of the int64 coordinates (numpy arrays
    or torch tensors, all in one library; Python ints broadcast): the same numbers in every
    library, on every device. seed, image, position and slot are each taken modulo 2^32."""
    return keyed_uniforms(image_key(seed, image), position, slot)


def keyed_uniform(key: int, position: int, slot: int) -> float:
    """One uniform of Python ints, computed in Python, bit for bit the array functions' number: a
    handful of draws costs microseconds this way, where ~40 array operations cost tens of them."""
    return (_bits(key, position, slot) + 0.5) / float(1 << 53)
