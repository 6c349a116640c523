"""The t2i demo's judge: the c2i demo's Fréchet distance (export.demo.fidelity), plus prompt
following — the evaluator's digit and attribute predictions against what each image's prompt
asked for (per attribute and all at once), read beside the same figures on real held-out digits.
The chameleon demo draws the same digits from the same captions, so it is judged here too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from specrt.export.demo import demo_dataset
from specrt.export.demo.fidelity import FidelityJudge
from specrt.export.demo.t2i.captions import parse_prompt
from specrt.export.demo.t2i.evaluator import predict, prompt_following
from specrt.export.demo.t2i.store import load_t2i_demo
from specrt.export.demo.t2i.training import real_prompt_following
from specrt.runtime.pipeline import from_uint8, to_uint8


class PromptJudge(FidelityJudge):
    """FidelityJudge over the t2i evaluator, scoring prompts instead of class labels."""

    def __init__(self, evaluator: Any, reference_images: np.ndarray, spare_real_images: np.ndarray,
                 real_following: dict[str, Any]):
        super().__init__(evaluator, reference_images, spare_real_images, real_following.get("digit"))
        self.real_following = real_following

    @classmethod
    def from_t2i_demo(cls, demo_weights: Any = None) -> "PromptJudge":
        """The t2i demo's evaluator with the held-out real digits and their measured captions."""
        split, models = demo_dataset(), load_t2i_demo(demo_weights)
        held_attributes = models.bins.labels(split.held_out_images, split.held_out_labels)
        real = real_prompt_following(models.evaluator, split, held_attributes,
                                     from_uint8(to_uint8(split.held_out_images)))
        return cls(models.evaluator, *split.held_out_halves(), real)

    def score(self, images: np.ndarray, prompts: Any) -> dict[str, Any]:
        """FidelityJudge's scores (class_accuracy = the digit the prompt names) and
        `prompt_following`: {digit, each attribute, all} -> share of images right."""
        requests = [parse_prompt(p) for p in prompts]
        digits = np.array([-1 if r.digit is None else r.digit for r in requests])
        following = prompt_following(predict(self.evaluator, from_uint8(images)), requests)
        return {**super().score(images, digits), "prompt_following": following}

    def noise_floor(self, n: int) -> dict[str, Any]:
        return {**super().noise_floor(n), "real_prompt_following": self.real_following}
