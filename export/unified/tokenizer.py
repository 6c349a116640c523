"""A unified-vocabulary checkpoint's tokenizer.json, read as the bundle will run it.

Both ways into a unified export read it here: Hugging Face checkpoint directories
(export.unified.sources) and the chameleon demo's shipped checkpoints (export.demo.unified).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from specrt.errors import SpecrtError
from specrt.lazy import require


def read_tokenizer(directory: Path) -> tuple[Any, Optional[Path]]:
    """(tokenizers.Tokenizer, its file) of a checkpoint directory, (None, None) without tokenizer.json."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return None, None
    tokenizers = require("tokenizers", "unified-vocabulary prompts")
    try:
        return tokenizers.Tokenizer.from_file(str(path)), path
    except Exception as exc:  # tokenizers raises its own exception type
        raise SpecrtError(f"cannot read {path}: {(str(exc).splitlines() or [''])[0]}") from None
