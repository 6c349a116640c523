"""`specrt generate`."""
import click

from specrt.commands._pending import not_yet


@click.command(name="generate", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Generate images for class ids (demo models by default)."""
    raise not_yet("specrt generate", 2)
