"""Where the t2i demo's committed weights live and the sampling defaults they were tuned for,
read without torch: the hooks (this package's __init__) answer --help from here, and the store
and the chameleon demo (which decodes with this demo's VQ) find the packaged weights here."""
from __future__ import annotations

import json
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent / "weights"


def packaged_weights_dir() -> Path:
    return WEIGHTS


def packaged_sampling_defaults() -> dict:
    return json.loads((WEIGHTS / "demo.json").read_text())["sampling_defaults"]
