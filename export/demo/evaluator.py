"""The demo's judge: a small CNN digit classifier and the Fréchet distance over its features.

Why our own: Inception features (FID) cannot be downloaded and mean little on 32×32 digits.
A classifier trained on the real training images answers "is this recognisably the digit
it was asked for?" (accuracy), and its penultimate activations give a feature space in
which a Fréchet distance between sample and real image sets is meaningful.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

from specrt.lazy import require

torch = require("torch", "the demo evaluator")
nn = torch.nn
F = torch.nn.functional


@dataclass(frozen=True)
class EvaluatorConfig:
    """Channel widths of the three conv stages and the size of the feature layer."""

    num_classes: int = 10
    channels: tuple[int, int, int] = (32, 64, 64)
    feature_dim: int = 64

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EvaluatorConfig":
        return cls(num_classes=d["num_classes"], channels=tuple(d["channels"]), feature_dim=d["feature_dim"])


class DigitClassifier(nn.Module):
    """conv-pool ×3 (32→4 px) -> Linear -> `feature_dim` features -> Linear -> class logits."""

    def __init__(self, config: EvaluatorConfig):
        super().__init__()
        self.config = config
        c1, c2, c3 = config.channels
        self.convs = nn.ModuleList([nn.Conv2d(3, c1, 3, padding=1), nn.Conv2d(c1, c2, 3, padding=1),
                                    nn.Conv2d(c2, c3, 3, padding=1)])
        self.fc = nn.Linear(c3 * 4 * 4, config.feature_dim)
        self.head = nn.Linear(config.feature_dim, config.num_classes)

    def features(self, images: "torch.Tensor") -> "torch.Tensor":
        """images [N, 3, 32, 32] in [-1, 1] -> penultimate features [N, feature_dim]."""
        x = images
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        return F.relu(self.fc(x.flatten(1)))

    def forward(self, images: "torch.Tensor") -> "torch.Tensor":
        return self.head(self.features(images))


@torch.no_grad()
def embed(model: DigitClassifier, images: np.ndarray, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Features [N, feature_dim] (float64) and predicted classes [N] of numpy images."""
    model.eval()
    feats, preds = [], []
    for start in range(0, len(images), batch_size):
        x = torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size], dtype=np.float32))
        f = model.features(x)
        feats.append(f.double().numpy())
        preds.append(model.head(f).argmax(-1).numpy())
    return np.concatenate(feats), np.concatenate(preds)


def accuracy(model: DigitClassifier, images: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of images the classifier assigns to their label."""
    return float(np.mean(embed(model, images)[1] == np.asarray(labels)))


def frechet_distance(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """||μa − μb||² + Tr(Σa + Σb − 2 (Σa Σb)^½) between two feature sets (the FID formula)."""
    linalg = require("scipy.linalg", "the Fréchet distance")
    mu_a, mu_b = features_a.mean(0), features_b.mean(0)
    cov_a, cov_b = np.cov(features_a, rowvar=False), np.cov(features_b, rowvar=False)
    with warnings.catch_warnings():  # dead ReLU features make Σ singular; handled just below
        warnings.simplefilter("ignore", linalg.LinAlgWarning)
        covmean = linalg.sqrtm(cov_a @ cov_b)
    if not np.isfinite(covmean).all():  # near-singular product: regularise, as the FID reference code does
        eps = 1e-6 * np.eye(len(cov_a))
        covmean = linalg.sqrtm((cov_a + eps) @ (cov_b + eps))
    covmean = np.real(covmean)
    return float(np.sum((mu_a - mu_b) ** 2) + np.trace(cov_a) + np.trace(cov_b) - 2.0 * np.trace(covmean))


def frechet_distance_of_images(model: DigitClassifier, images_a: np.ndarray, images_b: np.ndarray) -> float:
    """Fréchet distance between two image sets in the classifier's feature space."""
    return frechet_distance(embed(model, images_a)[0], embed(model, images_b)[0])
