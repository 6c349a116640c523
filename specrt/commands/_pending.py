"""Shared refusal for subcommands whose implementation has not landed yet."""
from specrt.errors import SpecrtError


def not_yet(what: str, issue: int) -> SpecrtError:
    """A plain refusal (exit code 2), never fake output, for a feature still being built."""
    return SpecrtError(f"{what} is not implemented yet (tracked as issue {issue})")
