"""`specrt bench`."""
import click

from specrt.commands._pending import not_yet


@click.command(name="bench", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Measure every method's speed and fidelity side by side."""
    raise not_yet("specrt bench", 7)
