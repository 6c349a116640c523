"""Every integer a command takes is bounded as it is parsed, before the command runs.

Why: `bench --images 99999999999999999999` once printed nothing for 91 s while it grew to 24 GB:
an integer flag without a ceiling reaches an allocation before any check. Each command checks its
own ranges (specrt.validation, with messages that say what the number means); this is the ceiling
under all of them, applied by specrt.cli to the whole command tree once, so a flag added later is
covered without an edit here: a seed is at most 2^64 − 1 (the C API's uint64_t), a port at most
65535, any other integer (a count, a size, a delay) at most validation.COUNT_MAX, in magnitude.
"""
from __future__ import annotations

from typing import Any, Optional

import click

from specrt.validation import COUNT_MAX, SEED_MAX

PORT_MAX = 65535


def ceiling_for(param: click.Parameter) -> int:
    """The largest magnitude `param` may take, by what its name says it is."""
    name = param.name or ""
    if "seed" in name:
        return SEED_MAX
    if name.endswith("port"):
        return PORT_MAX
    return COUNT_MAX


class _Ceiling:
    """Mixed into click's integer types: after their own conversion, refuse a magnitude above `ceiling`."""

    ceiling: int = COUNT_MAX

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        number = super().convert(value, param, ctx)  # type: ignore[misc]
        if isinstance(number, int) and abs(number) > self.ceiling:
            self.fail(f"{value} is out of range: at most {self.ceiling} (in magnitude)", param, ctx)  # type: ignore[attr-defined]
        return number


class BoundedInt(_Ceiling, click.types.IntParamType):
    """click's INT with a ceiling."""


class BoundedIntRange(_Ceiling, click.IntRange):
    """click.IntRange (its own bounds and help unchanged) with a ceiling."""


def bound_integers(command: click.Command) -> None:
    """Give every integer parameter of `command` and of its subcommands its ceiling (ceiling_for)."""
    for param in command.params:
        kind = type(param.type)
        if kind is click.types.IntParamType:
            param.type = BoundedInt()
        elif kind is click.IntRange:
            bounded = BoundedIntRange.__new__(BoundedIntRange)
            bounded.__dict__.update(param.type.__dict__)
            param.type = bounded
        else:
            continue
        param.type.ceiling = ceiling_for(param)
    for sub in getattr(command, "commands", {}).values():
        bound_integers(sub)
