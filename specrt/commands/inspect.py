"""`specrt inspect`."""
import click

from specrt.commands._pending import not_yet


@click.command(name="inspect", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Print a bundle's manifest and lint its graphs for TensorRT."""
    raise not_yet("specrt inspect", 4)
