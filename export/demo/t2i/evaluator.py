"""The t2i demo's judge: the c2i evaluator's CNN with one more head, for the attributes.

Why a classifier, not the measurement itself: it is what CLIP score is to the papers' t2i
models — a model trained on real images that reads a generated one — and its accuracy on
real held-out images (against their measured attributes) is the ceiling a generator is read
against. The attribute head gives two logits per attribute (captions.ATTRIBUTE_NAMES order);
the digit head and the feature layer are DigitClassifier's, so the Fréchet distance uses
the same code as the c2i demo (evaluator.embed / frechet_distance).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from specrt.lazy import require

torch = require("torch", "the t2i demo evaluator")

from specrt.export.demo.evaluator import DigitClassifier, EvaluatorConfig  # noqa: E402
from specrt.export.demo.t2i.captions import ATTRIBUTE_NAMES, Request  # noqa: E402


class PromptEvaluator(DigitClassifier):
    """DigitClassifier + `attribute_head`: features -> [N, attributes, 2] logits."""

    def __init__(self, config: EvaluatorConfig):
        super().__init__(config)
        self.attribute_head = torch.nn.Linear(config.feature_dim, 2 * len(ATTRIBUTE_NAMES))

    def attribute_logits(self, features: "torch.Tensor") -> "torch.Tensor":
        return self.attribute_head(features).view(-1, len(ATTRIBUTE_NAMES), 2)


@torch.no_grad()
def predict(model: PromptEvaluator, images: np.ndarray, batch_size: int = 256) -> dict[str, np.ndarray]:
    """Predicted digit and attribute values (int64 [N] each) of images [N,3,32,32] in [-1, 1]."""
    model.eval()
    out: dict[str, list[np.ndarray]] = {"digit": [], **{name: [] for name in ATTRIBUTE_NAMES}}
    for start in range(0, len(images), batch_size):
        features = model.features(torch.from_numpy(np.ascontiguousarray(images[start:start + batch_size], np.float32)))
        out["digit"].append(model.head(features).argmax(-1).numpy())
        values = model.attribute_logits(features).argmax(-1).numpy()
        for i, name in enumerate(ATTRIBUTE_NAMES):
            out[name].append(values[:, i])
    return {k: np.concatenate(v) for k, v in out.items()}


def prompt_following(predicted: dict[str, np.ndarray], requests: Sequence[Request]) -> dict[str, Optional[float]]:
    """How well images follow their prompts, as the evaluator reads them: per property, the share
    of the prompts naming it whose image shows it (None if none names it); `words`, the share of
    all named properties shown (a CLIP-score-like average over every word a prompt names); `all`,
    the share of images showing every property their prompt names."""
    keys = ("digit",) + ATTRIBUTE_NAMES
    hits = {k: [] for k in keys}
    every = []
    for i, request in enumerate(requests):
        asked = ({"digit": request.digit} if request.digit is not None else {}) | request.attributes
        right = {k: bool(predicted[k][i] == v) for k, v in asked.items()}
        for k, ok in right.items():
            hits[k].append(ok)
        every.append(all(right.values()))
    result = {k: (float(np.mean(v)) if v else None) for k, v in hits.items()}
    named = [ok for v in hits.values() for ok in v]
    result["words"] = float(np.mean(named)) if named else None
    result["all"] = float(np.mean(every)) if every else None
    return result
