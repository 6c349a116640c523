"""In-flight batches on the host loop: a slot is refilled between two target passes."""
from __future__ import annotations

from typing import Any, Optional


def inflight_batch(pipeline: Any, request: Any, slots: int) -> Optional[Any]:
    """The in-flight batch for `request`'s group on `pipeline`, or None where there is none yet."""
    return None
