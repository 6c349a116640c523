"""Text encoders for text-to-image models, behind one small interface: prompts -> caption embeddings.

LlamaGen's t2i models read flan-t5-xl features (language/t5.py, T5Embedder): each prompt is
tokenised to `max_length` (120) tokens with the tokenizer's end-of-sequence token, padded on
the right and truncated; the encoder's last hidden state and the attention mask come back.
Every encoder here returns that pair, real tokens first; runtime.conditions then left-pads
them as LlamaGen's sampling script does. Prompts are lower-cased and stripped, T5Embedder's
behaviour without its optional caption cleaning (ftfy + BeautifulSoup), which is not
reproduced.

- `T5TextEncoder`: a flan-t5-style encoder from a local directory the user names, through
  `transformers` (torch; `pip install 'specrt[t2i]'`).
- `OnnxTextEncoder`: a bundle's own `text_encode` graph and `tokenizer.json` (onnxruntime
  and `tokenizers`, no torch), what `specrt export --text-encoder DIR` writes.
- `load_caption_file`: precomputed caption embeddings from a file, no encoder at all.
"""
from __future__ import annotations

import json
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from specrt.errors import SpecrtError, SpecrtWarning
from specrt.lazy import require

Encoded = tuple[np.ndarray, np.ndarray]  # float32 [N, L, D] embeddings, bool [N, L] mask (real tokens first)


def prepare_prompt(text: str) -> str:
    """T5Embedder.text_preprocessing without caption cleaning: lower-case, stripped."""
    return text.lower().strip()


class PromptChecker:
    """What a tokenizer makes of a user's prompt, said before any work: a prompt none of whose
    words the tokenizer knows is refused, unknown words and a prompt cut to the encoder's length
    are warned about (one line each, SpecrtWarning).

    Why: a model reads an unknown word as its `<unk>` token, the same for every unknown word, so
    a prompt made only of them conditions on nothing the user wrote — the t2i demo drew the same
    digit for "zzz qqq" as for any other nonsense, with exit 0 — and a prompt longer than the
    encoder's window loses its end without a word. Works on a `tokenizers.Tokenizer` (the
    bundle's tokenizer.json, or a transformers fast tokenizer's backend), copied without
    truncation or padding so the whole prompt is counted."""

    HINT_VOCAB = 1000  # a tokenizer this small (the demos' word lists) gets example words in the error

    def __init__(self, tokenizer: Any):
        tokenizers = require("tokenizers", "prompts")
        text = tokenizer.to_str()
        self.tokenizer = tokenizers.Tokenizer.from_str(text)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.unknown_id = _unknown_id(self.tokenizer, json.loads(text).get("model") or {})

    def check(self, prompt: str, index: int = 0, limit: Optional[int] = None, specials: bool = True,
              name: Optional[str] = None) -> list[int]:
        """`prompt`'s token ids (the tokenizer's specials included when `specials`), after
        refusing a prompt with no known word and warning about unknown words and, when `limit`
        is given, about a prompt longer than `limit` tokens (the encoder truncates it). Messages
        call it `name` (default "prompt INDEX"), so a negative prompt is named as such."""
        name = name or f"prompt {index}"
        encoding = self.tokenizer.encode(prompt, add_special_tokens=specials)
        words = [(token, start, stop) for token, (start, stop), special
                 in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask) if not special]
        if self.unknown_id is not None and words:
            unknown = list(dict.fromkeys(prompt[start:stop] for token, start, stop in words if token == self.unknown_id))
            if all(token == self.unknown_id for token, _, _ in words):
                raise SpecrtError(f"{name} ({prompt.strip()!r:.60}): no word of it is known to this model's "
                                  f"tokenizer, so the image could not follow it{self._hint()}")
            if unknown:
                shown = ", ".join(repr(w) for w in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
                warnings.warn(f"{name}: {len(unknown)} word(s) unknown to this model's tokenizer, read as "
                              f"nothing it knows: {shown}", SpecrtWarning, stacklevel=3)
        if limit is not None and len(encoding.ids) > limit:
            warnings.warn(f"{name} is {len(encoding.ids)} tokens; the text encoder reads its first {limit} "
                          "and the rest is cut", SpecrtWarning, stacklevel=3)
        return list(encoding.ids)

    def _hint(self) -> str:
        """A few words a small (closed) vocabulary knows, for the error; nothing for a real model's."""
        vocab = self.tokenizer.get_vocab()
        if len(vocab) > self.HINT_VOCAB:
            return ""
        words = [w for w, _ in sorted(vocab.items(), key=lambda item: item[1]) if w.isalpha() and w.islower()
                 and len(w) > 2][:8]
        return f"; it knows words such as {', '.join(words)}" if words else ""


def _unknown_id(tokenizer: Any, model: dict[str, Any]) -> Optional[int]:
    """The id the tokenizer gives words it does not know: its model's unk_token (WordLevel,
    WordPiece, BPE) or unk_id (Unigram: T5's sentencepiece); None for one that has none
    (byte-level BPE, as Janus's and Emu3's, never meets an unknown word)."""
    if isinstance(model.get("unk_id"), int):
        return int(model["unk_id"])
    name = model.get("unk_token")
    return tokenizer.token_to_id(name) if isinstance(name, str) else None


class TextEncoder(ABC):
    """prompts -> (embeddings [N, max_length, dim], mask [N, max_length]), T5's layout."""

    max_length: int
    dim: int

    @abstractmethod
    def encode(self, prompts: Sequence[str]) -> Encoded:
        ...

    def check(self, prompts: Sequence[str]) -> None:
        """Refuse prompts with no word the tokenizer knows, warn about unknown words and prompts
        longer than max_length (PromptChecker); without a `tokenizers` tokenizer, nothing."""
        checker = self._checker()
        if checker is not None:
            for index, prompt in enumerate(_check_prompts(prompts)):
                checker.check(prompt, index, limit=self.max_length)

    def _checker(self) -> Optional[PromptChecker]:
        if not hasattr(self, "_prompt_checker"):
            backend = getattr(self, "tokenizer", None)
            backend = getattr(backend, "backend_tokenizer", backend)  # a transformers fast tokenizer's own
            self._prompt_checker = PromptChecker(backend) if hasattr(backend, "to_str") else None
        return self._prompt_checker


def _check_prompts(prompts: Sequence[str]) -> list[str]:
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise SpecrtError("prompts must be a non-empty list of strings")
    return [prepare_prompt(p) for p in prompts]


class T5TextEncoder(TextEncoder):
    """transformers' T5EncoderModel and tokenizer from a local directory (float32, CPU or a device)."""

    def __init__(self, directory: str | Path, max_length: int = 120, device: Optional[str] = None):
        transformers = require("transformers", "T5 text encoders")
        self.torch = require("torch", "T5 text encoders")
        directory = Path(directory)
        if not (directory / "config.json").is_file():
            raise SpecrtError(f"{directory} is not a T5 model directory (no config.json)")
        transformers.utils.logging.disable_progress_bar()  # a local load: no "Loading weights" bar on stderr
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
            self.model = transformers.T5EncoderModel.from_pretrained(str(directory)).float().eval()
        except (OSError, ValueError) as exc:
            raise SpecrtError(f"cannot load a T5 encoder from {directory}: {str(exc).splitlines()[0]}") from exc
        if device is not None:
            self.model.to(device)
        self.max_length, self.dim = int(max_length), int(self.model.config.d_model)
        self.directory = directory

    def tokenize(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """T5Embedder's tokenisation: ids and attention mask, int64 [N, max_length]."""
        out = self.tokenizer(_check_prompts(prompts), max_length=self.max_length, padding="max_length",
                             truncation=True, return_attention_mask=True, add_special_tokens=True, return_tensors="np")
        return out["input_ids"].astype(np.int64), out["attention_mask"].astype(np.int64)

    def encode(self, prompts: Sequence[str]) -> Encoded:
        self.check(prompts)
        ids, mask = self.tokenize(prompts)
        torch = self.torch
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            hidden = self.model(input_ids=torch.from_numpy(ids).to(device),
                                attention_mask=torch.from_numpy(mask).to(device)).last_hidden_state
        return hidden.float().cpu().numpy(), mask.astype(bool)


class OnnxTextEncoder(TextEncoder):
    """A bundle's text encoder: `tokenizer.json` through `tokenizers`, the graph through onnxruntime."""

    def __init__(self, graph: str | Path, tokenizer: str | Path, max_length: int, pad_id: int, dim: int,
                 session: Any = None):
        tokenizers = require("tokenizers", "the bundle's text encoder")
        self.tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer))
        self.tokenizer.enable_truncation(int(max_length))
        self.tokenizer.enable_padding(length=int(max_length), pad_id=int(pad_id))
        if session is None:
            ort = require("onnxruntime", "the bundle's text encoder")
            session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        self.session, self.max_length, self.dim = session, int(max_length), int(dim)

    def tokenize(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch(_check_prompts(prompts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return ids, mask

    def encode(self, prompts: Sequence[str]) -> Encoded:
        self.check(prompts)
        ids, mask = self.tokenize(prompts)
        (embeddings,) = self.session.run(["embeddings"], {"input_ids": ids.astype(np.int32),
                                                          "attention_mask": mask.astype(np.int32)})
        return embeddings.astype(np.float32, copy=False), mask.astype(bool)


def text_encoder_from_manifest(manifest: Any, session: Any = None) -> Optional[OnnxTextEncoder]:
    """The bundle's text encoder, or None when it was exported without one."""
    entry = manifest.raw.get("text_encoder")
    if not entry:
        return None
    return OnnxTextEncoder(manifest.graph_path(entry["graph"]), manifest.root / entry["tokenizer"],
                           entry["max_length"], entry["pad_id"], entry["dim"], session)


def load_caption_file(path: str | Path) -> Encoded | tuple[np.ndarray, None]:
    """Precomputed caption embeddings: .npy [N, L, D] (every position real), or .npz /
    .safetensors holding `embeddings` [N, L, D] and optionally `mask` [N, L] (real tokens first)."""
    path = Path(path)
    if not path.is_file():
        raise SpecrtError(f"caption file not found: {path}")
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False), None
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        elif path.suffix == ".safetensors":
            from safetensors.numpy import load_file
            arrays = load_file(str(path))
        else:
            raise SpecrtError(f"caption file {path.name}: expected .npy, .npz or .safetensors")
    except (OSError, ValueError) as exc:
        raise SpecrtError(f"cannot read caption embeddings from {path}: {str(exc).splitlines()[0]}") from exc
    if "embeddings" not in arrays:
        raise SpecrtError(f"{path} holds no 'embeddings' array (found: {', '.join(sorted(arrays)) or 'nothing'})")
    return arrays["embeddings"], arrays.get("mask")
