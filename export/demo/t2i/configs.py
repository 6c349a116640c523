"""The t2i demo's sizes and schedules, in one place.

The GPTs are the c2i demo's (export.demo.configs) with LlamaGen's t2i conditioning: COND_LEN
caption tokens of CAPTION_DIM features from the small T5 (text_model). Same trunk sizes, so
they warm-start from the trained c2i GPTs and only learn to read captions.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from specrt.export.demo import configs as c2i
from specrt.export.demo.configs import Schedule
from specrt.export.demo.evaluator import EvaluatorConfig
from specrt.export.demo.t2i.text_model import TextEncoderConfig
from specrt.models.llamagen_gpt import GPTConfig

COND_LEN = 12  # the longest caption ("the digit seven, thick, slanted and wide") is 10 tokens with </s>
TEXT_ENCODER = TextEncoderConfig()
CAPTION_DIM = TEXT_ENCODER.d_model


def target_config() -> GPTConfig:
    # no dropout (the c2i target has 0.1): with it the captions' attributes were learnt markedly
    # slower (held-out NLL 1.639 vs 1.621 and AR width accuracy 0.67 vs 0.73 after the same 1,000 steps)
    return replace(c2i.target_config(), model_type="t2i", cond_len=COND_LEN, caption_dim=CAPTION_DIM, dropout=0.0)


def draft_config() -> GPTConfig:
    return replace(c2i.draft_config(), model_type="t2i", cond_len=COND_LEN, caption_dim=CAPTION_DIM)


@dataclass
class T2ITrainingConfig:
    """Everything `specrt demo train --demo t2i` needs besides the seed; stored in demo.json."""

    # one long pass over the target and text encoder: the attributes are learnt long after the
    # digit (AR width accuracy 0.51 after 600 steps at batch 32, still rising after 5,000)
    target: Schedule = field(default_factory=lambda: Schedule(steps=4000, batch_size=64, lr=1e-3, weight_decay=0.05))
    draft: Schedule = field(default_factory=lambda: Schedule(steps=800, batch_size=32, lr=3e-3, weight_decay=0.01))
    evaluator: Schedule = field(default_factory=lambda: Schedule(steps=600, batch_size=64, lr=2e-3, weight_decay=1e-4))
    max_shift: int = 2            # the c2i demo's augmentation (the attributes do not move with the digit)
    caption_dropout: float = 0.1  # rows whose caption becomes uncond_embedding (CFG)

    def scaled(self, steps_scale: float) -> "T2ITrainingConfig":
        return T2ITrainingConfig(self.target.scaled(steps_scale), self.draft.scaled(steps_scale),
                                 self.evaluator.scaled(steps_scale), self.max_shift, self.caption_dropout)

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_EVALUATOR = EvaluatorConfig(num_classes=10)
SAMPLING_DEFAULTS = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
