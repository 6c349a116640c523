"""Each unified-vocabulary model's own prompt, unconditional prompt and sampling defaults, as data.

A bundle must prompt the model the way the model's own code does, or it generates worse
images than the original; and the runtime has only `tokenizers` and numpy (no transformers,
no chat templates). So the export resolves each model's recipe into a JSON block of the
manifest (`prompt`): a text template, the special-token ids around it (looked up by name, so
a tiny test vocabulary works like the real one), the padding id and the rule that builds the
unconditional (CFG) row. `encode_prompts` turns user prompts into the prefill's left-padded
`input_ids` / `prompt_mask` rows, [cond; uncond], from that block alone.

A row is `prefix_ids + encode(template with {prompt}) + suffix_ids` (the text encoded with
add_special_tokens=False: the block's ids are the special tokens). The prompt ends with the
tokens the model's code forces before the first image token (docs/contracts.md,
"Unified-vocabulary models"). Unconditional rows:
- {"kind": "pad", "keep_first": n, "keep_last": m}: the cond row with every token but its
  first n and last m replaced by pad_id, same length, all attended (Janus).
- {"kind": "prompt", "text": t, "template": s}: t through template s, same prefix / suffix (Emu3's
  negative prompt).
- {"kind": "ids", "ids": [...]}: exactly these ids (Lumina-mGPT: image start + size tokens).

`Recipe.sources` says where each fact comes from and flags what could not be checked here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError

PROMPT_SLOT = "{prompt}"

# Janus / Janus-Pro (DeepSeek's tokenizer: full-width bars U+FF5C, U+2581 "▁").
JANUS_BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
JANUS_PAD = "<\uff5c\u2581pad\u2581\uff5c>"
JANUS_BOI = "<begin_of_image>"
JANUS_TEMPLATE = "<|User|>: {prompt}\n\n<|Assistant|>:"

# Emu3-Gen.
EMU3_BOS = "<|extra_203|>"
EMU3_PAD = "<|endoftext|>"
EMU3_BOI = "<|image start|>"
EMU3_IMAGE_WRAPPER = "<|image token|>"
EMU3_POSITIVE = " masterpiece, film grained, best quality."
EMU3_NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                 "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry.")
EMU3_DEFAULT_AREA = 518400  # Emu3Processor.image_area: 720 x 720 pixels
EMU3_SPATIAL = 8

# Lumina-mGPT (Chameleon vocabulary).
LUMINA_BOS = "<s>"
LUMINA_PAD = "<pad>"
LUMINA_TURN_END = "<reserved08706>"  # Conversation.sep_token, after every turn's text
LUMINA_IMAGE_START = "<racm3:break>"
LUMINA_TEMPLATE = "Generate an image of {W}x{H} according to the following prompt:\n{prompt}"
LUMINA_PATCH = 32  # pixels per size token unit; 2 VQ tokens (VQGAN downsample 16)
LUMINA_DEFAULT_GRID = (48, 48)  # Lumina-mGPT-7B-768


def lumina_size_token(n_patches: int) -> str:
    """Lumina-mGPT's size token for n 32-pixel patches (FlexARItemProcessor.get_n_grids_token)."""
    return f"<reserved{8800 + n_patches:05d}>"


@dataclass(frozen=True)
class Recipe:
    """One model's prompt block (manifest `prompt`), sampling defaults, grid and provenance."""

    architecture: str
    prompt: dict[str, Any]
    sampling_defaults: dict[str, float]
    grid: tuple[int, int]
    sources: dict[str, str] = field(default_factory=dict)


class _Vocab:
    """Token ids by name: the tokenizer first, then config.json's `vocabulary_map`."""

    def __init__(self, tokenizer: Any, config: dict, architecture: str):
        self.tokenizer, self.architecture = tokenizer, architecture
        self.config_map = config.get("vocabulary_map") or {}

    def find(self, name: str) -> Optional[int]:
        found = self.tokenizer.token_to_id(name)
        if found is None:
            found = self.config_map.get(name)
        return None if found is None else int(found)

    def id(self, name: str, role: str) -> int:
        found = self.find(name)
        if found is None:
            raise SpecrtError(f"{self.architecture}: the tokenizer has no {role} token {name!r} (the model's own "
                              "tokenizer.json is needed: its prompt format uses this token)")
        return found

    def text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)


def _pad_id(vocab: _Vocab, names: Sequence[str], config: dict) -> int:
    """Left padding is masked, so any id works; the model's own pad token where it has one."""
    for name in names:
        found = vocab.find(name)
        if found is not None:
            return found
    for scope in (config, config.get("text_config") or {}):
        if isinstance(scope.get("pad_token_id"), int):
            return scope["pad_token_id"]
    return 0


def _janus(config: dict, vocab: _Vocab, grid: Optional[tuple[int, int]], downsample: Optional[int] = None) -> Recipe:
    if grid is None:
        vq, vision = config.get("vq_config") or {}, config.get("vision_config") or {}
        side = vq.get("num_patches") or (vision.get("image_size", 384) // vision.get("patch_size", 16))
        grid = (int(side), int(side))
    prompt = {
        "template": JANUS_TEMPLATE,
        "strip": True,
        "prefix_ids": [vocab.id(JANUS_BOS, "begin-of-sentence")],
        "suffix_ids": [vocab.id(JANUS_BOI, "begin-of-image")],
        "pad_id": vocab.id(JANUS_PAD, "pad"),
        "uncond": {"kind": "pad", "keep_first": 1, "keep_last": 1},
    }
    sources = {
        "template": "transformers convert_janus_weights_to_hf.py CHAT_TEMPLATE (user turn '<|User|>: ' + text stripped + "
                    "'\\n\\n', generation prompt '<|Assistant|>:'), = DeepSeek Janus sft_format 'deepseek' with an empty "
                    "system prompt; JanusProcessor(generation_mode='image') appends tokenizer.boi_token",
        "prefix_ids": "the tokenizer's BOS, which JanusProcessor's LlamaTokenizerFast adds (add_bos_token); we add it "
                      "explicitly and encode the text with add_special_tokens=False",
        "uncond": "JanusForConditionalGeneration.generate: the unconditional half is the prompt with every token but BOS "
                  "and begin_of_image replaced by generation_config.pad_token_id (same attention mask); DeepSeek's "
                  "generation_inference.py: tokens[1:-1] = pad_id",
        "pad_id": "convert_janus_weights_to_hf.py: generation_config.pad_token_id = vocab['<｜▁pad▁｜>']",
        "sampling_defaults": "convert_janus_weights_to_hf.py generation_config (guidance_scale 5, temperature 1); DeepSeek "
                             "generation_inference.py (cfg_weight 5, temperature 1, no top-k / top-p)",
        "grid": "vq_config.num_patches (= vision image_size // patch_size: 24 x 24 for Janus-Pro's 384 px)",
    }
    return Recipe("janus", prompt, {"cfg_scale": 5.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}, grid, sources)


def _emu3(config: dict, vocab: _Vocab, grid: Optional[tuple[int, int]], downsample: Optional[int] = None) -> Recipe:
    if grid is None:
        side = int(round(math.sqrt(config.get("image_area", EMU3_DEFAULT_AREA)) / EMU3_SPATIAL))
        grid = (side, side)
    rows, cols = grid
    suffix = [vocab.id(EMU3_BOI, "image-start"), *vocab.text(f"{rows}*{cols}"), vocab.id(EMU3_IMAGE_WRAPPER, "image-token")]
    prompt = {
        "template": PROMPT_SLOT + EMU3_POSITIVE,
        "positive_suffix": EMU3_POSITIVE,  # the template's fixed words, which a call may drop
        "strip": False,
        "prefix_ids": [vocab.id(EMU3_BOS, "begin-of-sentence")],
        "suffix_ids": suffix,
        "pad_id": _pad_id(vocab, [EMU3_PAD], config),
        "uncond": {"kind": "prompt", "text": EMU3_NEGATIVE, "template": PROMPT_SLOT},
    }
    sources = {
        "template": "baaivision/Emu3 image_generation.py: prompt += POSITIVE_PROMPT (' masterpiece, film grained, best "
                    "quality.'); transformers' Emu3 docs put the same words in the prompt text. Drop it from the template "
                    "to match Emu3Processor on the bare prompt",
        "prefix_ids": "Emu3Processor.prepare_inputs_layout prepends tokenizer.bos_token (<|extra_203|>, as Emu3-Gen's "
                      "tokenizer names it; the GPT tokenizer adds none itself)",
        "suffix_ids": "Emu3Processor(return_for_image_generation=True): f'{image_start_token}{height}*{width}"
                      "{fake_token_around_image}' = '<|image start|>' + 'H*W' (tokens, height first) + '<|image token|>'",
        "uncond": "baaivision/Emu3 image_generation.py NEGATIVE_PROMPT through the same processor (no positive suffix), "
                  "UnbatchedClassifierFreeGuidanceLogitsProcessor(unconditional_ids=neg_inputs.input_ids); transformers' "
                  "docs pass it as negative_prompt_ids",
        "pad_id": "<|endoftext|> (Emu3's pad_token_id); left padding is masked, the value does not matter",
        "sampling_defaults": "baaivision/Emu3 image_generation.py: classifier_free_guidance 3.0, top_k 2048, do_sample "
                             "(temperature 1.0, no top-p)",
        "grid": "Emu3Processor.calculate_generate_size('1:1', image_area 518400, 8) = 90 x 90 unless given",
    }
    return Recipe("emu3", prompt, {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2048, "top_p": 1.0}, grid, sources)


def _chameleon(config: dict, vocab: _Vocab, grid: Optional[tuple[int, int]], downsample: Optional[int] = None) -> Recipe:
    rows, cols = grid or LUMINA_DEFAULT_GRID
    if rows % 2 or cols % 2:
        raise SpecrtError(f"Lumina-mGPT images are whole 32-pixel patches (2 x 2 tokens): grid {rows}x{cols} must be even")
    start = vocab.id(LUMINA_IMAGE_START, "image-start")
    sizes = [vocab.id(lumina_size_token(rows // 2), "image-height"), vocab.id(lumina_size_token(cols // 2), "image-width")]
    downsample = downsample or LUMINA_PATCH // 2  # pixels per token: the template states the image's pixels
    template = LUMINA_TEMPLATE.replace("{W}", str(cols * downsample)).replace("{H}", str(rows * downsample))
    prompt = {
        "template": template,
        "strip": False,
        "prefix_ids": [vocab.id(LUMINA_BOS, "begin-of-sentence")],
        "suffix_ids": [vocab.id(LUMINA_TURN_END, "turn-end"), start, *sizes],
        "pad_id": _pad_id(vocab, [LUMINA_PAD], config),
        "uncond": {"kind": "ids", "ids": [start, *sizes]},
    }
    sources = {
        "template": "Lumina-mGPT README / SJD sample: qas=[[f'Generate an image of {w}x{h} according to the following "
                    "prompt:\\n{prompt}', None]] (w, h in pixels)",
        "prefix_ids": "xllmx MMConvItemProcessor.process_item: tokenizer.encode(conversation, bos=True); BOS by the name "
                      "'<s>' (Chameleon's) -- not checked against a real Lumina tokenizer here",
        "suffix_ids": "lumina_mgpt/data/convertsation.py: each human turn ends with sep_token '<reserved08706>' (assumed an "
                      "added token, so one id in running text); then the model itself emits '<racm3:break>' and the two "
                      "size tokens <reserved{8800+n:05d}> (height then width in 32-px patches; ids 8804+n in the real "
                      "vocabulary), which we force as the end of the prompt",
        "uncond": "inference_solver.py LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor: CFG starts "
                  "after the two size tokens, unconditional input_ids = input_ids[:, image_start_index:] (image start + "
                  "size tokens, no BOS, all attended)",
        "pad_id": "'<pad>' (Chameleon's); left padding is masked, the value does not matter",
        "sampling_defaults": "Lumina-mGPT README: create_logits_processor(cfg=4.0, image_top_k=2000), temperature 1.0 "
                             "(the function's own default cfg is 3.0); top-k applies to image tokens only",
        "grid": "Lumina-mGPT-7B-768: 768 x 768 pixels = 48 x 48 tokens unless given",
    }
    return Recipe("chameleon", prompt, {"cfg_scale": 4.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0},
                  (rows, cols), sources)


_RECIPES = {"janus": _janus, "emu3": _emu3, "chameleon": _chameleon}


def recipe_for(architecture: str, config: dict, tokenizer: Any, grid: Optional[tuple[int, int]] = None,
               downsample: Optional[int] = None) -> Recipe:
    """The recipe of `architecture` (janus | emu3 | chameleon, or a config class name) for a
    checkpoint's config.json and its `tokenizers.Tokenizer`; `grid` (rows, cols) defaults to
    the model's own; `downsample` is the decoder's pixels per token where a prompt states the
    image's size (Lumina-mGPT's "{W}x{H}"; its VQGAN's 16 by default). A special token the
    vocabulary lacks is one SpecrtError line."""
    from specrt.export.unified.vq import normalize_architecture  # one alias table for the family

    name = normalize_architecture(architecture)
    if grid is not None:
        grid = (int(grid[0]), int(grid[1]))
        if min(grid) < 1:
            raise SpecrtError(f"an image grid needs positive rows and cols, got {grid}")
    return _RECIPES[name](config, _Vocab(tokenizer, config, name), grid, downsample)


# ---- the runtime side (runtime/families/unified/prompts.py, numpy + tokenizers) --------------------


def encode_prompts(prompt_block: dict, tokenizer: Any, prompts: Sequence[str], cond_len: int,
                   with_uncond: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """User prompts -> (input_ids int32 [rows, cond_len], prompt_mask bool [rows, cond_len]),
    rows = [cond; uncond] (2N) with CFG, N without; left-padded (real tokens last), padding =
    pad_id under a False mask: the runtime's PromptEncoder on this block, as a bundle runs it."""
    from specrt.runtime.families.unified.prompts import PromptEncoder

    rows = PromptEncoder(prompt_block, cond_len, tokenizer).encode(list(prompts))
    if not with_uncond:
        return rows.prompt_ids, rows.caption_mask
    both = rows.with_uncond(0)
    return both.prompt_ids, both.caption_mask
