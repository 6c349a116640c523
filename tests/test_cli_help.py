"""`--help` of the big commands fits a screen: the description and the common options first, the
rest in named sections, every option still listed, the mathematics in the docs."""
from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from specrt.cli import cli
from specrt.commands._help import COMMON, METHODS_DOC, OTHER, SectionedCommand

COMMANDS = ("generate", "export", "bench")
SCREEN = 60  # lines before the first section of less-used options


def _help(name: str) -> list[str]:
    result = CliRunner().invoke(cli, [name, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def _headings(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, title) of every option section: an unindented line ending in a colon."""
    return [(i, line[:-1]) for i, line in enumerate(lines) if re.fullmatch(r"[A-Z][^ ].*:", line)]


@pytest.mark.parametrize("name", COMMANDS)
def test_common_options_come_first_and_fit_a_screen(name):
    lines = _help(name)
    headings = _headings(lines)
    assert headings[0][1] == COMMON, headings
    assert len(headings) >= 4, f"{name}: expected named sections, got {headings}"
    first_less_used = headings[1][0]
    assert first_less_used <= SCREEN, f"{name} --help: {first_less_used} lines before {headings[1][1]!r}"
    common = "\n".join(lines[headings[0][0]:first_less_used])
    assert "--help" in common


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_the_command_sections(name):
    command = cli.commands[name]
    assert isinstance(command, SectionedCommand)
    titles = [title for _, title in _headings(_help(name))]
    assert titles == [title for title, _ in command.sections], titles  # every section shown, no stray "Other"
    assert OTHER not in titles


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_is_listed(name):
    """Compared against the command's params, so an option cannot be lost from --help."""
    command = cli.commands[name]
    text = "\n".join(_help(name))
    ctx = click.Context(command, info_name=name, parent=click.Context(cli, info_name="specrt"))
    options = [param for param in command.get_params(ctx) if isinstance(param, click.Option)]
    assert len(options) > 20
    for option in options:
        for flag in option.opts + option.secondary_opts:
            assert re.search(rf"(^|[\s,/]){re.escape(flag)}([\s,=\[]|$)", text, re.M), f"{name}: {flag} missing"
    listed = [param for _, members in command.grouped_options(ctx) for param in members]
    assert sorted(id(p) for p in listed) == sorted(id(p) for p in options)  # each exactly once


@pytest.mark.parametrize("name", COMMANDS)
def test_mathematics_lives_in_the_docs(name):
    text = "\n".join(_help(name))
    for notation in ("δ", "ω", "λ", "Eq. "):
        assert notation not in text, f"{name} --help still writes {notation!r}"
    assert " ".join(METHODS_DOC.split()) in " ".join(text.split())


def test_a_section_naming_no_option_is_refused_when_the_command_is_defined():
    with pytest.raises(ValueError, match="not an option"):
        @click.command(cls=SectionedCommand, sections=[(COMMON, ["missing"])])
        @click.option("--present")
        def broken(present):
            pass


def test_an_option_no_section_names_is_still_listed():
    @click.command(cls=SectionedCommand, sections=[(COMMON, ["first"])])
    @click.option("--first")
    @click.option("--forgotten", help="still here")
    def sample(first, forgotten):
        pass

    out = CliRunner().invoke(sample, ["--help"]).output
    assert out.index("Common options:") < out.index("--first") < out.index("Other options:") < out.index("--forgotten")


def test_options_still_parse_as_before(tmp_path, capsys):
    """The layout changed, not the options: a refused value is still one line and exit 2."""
    from cli_helpers import one_line, run

    code, err = run(["generate", "--seed", "-1", "--out", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "--seed" in one_line(err)
