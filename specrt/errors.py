"""The one exception type for mistakes a user can make.

The CLI turns a SpecrtError into one line on stderr and exit code 2; anything else is an
internal bug and keeps its traceback, so the two are never confused.
"""


class SpecrtError(Exception):
    """A user-facing error: bad input, a missing file, an optional dependency not installed."""


class MissingDependency(SpecrtError):
    """An optional dependency a feature needs (torch, TensorRT, ...) is not installed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (what `timeout`, systemd and `docker stop` send). The CLI raises it from its
    signal handler so it unwinds exactly like Ctrl-C: every `except BaseException` / `finally`
    that removes temporary files runs, and the process exits with 143 (128 + SIGTERM)."""


class SpecrtWarning(UserWarning):
    """Something a user should know about work that still goes ahead (a prompt cut to the text
    encoder's length, words its tokenizer does not know). The CLI prints it as one line,
    `specrt: warning: ...`, on stderr; the Python API raises it through `warnings`, so callers
    filter or escalate it the usual way."""
