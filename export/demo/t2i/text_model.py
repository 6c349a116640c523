"""The t2i demo's text encoder: a small T5 encoder over a word-level tokenizer, trained here.

Why T5's own classes: the demo's encoder then takes the same road as LlamaGen's flan-t5-xl —
a transformers directory (config.json, model.safetensors, tokenizer.json) that
runtime.text.T5TextEncoder loads on torch and `specrt export` turns into the bundle's
`text_encode` graph + tokenizer.json, which runtime.text.OnnxTextEncoder runs with
onnxruntime and `tokenizers` alone. Word-level, because the captions use a closed
vocabulary (export.demo.t2i.captions.vocabulary); T5's special tokens keep their ids
(pad 0, </s> 1 appended to every prompt, unk 2).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from specrt.lazy import require

from specrt.export.demo.t2i.captions import vocabulary

SPECIAL = {"<pad>": 0, "</s>": 1, "<unk>": 2}


@dataclass(frozen=True)
class TextEncoderConfig:
    """T5 encoder sizes; d_model is the captions' width (the GPTs' caption_dim)."""

    d_model: int = 64
    d_kv: int = 16
    d_ff: int = 128
    num_layers: int = 2
    num_heads: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


def build_tokenizer():
    """A transformers fast tokenizer: lower-cased words and punctuation, </s> appended."""
    tokenizers = require("tokenizers", "the t2i demo's tokenizer")
    transformers = require("transformers", "the t2i demo's tokenizer")
    vocab = {**SPECIAL, **{w: i + len(SPECIAL) for i, w in enumerate(vocabulary())}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = tokenizers.normalizers.Lowercase()
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>")


def build_encoder(config: TextEncoderConfig, vocab_size: int):
    """A randomly initialised T5EncoderModel (no dropout: the demo is small and trained briefly)."""
    transformers = require("transformers", "the t2i demo's text encoder")
    t5 = transformers.T5Config(vocab_size=vocab_size, d_model=config.d_model, d_kv=config.d_kv, d_ff=config.d_ff,
                               num_layers=config.num_layers, num_heads=config.num_heads, dropout_rate=0.0,
                               feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
                               pad_token_id=SPECIAL["<pad>"], eos_token_id=SPECIAL["</s>"])
    return transformers.T5EncoderModel(t5)


def save_text_encoder(model, tokenizer, directory: str | Path) -> Path:
    """The transformers directory runtime.text.T5TextEncoder and `specrt export` read."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory
