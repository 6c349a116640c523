"""Whether SIGTERM arrived while a CLI command runs, read again where a writer commits its output.

Why: the CLI's handler raises Terminated wherever the main thread happens to be, and code that
swallows BaseException there loses it: the run goes on and exits 0 with its output in place, the
stop request ignored (seen, rarely, while torch.onnx exported the demo's graphs). The handler also
sets this flag, and the writers check it just before they rename their work into place
(bundle_dir.move_into_place, atomic_file.atomic_path), so a SIGTERM never ends in a committed
output, whatever swallowed its exception. Pure Python, no torch."""
from __future__ import annotations

import threading

from specrt.errors import Terminated

_requested = threading.Event()


def request() -> None:
    """SIGTERM arrived (the CLI's signal handler)."""
    _requested.set()


def clear() -> None:
    """A command starts or ends: no stop is pending."""
    _requested.clear()


def stop_if_requested() -> None:
    """Raise Terminated when SIGTERM arrived and its first exception was swallowed somewhere."""
    if _requested.is_set():
        raise Terminated()
