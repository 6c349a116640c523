"""The unified demo's sizes, schedules and sampling defaults, in one place.

Sizes are the t2i demo's GPTs in Chameleon's architecture (qk-norm, SwiGLU, 1D rotary positions):
a 4-layer, 192-wide target and a 1-layer, 64-wide draft, so accepted lengths compare with the
t2i demo's. Both learn from scratch (no warm start: Chameleon's layers and 1D positions are not
LlamaGen's), which the 2-core CPU affords at these sizes in about 20 minutes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specrt.export.demo.configs import Schedule
from specrt.export.demo.unified import vocabulary as voc

# the longest prompt is 16 template tokens + 10 caption words + 3 image-prefix tokens; the stream
# is 8 × (8 + 1) tokens and the image end and end of turn follow: 104 positions, 128 leaves room
MAX_POSITIONS = 128


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int


TARGET = ModelSize(hidden_size=192, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512)
DRAFT = ModelSize(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=192)

# transformers' ChameleonForConditionalGeneration always builds a ChameleonVQVAE (encoder and
# quantizer only: it has no decoder). The demo's images are decoded by the t2i demo's VQ, as
# Lumina-mGPT decodes with Chameleon's original VQGAN, so this one is the smallest the class
# allows (GroupNorm needs 32 channels), sized like the demo VQ's codebook, and left untrained.
VQ_PLACEHOLDER = dict(embed_dim=8, num_embeddings=voc.CODEBOOK_SIZE, latent_channels=8, resolution=voc.IMAGE_SIZE,
                      base_channels=32, channel_multiplier=[1], num_res_blocks=1, attn_resolutions=[])


def chameleon_config(size: ModelSize):
    """A transformers ChameleonConfig over the demo's vocabulary (vocabulary_map = the whole vocabulary)."""
    from specrt.lazy import require

    transformers = require("transformers", "the unified demo's models")
    return transformers.ChameleonConfig(
        vocab_size=voc.VOCAB_SIZE, hidden_size=size.hidden_size, intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers, num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_attention_heads, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=voc.VOCAB[voc.BOS], pad_token_id=voc.VOCAB[voc.PAD], eos_token_id=voc.VOCAB[voc.EOS],
        vocabulary_map=dict(voc.VOCAB), vq_config=dict(VQ_PLACEHOLDER), tie_word_embeddings=False,
        attention_dropout=0.0)


@dataclass
class UnifiedTrainingConfig:
    """Everything `python -m specrt.export.demo.unified.training` needs besides the seed (demo.json)."""

    target: Schedule = field(default_factory=lambda: Schedule(steps=1600, batch_size=32, lr=1e-3, weight_decay=0.05))
    draft: Schedule = field(default_factory=lambda: Schedule(steps=1600, batch_size=32, lr=3e-3, weight_decay=0.01))
    max_shift: int = 2            # the t2i demo's augmentation: every image under 25 shifts
    caption_dropout: float = 0.1  # rows that take Lumina-mGPT's unconditional input (CFG)

    def scaled(self, steps_scale: float) -> "UnifiedTrainingConfig":
        return UnifiedTrainingConfig(self.target.scaled(steps_scale), self.draft.scaled(steps_scale), self.max_shift,
                                     self.caption_dropout)

    def to_dict(self) -> dict:
        return asdict(self)


# Lumina-mGPT samples with temperature 1, CFG 3-4 and image top-k 2000 of 8192 codes; of 512 codes
# a top-k of 2000 keeps everything, so top_k 0 (off). cfg_scale is set from the quality sweep.
SAMPLING_DEFAULTS = {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
