"""The demo family's architectures and training schedules, in one place.

Sizes are LlamaGen's architecture scaled down to 32×32 digits on a 2-core CPU: the VQ
downsamples ×4 (8×8 = 64 tokens), the target is a 4-layer GPT, and the draft is a 1-layer
GPT about an order of magnitude cheaper per token, sharing the tokenizer as an independent
draft model does (DESIGN.md, draft kind (a)).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specrt.export.demo.dataset import IMAGE_SIZE, NUM_CLASSES
from specrt.export.demo.evaluator import EvaluatorConfig
from specrt.models.llamagen_gpt import GPTConfig
from specrt.models.llamagen_vq import VQConfig

CODEBOOK_SIZE = 512
GRID_SIZE = 8


def vq_config() -> VQConfig:
    return VQConfig(codebook_size=CODEBOOK_SIZE, codebook_embed_dim=8, codebook_l2_norm=True, ch=16,
                    ch_mult=(1, 2, 2), z_channels=32, num_res_blocks=1, norm_groups=8)


def target_config() -> GPTConfig:
    return GPTConfig(dim=192, n_layer=4, n_head=4, vocab_size=CODEBOOK_SIZE, num_classes=NUM_CLASSES,
                     grid_size=GRID_SIZE, dropout=0.1)


def draft_config() -> GPTConfig:
    return GPTConfig(dim=64, n_layer=1, n_head=2, vocab_size=CODEBOOK_SIZE, num_classes=NUM_CLASSES,
                     grid_size=GRID_SIZE, multiple_of=32, dropout=0.0)


@dataclass
class Schedule:
    """One model's optimisation: AdamW, linear warm-up then cosine decay to lr·min_lr_ratio."""

    steps: int
    batch_size: int
    lr: float
    warmup: int = 100
    weight_decay: float = 0.0
    min_lr_ratio: float = 0.1

    def scaled(self, steps_scale: float) -> "Schedule":
        steps = max(1, round(self.steps * steps_scale))
        return Schedule(steps, self.batch_size, self.lr, min(self.warmup, steps // 5), self.weight_decay, self.min_lr_ratio)


@dataclass
class DemoTrainingConfig:
    """Everything `specrt demo train` needs besides the seed; stored in the weights' JSON."""

    vq: Schedule = field(default_factory=lambda: Schedule(steps=1000, batch_size=32, lr=2e-3))
    target: Schedule = field(default_factory=lambda: Schedule(steps=1600, batch_size=32, lr=1e-3, weight_decay=0.05))
    draft: Schedule = field(default_factory=lambda: Schedule(steps=1600, batch_size=32, lr=3e-3, weight_decay=0.01))
    evaluator: Schedule = field(default_factory=lambda: Schedule(steps=600, batch_size=64, lr=2e-3, weight_decay=1e-4))
    max_shift: int = 2           # augmentation: random translations of up to this many pixels
    class_dropout: float = 0.1   # fraction of GPT training rows whose class becomes the null class (CFG)

    def scaled(self, steps_scale: float) -> "DemoTrainingConfig":
        return DemoTrainingConfig(self.vq.scaled(steps_scale), self.target.scaled(steps_scale),
                                  self.draft.scaled(steps_scale), self.evaluator.scaled(steps_scale),
                                  self.max_shift, self.class_dropout)

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_EVALUATOR = EvaluatorConfig(num_classes=NUM_CLASSES)
assert IMAGE_SIZE == GRID_SIZE * vq_config().downsample

# Tuned on the trained demo (18 AR samples per class, seed 1): cfg 1.0 / 1.5 / 1.75 / 2.0 gave
# evaluator accuracy 0.80 / 0.93 / 0.97 / 0.96 and Fréchet distance 134 / 130 / 148 / 145
# (real-vs-real floor 61). 2.0 keeps samples recognisable at temperature 1, so the draft and
# target distributions stay non-trivial for speculative decoding. demo.json "quality" has
# the figures of the committed weights.
SAMPLING_DEFAULTS = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
