"""The unified demo's one vocabulary: text words, Lumina-mGPT's structural tokens and 512 image tokens.

Why these names: the demo stands in for Lumina-mGPT (a Chameleon fine-tune), so every token the
exporter and runtime look up *by name* in a real checkpoint has that name here too:

- Chameleon's specials `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3 (its config's bos 0 / pad 1 / eos 2);
- the image tokens, ids 4.. in code order as in Chameleon (ids 4..8195), named as Chameleon's
  tokenizer names them: "IMGIMG" + one letter per decimal digit of the code (A = 0 … J = 9) + "Z",
  which is exactly what transformers' `ChameleonImageVocabularyMapping.bpe2img` decodes
  (it strips "IMGIMG" and the last character and maps the letters back to digits);
- Lumina-mGPT's structural tokens (lumina_mgpt/data/item_processor.py, inference_solver.py):
  `<racm3:break>` image start, `<eoss>` image end, `<reserved08799>` row end, the size tokens
  `<reserved{8800 + n:05d}>` and `<reserved08706>`, the conversation's end of turn (Lumina's
  `Conversation.sep_token`, id 8710, where its generate stops);
- the words of Lumina's prompt template and of the t2i demo's captions (lower-cased words and
  punctuation, the t2i demo's word-level scheme).

Size tokens: Lumina-mGPT writes n = the image side in 32-pixel patches and its VQ (×16) makes
a token grid of 2n per side; its decoder reads the grid back as 2·(id − id(<reserved08800>)).
The demo keeps that reading: an 8×8 grid is n = 4, so both size tokens (rows, then columns)
are `<reserved08804>`. (The demo's 32-pixel images would be n = 1 by pixels; the grid is what
the tokens describe, so the grid rule wins.)

This module is torch-free: the runtime, exporter and tests can read the layout without torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from specrt.lazy import require

from specrt.export.demo.t2i.captions import vocabulary as caption_words

# ---- the image --------------------------------------------------------------------------------
CODEBOOK_SIZE = 512   # the t2i demo's VQ (export.demo.configs.CODEBOOK_SIZE)
GRID = 8              # 8×8 codes per 32×32 image
IMAGE_SIZE = 32       # pixels per side: what the template's "{W}x{H}" says

# ---- Chameleon's specials (ids 0..3) --------------------------------------------------------
BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"
SPECIALS = (BOS, PAD, EOS, UNK)

# ---- Lumina-mGPT's structural tokens ----------------------------------------------------------
IMAGE_START = "<racm3:break>"
IMAGE_END = "<eoss>"
END_OF_TURN = "<reserved08706>"   # Lumina's Conversation.sep_token; generation stops at it
ROW_END = "<reserved08799>"       # Lumina's new_line_token


def size_token(n_grids: int) -> str:
    """Lumina-mGPT's FlexARItemProcessor.get_n_grids_token: n = token-grid side / 2."""
    return f"<reserved{8800 + n_grids:05d}>"


SIZE = size_token(GRID // 2)      # "<reserved08804>", for the rows and for the columns
STRUCTURAL = (IMAGE_START, IMAGE_END, END_OF_TURN, ROW_END, SIZE)

# ---- the prompt ----------------------------------------------------------------------------------
# Lumina-mGPT's sample scripts: f"Generate an image of {w}x{h} according to the following prompt:\n{prompt}"
TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{prompt}"


def image_token(code: int) -> str:
    """Chameleon's name of VQ code `code`: 'IMGIMG' + A..J for its decimal digits + 'Z'."""
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"a code is in 0..{CODEBOOK_SIZE - 1}, got {code}")
    return "IMGIMG" + "".join(chr(ord("A") + int(c)) for c in str(code)) + "Z"


def template_words() -> list[str]:
    """The template's words as the tokenizer splits them (lower-cased; '32x32' is one word)."""
    import re

    text = TEMPLATE.format(width=IMAGE_SIZE, height=IMAGE_SIZE, prompt="").lower()
    return re.findall(r"\w+|[^\w\s]+", text)  # what tokenizers' Whitespace pre-tokenizer does


def text_words() -> list[str]:
    """Every word a prompt can use: the template's, then the captions' (no repeats)."""
    return list(dict.fromkeys(template_words() + caption_words()))


def build_vocabulary() -> dict[str, int]:
    """name -> id: specials 0..3, image tokens 4..515 (code order), structural tokens, words.
    This is also the models' `vocabulary_map` (Chameleon keeps its whole vocabulary there)."""
    names = list(SPECIALS) + [image_token(c) for c in range(CODEBOOK_SIZE)] + list(STRUCTURAL) + text_words()
    if len(set(names)) != len(names):
        raise AssertionError("the unified demo's vocabulary names a token twice")
    return {name: i for i, name in enumerate(names)}


VOCAB = build_vocabulary()
VOCAB_SIZE = len(VOCAB)
FIRST_IMAGE_ID = VOCAB[image_token(0)]


def code_to_id(code: int) -> int:
    return VOCAB[image_token(code)]


def prompt_text(caption: str) -> str:
    """The human turn as Lumina-mGPT writes it: the template around the caption, then end of turn
    (its Conversation appends sep_token to every message; the assistant turn is the image)."""
    return TEMPLATE.format(width=IMAGE_SIZE, height=IMAGE_SIZE, prompt=caption) + END_OF_TURN


def image_prefix_ids() -> list[int]:
    """The tokens Lumina-mGPT's model emits before the first code and which the demo's prompt ends
    with: image start, rows, columns. Also the whole unconditional (CFG) prompt: Lumina's CFG
    branch is the sequence from the image-start token on, with no BOS and no text."""
    return [VOCAB[IMAGE_START], VOCAB[SIZE], VOCAB[SIZE]]


def image_suffix_ids() -> list[int]:
    """What follows the last row: end of image, then end of turn (not run by the runtime)."""
    return [VOCAB[IMAGE_END], VOCAB[END_OF_TURN]]


def stream_ids(codes: Sequence[int]) -> list[int]:
    """GRID×GRID raster-order codes -> the image stream in vocabulary ids: each row's codes, then
    the row-end token (Lumina's item_processor)."""
    if len(codes) != GRID * GRID:
        raise ValueError(f"an image has {GRID * GRID} codes, got {len(codes)}")
    out: list[int] = []
    for row in range(GRID):
        out += [FIRST_IMAGE_ID + int(c) for c in codes[row * GRID:(row + 1) * GRID]] + [VOCAB[ROW_END]]
    return out


# ---- the tokenizer -------------------------------------------------------------------------------

def build_tokenizer():
    """A `tokenizers.Tokenizer` over VOCAB: lower-cased words and punctuation (WordLevel +
    Whitespace), every non-word token an added token matched verbatim (so a prompt string may
    carry `<reserved08706>` or `<racm3:break>` as Lumina's do), and `<s>` put first (Lumina's
    tokenizer.encode(..., bos=True))."""
    tokenizers = require("tokenizers", "the unified demo's tokenizer")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(dict(VOCAB), unk_token=UNK))
    tokenizer.normalizer = tokenizers.normalizers.Lowercase()
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                                  for t in SPECIALS + STRUCTURAL])
    tokenizer.add_tokens([tokenizers.AddedToken(image_token(c), normalized=False, special=False)
                          for c in range(CODEBOOK_SIZE)])
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB[BOS])])
    tokenizer.decoder = tokenizers.decoders.WordPiece(prefix="##")  # words joined by spaces
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise AssertionError("added tokens changed the unified demo's vocabulary size")
    return tokenizer


def save_tokenizer(directory: str | Path) -> Path:
    """tokenizer.json (+ tokenizer_config.json, so transformers' AutoTokenizer reads it too)."""
    transformers = require("transformers", "the unified demo's tokenizer")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), bos_token=BOS, eos_token=EOS,
                                                pad_token=PAD, unk_token=UNK)
    fast.save_pretrained(str(directory))
    return Path(directory) / "tokenizer.json"


def encode_prompts(tokenizer, captions: Sequence[str]) -> list[list[int]]:
    """Each caption's whole conditional prompt: <s>, the template, end of turn, image start and
    the size tokens (real ids, no padding)."""
    prefix = image_prefix_ids()
    return [e.ids + prefix for e in tokenizer.encode_batch([prompt_text(c) for c in captions])]


def training_sequence(prompt_ids: Sequence[int] | None, codes: Sequence[int]) -> tuple[list[int], int]:
    """One training row and where its labels start: Lumina-mGPT's whole conversation (the human
    turn `prompt_ids`, which ends with the image prefix, then the image stream, image end and end
    of turn). The labels are Lumina's assistant turn, from the image-start token on (the prompt is
    not learnt). `prompt_ids` None is the unconditional row: the image prefix alone at position 0
    (Lumina's CFG branch), whose first label is the first size token."""
    prefix = image_prefix_ids()
    if prompt_ids is None:
        prompt_ids = prefix
    elif list(prompt_ids[-len(prefix):]) != prefix:
        raise ValueError("a conditional prompt ends with the image prefix (encode_prompts)")
    ids = list(prompt_ids) + stream_ids(codes) + image_suffix_ids()
    return ids, max(1, len(prompt_ids) - len(prefix))
