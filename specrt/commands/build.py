"""`specrt build`."""
import click

from specrt.commands._pending import not_yet


@click.command(name="build", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Build TensorRT engines from a bundle."""
    raise not_yet("specrt build", 6)
