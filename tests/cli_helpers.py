"""The CLI in-process for tests: exit code and stderr, and the one-line error check."""
from __future__ import annotations


def run(argv: list[str], capsys) -> tuple[int, str]:
    from specrt.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    assert err.startswith("specrt: error: ") and err.count("\n") == 1, err
    return err


def exit_code(*args) -> int:
    """Run `specrt ARGS...` in-process and return its exit code (output goes to the test's
    captured streams, for capsys to read)."""
    from specrt.cli import main

    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code or 0
    return 0
