"""`specrt export`."""
import click

from specrt.commands._pending import not_yet


@click.command(name="export", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Export target, draft and VQ decoder to an ONNX bundle."""
    raise not_yet("specrt export", 4)
