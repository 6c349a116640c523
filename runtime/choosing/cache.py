"""`--method auto`'s choices on disk: measured once per (models, device, backend, batch, sampling,
guarantee), read back by every later call.

One JSON file per key under <user cache>/auto/ (specrt.paths.cache_root: $SPECRT_CACHE_DIR,
$XDG_CACHE_HOME/specrt or ~/.cache/specrt), named by a digest of the key and holding the key
itself, so a digest collision or a hand-edited file is caught by comparing them. Written
atomically (a temporary file in the same folder, renamed over the old one) with mode 0644: a
reader never sees half a file. A file that cannot be read, is not JSON, or does not hold what a
choice needs is ignored (the choice is measured again and the file replaced), never an error.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

from specrt.paths import cache_root

FORMAT = 1  # bump when a cached choice would mean something else (the key or the measurement changed)


def cache_folder(root: Optional[Path] = None) -> Path:
    return Path(root) if root is not None else cache_root() / "auto"


def entry_path(key: Mapping[str, Any], root: Optional[Path] = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return cache_folder(root) / f"{digest}.json"


def read_entry(path: Path, key: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The cached choice for `key` at `path`, or None (absent, damaged, or another key's)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != _plain(key):
        return None
    choice = data.get("choice")
    if not (isinstance(choice, dict) and isinstance(choice.get("method"), str) and isinstance(choice.get("params"), dict)
            and isinstance(choice.get("predicted_speedup"), (int, float))):
        return None
    return data


def write_entry(path: Path, key: Mapping[str, Any], choice: Mapping[str, Any], measured: list[dict[str, Any]]) -> None:
    """Write the entry atomically, mode 0644; the folder is made when missing (it is a cache)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": FORMAT, "key": _plain(key), "choice": dict(choice), "measured": measured},
                      indent=1, sort_keys=True, default=_number) + "\n"
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _plain(key: Mapping[str, Any]) -> Any:
    """The key as JSON reads it back (tuples become lists), so a stored key compares equal."""
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def _number(value: Any) -> Any:
    """JSON for the numpy scalars a measurement may hold (floats of the probe)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
