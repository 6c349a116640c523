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

Per call, a user may replace the unconditional row by a negative prompt of their own (the text
through the model's template, without the positive suffix), and drop `positive_suffix`, the
fixed words the recipe appends to every prompt (Emu3's " masterpiece, film grained, best
quality."), which must end the template.
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
        self.positive_suffix = str(self.recipe.get("positive_suffix") or "")
        if self.positive_suffix and not self.template.endswith(self.positive_suffix):
            raise SpecrtError(f"prompt recipe: positive_suffix {self.positive_suffix!r:.40} must end the template")
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

    def template_without_suffix(self) -> str:
        """The template with the recipe's positive suffix dropped (prompt_suffix=False); refused
        for a recipe that has none, since the flag would change nothing."""
        if not self.positive_suffix:
            raise SpecrtError("--no-prompt-suffix (prompt_suffix=False): this model's prompt recipe adds no fixed "
                              "suffix to drop")
        return self.template[:len(self.template) - len(self.positive_suffix)]

    def negative_ids(self, text: str) -> list[int]:
        """The unconditional row for the negative prompt `text`, in place of the recipe's own rule.

        Why through a template: the row must look like a prompt to the model, so the text goes
        through the same prefix / suffix ids as the prompt, and through the recipe's unconditional
        template where it has one (Emu3's negative prompt) or else the prompt template without
        its positive suffix (Janus's chat turn, Lumina-mGPT's instruction). An empty text is the
        row without words; text of no known word is refused, as for a prompt."""
        if not isinstance(text, str):
            raise SpecrtError(f"a negative prompt must be a string, got {text!r:.40}")
        if self.uncond.get("kind") == "prompt":
            template = str(self.uncond.get("template", "{prompt}"))
        else:
            template = self.template[:len(self.template) - len(self.positive_suffix)]
        if text.strip() and self.tokenizer is not None:
            if self._checker is None:
                from specrt.runtime.text import PromptChecker

                self._checker = PromptChecker(self.tokenizer)
            self._checker.check(text, specials=False, name="the negative prompt")
        return self._row(text, template)

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
               prompt_ids: Optional[Sequence[Sequence[int]]] = None, negative_prompt: Optional[str] = None,
               prompt_suffix: bool = True) -> Conditions:
        """Conditions of token prompts (and their unconditional twins) from text or from ids.

        `negative_prompt`: every image's unconditional row is this text (negative_ids) instead of
        the recipe's rule; `prompt_suffix=False`: text prompts go through the template without the
        recipe's positive suffix (ready prompt_ids are used as given, so it is refused with them)."""
        if (prompts is None) == (prompt_ids is None):
            raise SpecrtError("give prompts or prompt_ids (one of them)")
        template = None
        if not validation.flag("prompt_suffix", prompt_suffix):
            template = self.template_without_suffix()
            if prompts is None:
                raise SpecrtError("prompt_suffix=False applies to text prompts; prompt_ids are used as given")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not prompts:
                raise SpecrtError("no prompts given")
            rows = [self.ids(p, template=template, index=i) for i, p in enumerate(prompts)]
        else:
            high = None if self.vocab_size is None else int(self.vocab_size) - 1
            rows = [[validation.integer(f"prompt_ids[{r}][{j}]", i, low=0, high=high, strings=False)
                     for j, i in enumerate(row)] for r, row in enumerate(_rows_of(prompt_ids))]
        if negative_prompt is not None:
            nulls = [self.negative_ids(negative_prompt)] * len(rows)
        else:
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
