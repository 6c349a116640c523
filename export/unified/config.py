"""What specrt needs to know about a unified-vocabulary checkpoint, read from its config.json.

Janus / Janus-Pro, Emu3 and Lumina-mGPT (Chameleon) keep their language model's shapes in
different places of config.json (Janus and Emu3 in `text_config`, Chameleon at the top) and
their image tokens in different ways (Emu3 and Chameleon name them in `vocabulary_map`, Janus
has a separate codebook head). UnifiedConfig flattens that into one record so the model, the
weight loader and the exporter never look at the raw json. Token ids are always looked up by
name: a tiny test vocabulary and a real one put the same token at different ids.

Generation-time choices that the checkpoint does not fix (the image grid of Emu3 / Chameleon,
the longest prompt) come in from the caller (`read_config(dir, grid=..., cond_len=...)`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.runtime.grammar import ImageGrammar

SUPPORTED = ("janus", "emu3", "chameleon")

# `architectures` entries / `model_type` values -> our architecture name. Lumina-mGPT's own class
# (ChameleonXLLMXForConditionalGeneration) keeps model_type "chameleon".
_ARCHITECTURES = {
    "JanusForConditionalGeneration": "janus", "JanusModel": "janus",
    "Emu3ForConditionalGeneration": "emu3", "Emu3Model": "emu3",
    "ChameleonForConditionalGeneration": "chameleon", "ChameleonModel": "chameleon",
    "ChameleonXLLMXForConditionalGeneration": "chameleon",
}

DEFAULT_COND_LEN = 128
# Emu3-Gen's sample code asks for 720x720 (spatial factor 8 -> 90x90 tokens); Lumina-mGPT's
# 768-pixel models make 48x48 (factor 16).
DEFAULT_GRIDS = {"emu3": (90, 90), "chameleon": (48, 48)}
DEFAULT_THETA = {"janus": 10000.0, "emu3": 1000000.0, "chameleon": 10000.0}

EMU3_VISUAL = re.compile(r"^<\|visual token (\d+)\|>$")
EMU3_ROW_END = "<|extra_200|>"
EMU3_FRAME_END = "<|extra_201|>"
CHAMELEON_ROW_END = "<reserved08799>"
CHAMELEON_IMAGE_START = "<racm3:break>"
CHAMELEON_IMAGE_END = "<eoss>"
CHAMELEON_QK_NORM_EPS = 1e-5  # transformers' ChameleonLayerNorm hard-codes it


@dataclass
class UnifiedConfig:
    """One unified-vocabulary checkpoint's language model, image tokens and generation choices.

    `image_token_ids[n]` is the vocabulary id of VQ code n (None for Janus, whose codes have
    their own embedding and head); `row_end_id` the vocabulary id of the row-end token (None
    for Janus). `vocab_size` is the *head* vocabulary (codes, then structural tokens), what
    the exported graphs' logits cover; `text_vocab_size` the full one.
    """

    architecture: str
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    dim: int
    ffn_hidden: int
    text_vocab_size: int
    norm_eps: float
    inv_freq: list[float]
    rope_scaling: float
    grammar: ImageGrammar
    cond_len: int
    qk_norm: bool = False
    swin_norm: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    tie_embeddings: bool = False
    image_token_ids: Optional[tuple[int, ...]] = None
    row_end_id: Optional[int] = None
    pad_id: Optional[int] = None
    bos_id: Optional[int] = None
    eos_id: Optional[int] = None
    boi_id: Optional[int] = None
    special_ids: dict[str, int] = field(default_factory=dict)
    # Janus's generation path: codebook size, code embedding width, aligner depth, head width
    gen_codebook: int = 0
    gen_embed_dim: int = 0
    gen_aligner_layers: int = 0
    gen_projection_dim: int = 0
    gen_head_dim: int = 0
    gen_act: str = "gelu"
    max_positions: int = 0

    @property
    def vocab_size(self) -> int:
        """The head vocabulary (what step/prefill logits cover)."""
        return self.grammar.vocab_size

    @property
    def image_vocab(self) -> int:
        return self.grammar.image_vocab

    def capacity(self, max_window: int) -> int:
        """KV slots one image needs: the prompt, the whole stream (row ends included), a window."""
        return self.cond_len + self.grammar.stream_len + max_window


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file; missing or malformed is one SpecrtError line."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecrtError(f"{path} not found: a Hugging Face checkpoint directory has a config.json") from None
    except json.JSONDecodeError as err:
        raise SpecrtError(f"{path} is not valid JSON ({err})") from None


def detect_architecture(raw: dict[str, Any]) -> str:
    """The architecture from `architectures` (first) or `model_type`; one SpecrtError line otherwise."""
    for name in raw.get("architectures") or []:
        if name in _ARCHITECTURES:
            return _ARCHITECTURES[name]
    if raw.get("model_type") in SUPPORTED:
        return raw["model_type"]
    seen = ", ".join(raw.get("architectures") or []) or raw.get("model_type") or "none named"
    raise SpecrtError(f"unsupported architecture ({seen}); supported: Janus / Janus-Pro "
                      f"(JanusForConditionalGeneration), Emu3 (Emu3ForConditionalGeneration), "
                      f"Lumina-mGPT / Chameleon (ChameleonForConditionalGeneration)")


def _first_id(value: Any) -> Optional[int]:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def rope_tables(directory: Path, architecture: str, text: dict[str, Any], head_dim: int) -> tuple[list[float], float]:
    """(inv_freq, attention scaling) exactly as the model's rotary embedding computes them.

    The default rope is computed here (1 / θ^(2i/d), as transformers' compute_default_rope_parameters);
    every other type (linear, llama3, yarn, longrope, dynamic) goes through transformers' own
    ROPE_INIT_FUNCTIONS on the checkpoint's own text config, so each is right by construction.
    Dynamic types are taken at their initial frequencies (no re-scaling past max_position_embeddings).
    """
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        theta = float(params.get("rope_theta", text.get("rope_theta", DEFAULT_THETA[architecture])))
        if float(params.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))) != 1.0:
            raise SpecrtError("partial rotary embeddings are not supported for unified-vocabulary models")
        import torch  # the same float32 ops as transformers, so the frequencies agree to the bit

        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq.tolist(), 1.0
    try:
        import transformers
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        raise SpecrtError(f"rope type {rope_type!r} needs transformers installed (pip install transformers)") from None
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise SpecrtError(f"rope type {rope_type!r} is not one transformers {transformers.__version__} knows")
    config = transformers.AutoConfig.from_pretrained(str(directory)).get_text_config()
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
    return inv_freq.float().tolist(), float(scaling)


def _grid(architecture: str, grid: Optional[tuple[int, int]]) -> tuple[int, int]:
    rows, cols = grid if grid is not None else DEFAULT_GRIDS[architecture]
    if rows < 1 or cols < 1:
        raise SpecrtError(f"an image grid needs positive rows and columns, got {rows}x{cols}")
    return int(rows), int(cols)


def _named(vocab: dict[str, int], name: str, architecture: str) -> int:
    if name not in vocab:
        raise SpecrtError(f"{architecture} checkpoint: token {name!r} is not in the checkpoint's vocabulary (vocabulary_map / tokenizer.json)")
    return int(vocab[name])


def emu3_image_ids(vocab: dict[str, int]) -> tuple[int, ...]:
    """Vocabulary ids of Emu3's VQ codes in code order (`<|visual token NNNNNN|>`, NNNNNN = code)."""
    codes = {int(m.group(1)): int(i) for name, i in vocab.items() if (m := EMU3_VISUAL.match(name))}
    if not codes or sorted(codes) != list(range(len(codes))):
        raise SpecrtError("emu3 checkpoint: vocabulary_map's <|visual token NNNNNN|> entries do not number 0..n-1")
    return tuple(codes[c] for c in range(len(codes)))


def chameleon_image_ids(vocab: dict[str, int]) -> tuple[int, ...]:
    """Vocabulary ids of Chameleon's VQ codes in code order: `IMGIMG<digits spelt A..J>Z` names code
    <digits> (transformers' ChameleonImageVocabularyMapping.bpe2img)."""
    spell = {chr(ord("A") + i): str(i) for i in range(10)}
    codes = {}
    for name, i in vocab.items():
        if name.startswith("IMGIMG"):
            digits = "".join(spell.get(c, c) for c in name[len("IMGIMG"):-1])
            if not digits.isdigit():
                raise SpecrtError(f"chameleon checkpoint: image token {name!r} does not spell a code number")
            codes[int(digits)] = int(i)
    if not codes or sorted(codes) != list(range(len(codes))):
        raise SpecrtError("chameleon checkpoint: vocabulary_map's IMGIMG tokens do not number codes 0..n-1")
    return tuple(codes[c] for c in range(len(codes)))


def tokenizer_vocabulary(directory: Path) -> dict[str, int]:
    """Token name -> id from the directory's tokenizer.json (model vocabulary and added tokens);
    empty when there is none. The fallback for checkpoints whose config.json has no vocabulary_map."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return {}
    raw = read_json(path)
    vocab = (raw.get("model") or {}).get("vocab") or {}
    vocab = dict(vocab) if isinstance(vocab, dict) else {}  # (unigram models list pairs: no names we need)
    vocab.update({t["content"]: int(t["id"]) for t in raw.get("added_tokens") or []})
    return vocab


def _text_section(architecture: str, raw: dict[str, Any]) -> dict[str, Any]:
    if architecture == "chameleon":
        return raw
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise SpecrtError(f"{architecture} checkpoint: config.json has no text_config")
    return text


def read_config(directory: str | Path, grid: Optional[tuple[int, int]] = None,
                cond_len: Optional[int] = None) -> UnifiedConfig:
    """UnifiedConfig of the checkpoint directory `directory` (config.json, optional generation_config.json).

    grid: (rows, cols) of the generated image for Emu3 / Chameleon (Janus's is fixed by its config;
    a different one is an error); cond_len: the longest prompt in tokens (default 128).
    """
    directory = Path(directory)
    raw = read_json(directory / "config.json")
    arch = detect_architecture(raw)
    generation = read_json(directory / "generation_config.json") if (directory / "generation_config.json").is_file() else {}
    text = _text_section(arch, raw)
    cond_len = DEFAULT_COND_LEN if cond_len is None else int(cond_len)
    if cond_len < 1:
        raise SpecrtError(f"cond_len must be positive, got {cond_len}")

    dim, n_head = int(text["hidden_size"]), int(text["num_attention_heads"])
    n_kv_head = int(text.get("num_key_value_heads") or n_head)
    # Chameleon ignores head_dim (hidden // heads); Llama (Janus) and Emu3 honour it when set
    head_dim = dim // n_head if arch == "chameleon" else int(text.get("head_dim") or dim // n_head)
    inv_freq, scaling = rope_tables(directory, arch, text, head_dim)

    extra: dict[str, Any] = {}
    if arch == "janus":
        vq, vision = raw.get("vq_config") or {}, raw.get("vision_config") or {}
        tokens = int(vision.get("num_image_tokens", 576))
        side = int(vq.get("num_patches") or vision.get("image_size", 384) // vision.get("patch_size", 16))
        if side * side != tokens:
            raise SpecrtError(f"janus checkpoint: {tokens} image tokens do not make a {side}x{side} grid")
        if grid is not None and tuple(grid) != (side, side):
            raise SpecrtError(f"janus generates a {side}x{side} grid (its config), not {grid[0]}x{grid[1]}")
        codebook = int(vq.get("num_embeddings", 16384))
        grammar = ImageGrammar(side, side, codebook, row_end=False)
        boi = (generation.get("generation_kwargs") or {}).get("boi_token_id")
        if boi is None:
            boi = tokenizer_vocabulary(directory).get("<begin_of_image>")
        extra = dict(gen_codebook=codebook, gen_embed_dim=int(vq.get("embed_dim", 8)),
                     gen_aligner_layers=int(vq.get("num_hidden_layers", 2)),
                     gen_projection_dim=int(vq.get("projection_dim", 2048)),
                     gen_head_dim=int(vq.get("image_token_embed_dim", 2048)),
                     gen_act=str(vq.get("hidden_act", "gelu")), boi_id=_first_id(boi),
                     tie_embeddings=bool(raw.get("tie_word_embeddings", True)))
        if extra["gen_projection_dim"] != dim or extra["gen_head_dim"] != dim:
            raise SpecrtError(f"janus checkpoint: the generation aligner/head width ({extra['gen_projection_dim']}, "
                              f"{extra['gen_head_dim']}) differs from the language model's {dim}")
    else:
        vocab = raw.get("vocabulary_map") or tokenizer_vocabulary(directory)
        if not vocab:
            raise SpecrtError(f"{arch} checkpoint: neither config.json's vocabulary_map nor a tokenizer.json names "
                              f"its tokens")
        rows, cols = _grid(arch, grid)
        if arch == "emu3":
            ids, row_end = emu3_image_ids(vocab), _named(vocab, EMU3_ROW_END, arch)
            specials = ("<|image start|>", "<|image end|>", "<|image token|>", EMU3_FRAME_END, EMU3_ROW_END)
        else:
            ids, row_end = chameleon_image_ids(vocab), _named(vocab, CHAMELEON_ROW_END, arch)
            specials = (CHAMELEON_IMAGE_START, CHAMELEON_IMAGE_END, CHAMELEON_ROW_END)
        grammar = ImageGrammar(rows, cols, len(ids), row_end=True)
        extra = dict(image_token_ids=ids, row_end_id=row_end,
                     special_ids={n: int(vocab[n]) for n in specials if n in vocab},
                     tie_embeddings=bool(raw.get("tie_word_embeddings", False)))
        if arch == "chameleon":
            extra.update(qk_norm=True, swin_norm=bool(raw.get("swin_norm", False)))

    return UnifiedConfig(
        architecture=arch, n_layer=int(text["num_hidden_layers"]), n_head=n_head, n_kv_head=n_kv_head,
        head_dim=head_dim, dim=dim, ffn_hidden=int(text["intermediate_size"]),
        text_vocab_size=int(text["vocab_size"]), norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        inv_freq=inv_freq, rope_scaling=scaling, grammar=grammar, cond_len=cond_len,
        attention_bias=bool(text.get("attention_bias", False)), mlp_bias=bool(text.get("mlp_bias", False)),
        hidden_act=str(text.get("hidden_act", "silu")),
        pad_id=_first_id(generation.get("pad_token_id", text.get("pad_token_id"))),
        bos_id=_first_id(generation.get("bos_token_id", text.get("bos_token_id"))),
        eos_id=_first_id(generation.get("eos_token_id", text.get("eos_token_id"))),
        max_positions=int(text.get("max_position_embeddings", 0)), **extra,
    )

