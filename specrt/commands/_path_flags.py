"""Every path a command takes (its click.Path flags and arguments) refuses an empty or blank value.

Why: a script's `--out "$OUT"` with OUT unset hands specrt "", and pathlib reads "" as "." — the
current folder. Read that way, `export --out "" --force` once replaced the current folder with a
bundle. An empty path names nothing the user meant, so it is one line and exit 2 on every
command, before the command runs. specrt.cli applies this to the whole command tree once, so a
flag added later is covered without an edit here.
"""
from __future__ import annotations

from typing import Any, Optional

import click


class NamedPath(click.Path):
    """click.Path that refuses "" and blank values (everything else is click.Path's own check)."""

    name = "path"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} names no file or folder (an unset variable?); give a path", param, ctx)
        return super().convert(value, param, ctx)


def refuse_blank_paths(command: click.Command) -> None:
    """Make every click.Path parameter of `command` and of its subcommands a NamedPath (in place:
    the flags' other settings stay as declared)."""
    for param in command.params:
        if type(param.type) is click.Path:
            param.type.__class__ = NamedPath
    for sub in getattr(command, "commands", {}).values():
        refuse_blank_paths(sub)


def nonblank(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[str]:
    """A click callback for text flags that name a file or a thing (--eagle HEAD, --draft-tree TREE,
    --serve-url HOST:PORT): "" or blanks there are an unset variable, not "the default"."""
    if isinstance(value, str) and not value.strip():
        raise click.BadParameter(f"{value!r} names nothing (an unset variable?); give a value or leave the flag out",
                                 ctx=ctx, param=param)
    return value
