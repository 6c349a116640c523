"""Fidelity of generated digits: evaluator class accuracy and Fréchet distance to real digits.

The c2i demo's judge, which `specrt bench` scores images with (the continuous demo's images
too: it judges images, whichever model made them). The evaluator, its feature space and the
Fréchet distance are this demo's own single implementation (export.demo.evaluator); this
module only decides which image sets are compared. The held-out real digits are split into
two class-interleaved halves: half A is the reference every setting is measured against, and
half B gives the noise floor, the distance a perfect generator would score at the same sample
size (Fréchet distances are biased upwards by small samples, so only same-size comparisons
are meaningful). Generated and real images both go through the same uint8 pixel mapping
before the evaluator sees them, so quantisation cannot separate them.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from specrt.export.demo import demo_dataset, load_demo
from specrt.export.demo.evaluator import embed, frechet_distance
from specrt.runtime.pipeline import from_uint8, to_uint8

BOOTSTRAP_ROUNDS = 30


class FidelityJudge:
    """Scores image sets against a fixed reference half of real images."""

    def __init__(self, evaluator: Any, reference_images: np.ndarray, spare_real_images: np.ndarray,
                 real_accuracy: float | None = None):
        self.evaluator = evaluator
        self.reference_features = embed(evaluator, from_uint8(to_uint8(reference_images)))[0]
        self.spare_features = embed(evaluator, from_uint8(to_uint8(spare_real_images)))[0]
        self.real_accuracy = real_accuracy

    @classmethod
    def from_demo(cls, demo_weights: Any = None) -> "FidelityJudge":
        """The demo evaluator with the held-out real digits (halves A and B)."""
        split = demo_dataset()
        evaluator = load_demo(demo_weights).evaluator
        judge = cls(evaluator, *split.held_out_halves())
        judge.real_accuracy = judge.score(to_uint8(split.held_out_images), split.held_out_labels)["class_accuracy"]
        return judge

    @property
    def reference_size(self) -> int:
        return len(self.reference_features)

    @property
    def feature_dim(self) -> int:
        return int(self.reference_features.shape[1])

    def score(self, images: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
        """Class accuracy (evaluator agrees with the requested class) over all images, and the
        Fréchet distance to half A of the first images, as many as the noise floor can use."""
        features, predicted = embed(self.evaluator, from_uint8(images))
        fd_images = min(len(features), len(self.spare_features))  # the size the noise floor can match
        return {
            "class_accuracy": float(np.mean(predicted == np.asarray(labels))),
            "frechet_distance": self._distance(features[:fd_images]),
            "frechet_distance_std": self._bootstrap_std(features[:fd_images]),
            "fd_images": fd_images,
        }

    def _bootstrap_std(self, features: np.ndarray, rounds: int = BOOTSTRAP_ROUNDS) -> float | None:
        """Spread of the Fréchet distance over resamplings of the image set (with replacement):
        how far two settings' distances must differ before the difference means anything."""
        if len(features) < 3:
            return None
        rng = np.random.default_rng(0)
        values = [self._distance(features[rng.integers(0, len(features), len(features))]) for _ in range(rounds)]
        return float(np.std(values))

    def _distance(self, features: np.ndarray) -> float | None:
        """Fréchet distance to half A (None below 2 images: no covariance); scipy's singular-matrix
        warning is expected for small sets (the demo implementation regularises those)."""
        if len(features) < 2:
            return None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*singular.*")
            return frechet_distance(features, self.reference_features)

    def noise_floor(self, n: int) -> dict[str, Any]:
        """Fréchet distance of n real held-out images (half B) to half A: the floor at this size."""
        n = min(n, len(self.spare_features))
        return {"frechet_distance": self._distance(self.spare_features[:n]),
                "frechet_distance_std": self._bootstrap_std(self.spare_features[:n]),
                "images": n, "reference_images": self.reference_size,
                "real_class_accuracy": self.real_accuracy}
