"""What a unified-vocabulary bundle's manifest says beyond the discrete family's keys, read and checked.

The discrete checks (runtime/bundle_check.py) cover the graphs, the KV facts and the VQ decoder;
this module reads the two things only these bundles have: the image grammar of the target's
stream (models.target: grid_size rows, grid_cols, image_vocab, row_end) and the prompt recipe
("prompt": template, prefix/suffix ids, the unconditional rule, the tokenizer file).
"""
from __future__ import annotations

from typing import Any

from specrt import validation
from specrt.errors import SpecrtError
from specrt.runtime.grammar import ImageGrammar


def grammar_of(entry: dict[str, Any]) -> ImageGrammar:
    """The ImageGrammar of a manifest's models.target entry; its stream_len must agree."""
    def number(key: str, default: Any = None) -> int:
        return validation.integer(f"manifest models.target.{key}", entry.get(key, default), low=1, strings=False)

    row_end = entry.get("row_end", False)
    if not isinstance(row_end, bool):
        raise SpecrtError(f"manifest models.target.row_end must be true or false, got {row_end!r:.40}")
    grammar = ImageGrammar(rows=number("grid_size"), cols=number("grid_cols", entry.get("grid_size")),
                           image_vocab=number("image_vocab"), row_end=row_end)
    if number("stream_len", grammar.stream_len) != grammar.stream_len or number("vocab_size") != grammar.vocab_size:
        raise SpecrtError(f"manifest models.target: stream_len {entry.get('stream_len')} / vocab_size "
                          f"{entry.get('vocab_size')} disagree with the grammar ({grammar.stream_len} / {grammar.vocab_size})")
    return grammar


def prompt_recipe_of(raw: dict[str, Any]) -> dict[str, Any]:
    """The manifest's "prompt" block (docs/contracts.md), its id lists checked to be integers."""
    block = raw.get("prompt")
    if not isinstance(block, dict):
        raise SpecrtError("manifest: a unified-vocabulary bundle needs a 'prompt' object (its prompt recipe)")
    for key in ("prefix_ids", "suffix_ids"):
        ids = block.get(key, [])
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise SpecrtError(f"manifest prompt.{key} must be a list of token ids, got {ids!r:.60}")
    return block


def describe_unified(manifest: Any) -> str:
    """`specrt inspect`'s lines for the target's grammar and the prompt recipe."""
    entry = manifest.models["target"]
    grammar = grammar_of(entry)
    recipe = prompt_recipe_of(manifest.raw)
    ends = "a row-end token after every row" if grammar.row_end else "no structural tokens"
    return "\n".join([
        f"architecture: {entry.get('architecture', '?')} (unified vocabulary, {entry.get('text_vocab_size', '?')} ids)",
        f"image stream: {grammar.rows}x{grammar.cols} codes of {grammar.image_vocab}, {ends} "
        f"({grammar.stream_len} tokens per image); prompts up to {entry['cond_len']} tokens",
        f"prompt: template {recipe.get('template', '{prompt}')!r}, unconditional rule "
        f"{(recipe.get('uncond') or {}).get('kind', 'ids')}, tokenizer {recipe.get('tokenizer') or 'none (token ids only)'}",
    ])
