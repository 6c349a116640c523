"""Prompts -> token ids as each unified-vocabulary model's own code builds them (numpy + tokenizers).

A bundle's manifest carries the recipe (the "prompt" block, written by specrt export from the
model's own conventions, specrt.export.unified.recipes) and its tokenizer.json, so generating from
text needs neither transformers nor torch:

    ids = prefix_ids + tokenize(template with {prompt} replaced) + suffix_ids

The unconditional (CFG) prompt is the model's own (docs/contracts.md, "Unified-vocabulary
models"): `pad` (Janus: the prompt with every token but the first `keep_first` and last
`keep_last` replaced by `pad_id`), `prompt` (Emu3: another text, the negative prompt, through its
own `template`, same prefix and suffix) or `ids` (Lumina-mGPT: exactly the listed ids, the
image-start and size tokens). `strip` strips the user's text first (Janus's chat template).
Both rows are left-padded to the bundle's cond_len (real tokens last; runtime.conditions).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from specrt import validation
from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.conditions import Conditions

UNCOND_KINDS = ("pad", "prompt", "ids")


class PromptEncoder:
    """A model's prompt recipe and tokenizer: prompts (or ready token ids) -> Conditions."""

    def __init__(self, recipe: dict[str, Any], cond_len: int, tokenizer: Any = None, vocab_size: Optional[int] = None):
        self.recipe, self.cond_len, self.tokenizer = dict(recipe), int(cond_len), tokenizer
        self.vocab_size = vocab_size  # the model's text vocabulary: prompt_ids are checked against it
        self.template = str(self.recipe.get("template", "{prompt}"))
        self.prefix = [int(i) for i in self.recipe.get("prefix_ids", [])]
        self.suffix = [int(i) for i in self.recipe.get("suffix_ids", [])]
        self.pad_id = int(self.recipe.get("pad_id", 0))
        self.uncond = dict(self.recipe.get("uncond") or {"kind": "ids"})
        self._checker: Any = None  # a runtime.text.PromptChecker over the tokenizer, made on first use
        if self.uncond.get("kind") not in UNCOND_KINDS:
            raise SpecrtError(f"prompt recipe: uncond kind must be one of {', '.join(UNCOND_KINDS)}, "
                              f"got {self.uncond.get('kind')!r}")

    @classmethod
    def from_files(cls, recipe: dict[str, Any], cond_len: int, root: Path,
                   vocab_size: Optional[int] = None) -> "PromptEncoder":
        """The recipe of a manifest whose tokenizer file (recipe["tokenizer"]) lies under `root`;
        a recipe without one takes token ids only (generate(prompt_ids=...))."""
        tokenizer = None
        name = recipe.get("tokenizer")
        if name:
            path = Path(root) / name
            if not path.is_file():
                raise SpecrtError(f"bundle: the prompt recipe's tokenizer {name} is missing")
            tokenizers = require("tokenizers", "prompts of unified-vocabulary models")
            try:
                tokenizer = tokenizers.Tokenizer.from_file(str(path))
            except Exception as exc:  # tokenizers raises its own exception type
                raise SpecrtError(f"bundle: cannot read {name}: {(str(exc).splitlines() or [''])[0]}") from None
        return cls(recipe, cond_len, tokenizer, vocab_size)

    # ---- one row ---------------------------------------------------------------------------------

    def ids(self, prompt: str, template: Optional[str] = None, index: int = 0) -> list[int]:
        """The conditional prompt's token ids (through `template`, by default the recipe's).

        The user's text is checked on its own first (runtime.text.PromptChecker): one with no word
        the tokenizer knows is refused, since the template's words alone would condition the image,
        and unknown words are warned about. A prompt longer than the bundle's cond_len is refused
        by left_pad (a unified model reads its prompt whole, so it is never cut)."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecrtError("a prompt must be a non-empty string")
        if self.tokenizer is not None:
            if self._checker is None:
                from specrt.runtime.text import PromptChecker

                self._checker = PromptChecker(self.tokenizer)
            self._checker.check(prompt.strip() if self.recipe.get("strip") else prompt, index, specials=False)
        return self._row(prompt, self.template if template is None else template)

    def _row(self, text: str, template: str) -> list[int]:
        if self.tokenizer is None:
            raise SpecrtError("this model has no tokenizer (its checkpoint had no tokenizer.json): give token ids "
                              "with prompt_ids=...")
        if self.recipe.get("strip"):  # Janus's chat template strips the user's text
            text = text.strip()
        body = template.replace("{prompt}", text)
        ids = list(self.tokenizer.encode(body, add_special_tokens=False).ids) if body else []
        return self.prefix + ids + self.suffix

    def null_ids(self, ids: Sequence[int]) -> list[int]:
        """The unconditional prompt the model's code pairs with the prompt `ids`."""
        kind, ids = self.uncond["kind"], list(ids)
        if kind == "pad":
            first, last = int(self.uncond.get("keep_first", 1)), int(self.uncond.get("keep_last", 1))
            keep_to = max(first, len(ids) - last)
            return ids[:first] + [self.pad_id] * (keep_to - first) + ids[keep_to:]
        if kind == "prompt":
            return self._row(str(self.uncond.get("text", "")), str(self.uncond.get("template", self.template)))
        return [int(i) for i in self.uncond.get("ids", self.suffix)]

    # ---- a batch ----------------------------------------------------------------------------------

    def encode(self, prompts: Optional[Sequence[str]] = None,
               prompt_ids: Optional[Sequence[Sequence[int]]] = None) -> Conditions:
        """Conditions of token prompts (and their unconditional twins) from text or from ids."""
        if (prompts is None) == (prompt_ids is None):
            raise SpecrtError("give prompts or prompt_ids (one of them)")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not prompts:
                raise SpecrtError("no prompts given")
            rows = [self.ids(p, index=i) for i, p in enumerate(prompts)]
        else:
            high = None if self.vocab_size is None else int(self.vocab_size) - 1
            rows = [[validation.integer(f"prompt_ids[{r}][{j}]", i, low=0, high=high, strings=False)
                     for j, i in enumerate(row)] for r, row in enumerate(_rows_of(prompt_ids))]
        nulls = [self.null_ids(row) for row in rows]
        ids, mask = self.left_pad(rows)
        if not all(nulls):  # no unconditional prompt (no recipe): fine until CFG asks for one
            return Conditions.of_prompt_ids(ids, mask)
        null_ids, null_mask = self.left_pad(nulls, "the unconditional prompt of prompt")
        return Conditions.of_prompt_ids(ids, mask, null_ids, null_mask)

    def left_pad(self, rows: Sequence[Sequence[int]], what: str = "prompt") -> tuple[np.ndarray, np.ndarray]:
        """int32 [N, cond_len] ids (pad_id before each row's tokens) and bool [N, cond_len] mask."""
        ids = np.full((len(rows), self.cond_len), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(rows), self.cond_len), dtype=bool)
        for i, row in enumerate(rows):
            if not row:
                raise SpecrtError(f"{what} {i} has no tokens")
            if len(row) > self.cond_len:
                raise SpecrtError(f"{what} {i} is {len(row)} tokens; this model reads at most {self.cond_len} "
                                  "(export with a larger --max-prompt-tokens)")
            ids[i, self.cond_len - len(row):] = row
            mask[i, self.cond_len - len(row):] = True
        return ids, mask


def _rows_of(prompt_ids: Any) -> list[list[int]]:
    """prompt_ids as a list of rows: one row (a flat list of ints) or several."""
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__iter__"):
        raise SpecrtError(f"prompt_ids must be a list of token ids or of such lists, got {prompt_ids!r:.40}")
    rows = list(prompt_ids)
    if rows and all(not hasattr(v, "__iter__") for v in rows):
        rows = [rows]
    if not rows:
        raise SpecrtError("no prompt ids given")
    if any(isinstance(row, (str, bytes)) or not hasattr(row, "__iter__") for row in rows):
        raise SpecrtError("prompt_ids must be a list of token ids, or one such list per prompt")
    return [list(row) for row in rows]
