"""Flags in groups (specrt/commands/_flag_groups.py): a command gets one dataclass per group,
each flag still its own option."""
from dataclasses import dataclass
from typing import Optional

import click
from click.testing import CliRunner

from specrt.commands._flag_groups import flag_group


@dataclass(frozen=True)
class Size:
    width: int = 1
    height: Optional[int] = None


size_flags = flag_group("size", Size, [click.option("--width", type=int, default=1),
                                       click.option("--height", type=int)])


def test_a_command_gets_its_groups_values_as_one_dataclass():
    seen = []

    @click.command()
    @click.option("--name")
    @size_flags
    def command(name, size):
        seen.append((name, size))

    result = CliRunner().invoke(command, ["--name", "box", "--height", "3"])
    assert result.exit_code == 0, result.output
    assert seen == [("box", Size(width=1, height=3))]
    assert {"--width", "--height", "--name"} <= {opt for param in command.params for opt in param.opts}
