"""Fidelity of generated images: evaluator class accuracy and Fréchet distance to real images.

The evaluator, its feature space and the Fréchet distance are the demo's own single
implementation (specrt.export.demo.evaluator); this module only decides which image sets
are compared. The held-out real digits are split into two class-interleaved halves: half A
is the reference every setting is measured against, and half B gives the noise floor, the
distance a perfect generator would score at the same sample size (Fréchet distances are
biased upwards by small samples, so only same-size comparisons are meaningful).
Generated and real images both go through the same uint8 pixel mapping before the
evaluator sees them, so quantisation cannot separate them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from specrt.runtime.pipeline import from_uint8, to_uint8

BOOTSTRAP_ROUNDS = 30


class FidelityJudge:
    """Scores image sets against a fixed reference half of real images."""

    def __init__(self, evaluator: Any, reference_images: np.ndarray, spare_real_images: np.ndarray,
                 real_accuracy: float | None = None):
        from specrt.export.demo.evaluator import embed, frechet_distance

        self._embed, self._frechet = embed, frechet_distance
        self.evaluator = evaluator
        self.reference_features = embed(evaluator, from_uint8(to_uint8(reference_images)))[0]
        self.spare_features = embed(evaluator, from_uint8(to_uint8(spare_real_images)))[0]
        self.real_accuracy = real_accuracy

    @classmethod
    def from_demo(cls, demo_weights: Any = None) -> "FidelityJudge":
        """The demo evaluator with the held-out real digits (halves A and B)."""
        from specrt.export.demo import demo_dataset, load_demo

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
        features, predicted = self._embed(self.evaluator, from_uint8(images))
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
        import warnings

        if len(features) < 2:
            return None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*singular.*")
            return self._frechet(features, self.reference_features)

    def noise_floor(self, n: int) -> dict[str, Any]:
        """Fréchet distance of n real held-out images (half B) to half A: the floor at this size."""
        n = min(n, len(self.spare_features))
        return {"frechet_distance": self._distance(self.spare_features[:n]),
                "frechet_distance_std": self._bootstrap_std(self.spare_features[:n]),
                "images": n, "reference_images": self.reference_size,
                "real_class_accuracy": self.real_accuracy}


class PromptJudge(FidelityJudge):
    """The t2i demo's judge: the same Fréchet distance, plus prompt following — the evaluator's
    digit and attribute predictions against what each image's prompt asked for (per attribute
    and all at once), read beside the same figures on real held-out digits."""

    def __init__(self, evaluator: Any, reference_images: np.ndarray, spare_real_images: np.ndarray,
                 real_following: dict[str, Any]):
        super().__init__(evaluator, reference_images, spare_real_images, real_following.get("digit"))
        self.real_following = real_following

    @classmethod
    def from_t2i_demo(cls, demo_weights: Any = None) -> "PromptJudge":
        """The t2i demo's evaluator with the held-out real digits and their measured captions."""
        from specrt.export.demo import demo_dataset
        from specrt.export.demo.t2i import load
        from specrt.export.demo.t2i.training import real_prompt_following

        split, models = demo_dataset(), load(demo_weights)
        held_attributes = models.bins.labels(split.held_out_images, split.held_out_labels)
        real = real_prompt_following(models.evaluator, split, held_attributes,
                                     from_uint8(to_uint8(split.held_out_images)))
        return cls(models.evaluator, *split.held_out_halves(), real)

    def score(self, images: np.ndarray, prompts: Any) -> dict[str, Any]:
        """FidelityJudge's scores (class_accuracy = the digit the prompt names) and
        `prompt_following`: {digit, each attribute, all} -> share of images right."""
        from specrt.export.demo.t2i.captions import parse_prompt
        from specrt.export.demo.t2i.evaluator import predict, prompt_following

        requests = [parse_prompt(p) for p in prompts]
        digits = np.array([-1 if r.digit is None else r.digit for r in requests])
        following = prompt_following(predict(self.evaluator, from_uint8(images)), requests)
        return {**super().score(images, digits), "prompt_following": following}

    def noise_floor(self, n: int) -> dict[str, Any]:
        return {**super().noise_floor(n), "real_prompt_following": self.real_following}
