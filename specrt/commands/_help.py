"""`--help` in sections: the options most people use first, the rest under named headings.

Why: `specrt generate`, `export` and `bench` take 30 to 40 options each; listed flat, the few a
newcomer needs (a method, a class or prompt, an output file) are lost among backend, profile and
checkpoint-layout flags. A command made with `cls=SectionedCommand` lists its options in the
sections it names instead; the options themselves (names, defaults, callbacks) are untouched, only
the help layout changes. An option no section names is still listed, under "Other options", so a
new option is never hidden from --help.

The documentation site's CLI reference (mkdocs-click, plain style) calls click.Command's own
format_options, so there every option is listed in one block; the mathematics behind the methods'
parameters lives in docs/concepts/methods.md, which METHODS_DOC names in each epilog.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import click

COMMON = "Common options"
OTHER = "Other options"
METHODS_DOC = "Methods and their parameters, with the mathematics: docs/concepts/methods.md"


def _demo_short_help() -> str:
    """--demo's help in a few lines: the names, the default, where each is described. The
    registry's summaries (export.demo.registry.help_text) run to a dozen lines in --help, more
    than the rest of the common options together; docs/guides/demos.md holds them."""
    from specrt.export.demo.registry import DEFAULT_DEMO, demo_names

    return (f"Embedded demo, used when no BUNDLE or checkpoints are given: {', '.join(demo_names())} "
            f"(default {DEFAULT_DEMO}; t2i and chameleon take prompts). docs/guides/demos.md describes each.")


DEMO_SHORT_HELP = _demo_short_help()


class SectionedCommand(click.Command):
    """A click command whose --help lists options in sections.

    `sections`: (title, parameter names) pairs in the order shown; the first is the handful of
    options most people use first (title COMMON by convention). Names are the Python parameter
    names (`class_ids` for --class); "help" places the --help option. A name that is not one of
    the command's parameters raises ValueError when the command is defined, so a renamed option
    cannot silently fall out of its section."""

    def __init__(self, *args: Any, sections: Sequence[tuple[str, Sequence[str]]] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections: list[tuple[str, tuple[str, ...]]] = [(title, tuple(names)) for title, names in sections]
        known = {param.name for param in self.params} | {"help"}
        seen: set[str] = set()
        for title, names in self.sections:
            for name in names:
                if name not in known:
                    raise ValueError(f"help section {title!r} of `{self.name}` names {name!r}, not an option of it")
                if name in seen:
                    raise ValueError(f"help sections of `{self.name}` name {name!r} twice")
                seen.add(name)

    def grouped_options(self, ctx: click.Context) -> list[tuple[str, list[click.Parameter]]]:
        """The non-empty sections as (title, options) in display order, every option of the
        command in exactly one (the unnamed ones last, under OTHER)."""
        options = [param for param in self.get_params(ctx) if isinstance(param, click.Option)]
        by_name = {param.name: param for param in options}
        help_option = self.get_help_option(ctx)
        if help_option is not None:  # click names it privately; sections call it "help"
            by_name["help"] = help_option
        groups = [(title, [by_name[name] for name in names if name in by_name]) for title, names in self.sections]
        placed = {id(param) for _, members in groups for param in members}
        groups.append((OTHER, [param for param in options if id(param) not in placed]))
        return [(title, members) for title, members in groups if members]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each section as click's own definition list under its title."""
        for title, members in self.grouped_options(ctx):
            records = [record for record in (param.get_help_record(ctx) for param in members)
                       if record is not None]  # hidden options have none
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def sectioned(name: str, sections: Sequence[tuple[str, Iterable[str]]], epilog: Optional[str] = None,
              **attrs: Any) -> Any:
    """`click.command(name, cls=SectionedCommand, ...)` with `sections` and an epilog that ends
    with the one line pointing to the methods' documentation."""
    text = METHODS_DOC if epilog is None else f"{epilog}\n\n{METHODS_DOC}"
    return click.command(name=name, cls=SectionedCommand, sections=[(t, tuple(n)) for t, n in sections],
                         epilog=text, **attrs)
