"""Click flags in groups: one decorator adds a group's options to a command and hands the command
one dataclass of their values, one field per flag.

Why: `specrt generate` takes some thirty flags, and a function of thirty parameters hides which
belong together (what to draw, which model, how to sample, what to write, where it runs). A group
is defined once, beside the code that reads it, and a command that shares it (generate and export
share the checkpoint flags) gets the same options and the same dataclass. The options themselves
are untouched: names, defaults, callbacks and --help stay what click makes of them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence


def flag_group(name: str, group: type,
               options: Sequence[Callable[[Callable], Callable]]) -> Callable[[Callable], Callable]:
    """A decorator adding `options` (click.option decorators whose parameter names are the fields
    of the dataclass `group`) to a click command, which then takes one keyword `name`: a `group`
    built from their values."""
    fields = [field.name for field in dataclasses.fields(group)]

    def add_to(command: Callable) -> Callable:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = group(**{field: kwargs.pop(field) for field in fields})
            return command(*args, **{name: values}, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return add_to
