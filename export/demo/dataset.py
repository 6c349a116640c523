"""The demo's real images: scikit-learn's handwritten digits, upsampled to 32×32 RGB.

Why these: 1797 real 8×8 scans (10 classes) ship inside scikit-learn, so every command
works offline and evaluator accuracy / Fréchet distance compare against real images rather
than against samples of another model. The split is a fixed permutation, so the held-out
images are the same on every machine, and the two halves of the held-out set give the
real-vs-real Fréchet distance that a sample-vs-real distance is read against.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from specrt.lazy import require

IMAGE_SIZE = 32
NUM_CLASSES = 10
HELD_OUT_FRACTION = 0.2
SPLIT_SEED = 20240521  # fixed forever: changing it changes which images are "held out"


@dataclass(frozen=True)
class DigitsSplit:
    """Images float32 [N, 3, 32, 32] in [-1, 1] (ink bright) and labels int64 [N]."""

    train_images: np.ndarray
    train_labels: np.ndarray
    held_out_images: np.ndarray
    held_out_labels: np.ndarray

    def held_out_halves(self) -> tuple[np.ndarray, np.ndarray]:
        """Two disjoint halves of the held-out images with the same class mix (for the reference FD).

        Each half keeps the split's random order, so its first n images are a class-mixed
        subset too (a class-sorted half truncated to n would hold only the low digits).
        """
        order = np.argsort(self.held_out_labels, kind="stable")
        half_a, half_b = np.sort(order[0::2]), np.sort(order[1::2])
        return self.held_out_images[half_a], self.held_out_images[half_b]


def upsample(digits_8x8: np.ndarray) -> np.ndarray:
    """[N, 8, 8] scans in 0..16 -> [N, 3, 32, 32] float32 in [-1, 1], bicubic (smooth strokes)."""
    torch = require("torch", "the demo dataset")
    x = torch.from_numpy(np.asarray(digits_8x8, dtype=np.float32) / 16.0)[:, None]
    # zero-pad one pixel so strokes touching the border fade out instead of being cut
    x = torch.nn.functional.pad(x, (1, 1, 1, 1))
    x = torch.nn.functional.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bicubic", align_corners=False)
    x = x.clamp(0.0, 1.0) * 2.0 - 1.0
    return x.repeat(1, 3, 1, 1).numpy()


@lru_cache(maxsize=1)
def load_split() -> DigitsSplit:
    """The deterministic 80/20 train / held-out split of all 1797 digits."""
    datasets = require("sklearn.datasets", "the demo dataset")
    digits = datasets.load_digits()
    images = upsample(digits.images)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    n_held = int(round(HELD_OUT_FRACTION * len(labels)))
    held, train = order[:n_held], order[n_held:]
    return DigitsSplit(images[train], labels[train], images[held], labels[held])


def shift(images: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Translate [N, C, H, W] images by (dy, dx) pixels, filling with background (-1)."""
    out = np.full_like(images, -1.0)
    h, w = images.shape[-2:]
    out[..., max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        images[..., max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def random_shifts(images: np.ndarray, max_shift: int, rng: np.random.Generator) -> np.ndarray:
    """Light augmentation: each image moved by an independent shift in [-max_shift, max_shift]²."""
    if max_shift == 0:
        return images
    out = np.empty_like(images)
    offsets = rng.integers(-max_shift, max_shift + 1, size=(len(images), 2))
    for i, (dy, dx) in enumerate(offsets):
        out[i] = shift(images[i:i + 1], int(dy), int(dx))[0]
    return out
