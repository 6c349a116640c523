"""Where the continuous demo's committed weights live and the sampling defaults they were tuned
for, read without torch: the hooks answer --help from here, and the loader (export.mar.demo)
finds the packaged weights here."""
from __future__ import annotations

import json
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent / "weights"
CONFIG_FILE = "mar.json"


def packaged_weights_dir() -> Path:
    return WEIGHTS


def packaged_sampling_defaults() -> dict:
    """cfg_scale / temperature / cfg_schedule from the packaged mar.json."""
    return json.loads((WEIGHTS / CONFIG_FILE).read_text())["sampling_defaults"]
