"""Captions for the t2i demo, built from properties measured on each image.

Why measured: a caption must say more than the class ("a thick slanted seven"), and every
word must be checkable on a generated image, or prompt following cannot be scored. Three
properties of the ink (x + 1) / 2 of a 32×32 digit, all unchanged by the shift augmentation:

- thickness: total ink (bold strokes carry more of it than thin ones of the same digit);
- slant: the shear −cov(x, y) / var(y) of the ink (positive: the top leans right);
- width: the horizontal spread (standard deviation of x) of the ink.

Each is split in two at the median of its digit's training images (thresholds per digit,
because a one has less ink than an eight whatever its strokes), so each word is used by
half of every digit's images: balanced, and independent of the digit.

A caption names the digit and any subset of the attributes, through a few templates and
synonyms; `parse_prompt` reads a prompt back into what it asks for (for scoring).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# attribute -> (value 0 words, value 1 words); the first word of each is the canonical one
ATTRIBUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "thickness": (("thin", "light", "fine"), ("thick", "bold", "heavy")),
    "slant": (("upright", "straight", "vertical"), ("slanted", "italic", "leaning")),
    "width": (("narrow", "slim", "condensed"), ("wide", "broad", "round")),
}
ATTRIBUTE_NAMES = tuple(ATTRIBUTES)
TEMPLATES = ("a {adjectives} {digit}", "{adjectives} {digit}", "the digit {digit}, {listed}",
             "a {digit} that is {listed}", "a {adjectives} {numeral}")
BARE_TEMPLATES = ("a {digit}", "the digit {digit}", "{digit}", "the number {numeral}")
MENTION_PROBABILITY = 0.75  # each attribute is named in this share of training captions


def vocabulary() -> list[str]:
    """Every word a caption can use (the text encoder's word-level vocabulary)."""
    words = ["a", "an", "the", "digit", "number", "that", "is", "and", ","]
    words += list(DIGITS) + [str(d) for d in range(10)]
    for low, high in ATTRIBUTES.values():
        words += list(low) + list(high)
    return list(dict.fromkeys(words))


# ---- measurement ------------------------------------------------------------------------

def measure(images: np.ndarray) -> dict[str, np.ndarray]:
    """Raw attribute values of images [N, 3, H, W] (or [N, H, W]) in [-1, 1], float64 [N] each."""
    x = np.asarray(images, dtype=np.float64)
    if x.ndim == 4:
        x = x.mean(axis=1)
    ink = np.clip((x + 1.0) / 2.0, 0.0, 1.0)
    h, w = ink.shape[-2:]
    ys, xs = np.mgrid[0:h, 0:w]
    mass = np.maximum(ink.sum(axis=(1, 2)), 1e-6)
    cy = (ink * ys).sum(axis=(1, 2)) / mass
    cx = (ink * xs).sum(axis=(1, 2)) / mass
    dy, dx = ys[None] - cy[:, None, None], xs[None] - cx[:, None, None]
    var_y = np.maximum((ink * dy**2).sum(axis=(1, 2)) / mass, 1e-6)
    cov_xy = (ink * dx * dy).sum(axis=(1, 2)) / mass
    var_x = (ink * dx**2).sum(axis=(1, 2)) / mass
    return {"thickness": mass, "slant": -cov_xy / var_y, "width": np.sqrt(var_x)}


@dataclass(frozen=True)
class AttributeBins:
    """Per-digit median thresholds of each attribute: value 1 (thick, slanted, wide) above it."""

    thresholds: dict[str, list[float]]  # attribute -> 10 thresholds, one per digit

    @classmethod
    def fit(cls, images: np.ndarray, digits: np.ndarray) -> "AttributeBins":
        raw = measure(images)
        digits = np.asarray(digits)
        return cls({name: [float(np.median(values[digits == d])) for d in range(len(DIGITS))]
                    for name, values in raw.items()})

    def labels(self, images: np.ndarray, digits: np.ndarray) -> dict[str, np.ndarray]:
        """Each attribute's value 0/1 (int64 [N]) for images of the given digits."""
        raw = measure(images)
        digits = np.asarray(digits)
        return {name: (raw[name] > np.asarray(self.thresholds[name])[digits]).astype(np.int64)
                for name in ATTRIBUTE_NAMES}

    def to_dict(self) -> dict:
        return {"rule": "value 1 above the median of the digit's training images", "thresholds": self.thresholds}

    @classmethod
    def from_dict(cls, d: dict) -> "AttributeBins":
        return cls({name: [float(v) for v in d["thresholds"][name]] for name in ATTRIBUTE_NAMES})


# ---- captions ---------------------------------------------------------------------------

def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" or word == "8" else "a"


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def caption(digit: int, attributes: dict[str, int], rng: Optional[np.random.Generator] = None) -> str:
    """A caption naming `digit` and the attributes given (name -> 0/1); random template and
    synonyms with an rng, the canonical form ("a thick slanted wide seven") without."""
    named = [name for name in ATTRIBUTE_NAMES if name in attributes]
    if rng is not None:
        named = [named[i] for i in rng.permutation(len(named))]
    words = [ATTRIBUTES[name][int(attributes[name])] for name in named]
    words = [w[int(rng.integers(len(w)))] if rng is not None else w[0] for w in words]
    numeral = str(digit)
    if not words:
        template = BARE_TEMPLATES[int(rng.integers(len(BARE_TEMPLATES)))] if rng is not None else BARE_TEMPLATES[0]
        text = template.format(digit=DIGITS[digit], numeral=numeral)
    else:
        template = TEMPLATES[int(rng.integers(len(TEMPLATES)))] if rng is not None else TEMPLATES[0]
        text = template.format(digit=DIGITS[digit], numeral=numeral, adjectives=" ".join(words), listed=_listed(words))
    return _fix_articles(text)


def _fix_articles(text: str) -> str:
    """'a eight' -> 'an eight', 'a upright' -> 'an upright'."""
    tokens = text.split(" ")
    for i in range(len(tokens) - 1):
        if tokens[i] in ("a", "an"):
            tokens[i] = _article(tokens[i + 1])
    return " ".join(tokens)


def training_caption(digit: int, attributes: dict[str, int], rng: np.random.Generator) -> str:
    """A random caption of a training image: each attribute named with MENTION_PROBABILITY."""
    named = {k: v for k, v in attributes.items() if rng.random() < MENTION_PROBABILITY}
    return caption(digit, named, rng)


@dataclass(frozen=True)
class Request:
    """What a prompt asks for: the digit (None if it names none) and the attributes it names."""

    digit: Optional[int]
    attributes: dict[str, int]


_WORDS = {w: (name, value) for name, pair in ATTRIBUTES.items() for value, words in enumerate(pair) for w in words}
_DIGIT_WORDS = {**{w: d for d, w in enumerate(DIGITS)}, **{str(d): d for d in range(10)}}


def parse_prompt(prompt: str) -> Request:
    """The digit and attributes a prompt names (the last mention wins; unknown words are ignored)."""
    digit, attributes = None, {}
    for word in re.findall(r"[a-z0-9]+", prompt.lower()):
        if word in _DIGIT_WORDS:
            digit = _DIGIT_WORDS[word]
        elif word in _WORDS:
            name, value = _WORDS[word]
            attributes[name] = value
    return Request(digit, attributes)


def default_prompts() -> list[str]:
    """The bench's prompt set: each of the 80 (digit, attribute combination) pairs once, in the
    canonical wording, ordered so that any 10 consecutive prompts name every digit and any 8
    every combination (a short run stays balanced)."""
    combos = [dict(zip(ATTRIBUTE_NAMES, map(int, bits))) for bits in np.ndindex(*(2,) * len(ATTRIBUTE_NAMES))]
    count = len(DIGITS) * len(combos)
    half = count // 2  # digit i % 10 and combo i % 8 meet only on equal parity: the second half shifts by one
    return [caption(i % len(DIGITS), combos[(i + i // half) % len(combos)]) for i in range(count)]


def read_prompt_file(lines: Sequence[str]) -> list[str]:
    """One prompt a line; blank lines and lines starting with # are skipped."""
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
