"""`specrt demo ...`: the embedded demo model family."""
import click

from specrt.commands._pending import not_yet


@click.group(name="demo")
def group() -> None:
    """Train and evaluate the embedded demo models (digits, LlamaGen architecture)."""


@group.command(name="train", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def train(args: tuple[str, ...]) -> None:
    """Train the demo tokenizer, target, draft and evaluator from scratch."""
    raise not_yet("specrt demo train", 3)
