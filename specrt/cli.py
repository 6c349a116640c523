"""The `specrt` command line: a thin click layer over specrt.export, .runtime, .engines, .bench.

Every subcommand lives in specrt/commands/<name>.py and maps its flags onto one Python API
call. User mistakes raise SpecrtError, printed here as one line with exit code 2.
"""
import os
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import click

from specrt import __version__, termination
from specrt.commands._count_flags import bound_integers
from specrt.commands._path_flags import refuse_blank_paths
from specrt.commands import bench, build, demo, export, generate, inspect, plan_tree, quantize, serve, train_draft
from specrt.errors import SpecrtError, SpecrtWarning, Terminated


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specrt")
def cli() -> None:
    """specrt: ONNX/TensorRT deployment of autoregressive image generators with speculative decoding.

    \b
    Typical flow:
      specrt export --out bundle          # PyTorch models -> ONNX graphs + manifest.json
      specrt inspect bundle               # print the manifest, lint the graphs for TensorRT
      specrt quantize bundle --mode int4 --out q4   # INT4/INT8/FP8 graphs, or --self-draft int4
      specrt build bundle                 # TensorRT engines (on the deployment GPU)
      specrt generate bundle --method cool-sd --class 3 --out img.png
      specrt bench                        # every method's speed and fidelity, one run
      specrt plan-tree --out plan.json    # a draft tree sized for this device (static_tree=plan.json)
      specrt serve bundle                 # Triton Inference Server (PyTriton), HTTP + gRPC
      specrt train-draft --out head       # an EAGLE draft head for the target (then export --eagle head)

    With no model arguments every command uses the embedded demo models.
    """


for command in (export.command, quantize.command, build.command, generate.command, bench.command, plan_tree.command,
                inspect.command, serve.serve_command, serve.triton_repo_command, train_draft.command, demo.group):
    cli.add_command(command)
refuse_blank_paths(cli)  # an empty path (an unset variable) never reads as the current folder
bound_integers(cli)  # every integer a user types has a ceiling before any command runs


def _terminate(signum, frame) -> None:
    termination.request()  # read again where a writer commits, should this exception be swallowed
    raise Terminated()


def _redeliver_swallowed(previous_hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """An unraisable-exception hook that sends SIGTERM again when the Terminated it is handed was
    raised where Python cannot propagate it: a signal handler runs wherever the main thread is,
    and inside a weakref callback or __del__ (importlib's module-lock callbacks, say) the exception
    is printed as "Exception ignored in" and the command would go on as if never terminated. The
    second signal comes from a helper thread 50 ms later, so the main thread takes it once it has
    left the callback (sent at once, it would be handled inside it again). Other unraisables go to
    `previous_hook`."""
    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, Terminated):
            resend = threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGTERM))
            resend.daemon = True
            resend.start()
            return
        previous_hook(unraisable)
    return hook


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated (a KeyboardInterrupt) while the block runs, so it unwinds like
    Ctrl-C: temporary folders are removed, servers stop; the previous handler comes back after.
    A Terminated that lands where Python swallows exceptions is raised again (_redeliver_swallowed),
    and one that code swallows is raised again where a writer commits its output (specrt.termination)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    termination.clear()
    previous, previous_hook = signal.signal(signal.SIGTERM, _terminate), sys.unraisablehook
    sys.unraisablehook = _redeliver_swallowed(previous_hook)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook
        termination.clear()


@contextmanager
def warnings_as_lines() -> Iterator[None]:
    """SpecrtWarnings print as one line each, `specrt: warning: ...` on stderr, every time they are
    raised (Python's default shows a warning with its source line, once per place); other warnings
    go where they went before. The previous handlers come back after the block."""
    with warnings.catch_warnings():
        previous = warnings.showwarning
        warnings.simplefilter("always", SpecrtWarning)

        def show(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
            if issubclass(category, SpecrtWarning):
                click.echo(f"specrt: warning: {' '.join(str(message).split())}", err=True)
            else:
                previous(message, category, *args, **kwargs)

        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning SpecrtError into one line on stderr and exit code 2,
    Ctrl-C into exit code 130 and SIGTERM into 143, each after the command's cleanup ran."""
    try:
        # With standalone_mode=False click returns ctx.exit(code)'s code instead of exiting.
        with sigterm_as_interrupt(), warnings_as_lines():
            code = cli.main(args=argv, prog_name="specrt", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except SpecrtError as exc:
        click.echo(f"specrt: error: {exc}", err=True)
        sys.exit(2)
    except Terminated:  # outside click's own handling (its Abort below carries the cause)
        click.echo("specrt: terminated", err=True)
        sys.exit(143)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, Terminated):
            click.echo("specrt: terminated", err=True)
            sys.exit(143)
        click.echo("specrt: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        # a bad flag value is a user mistake like any other: one line, exit 2 (click's own
        # rendering adds a usage banner and a blank line)
        where = f" (specrt {exc.ctx.info_name})" if exc.ctx is not None and exc.ctx.parent is not None else ""
        message = " ".join(exc.format_message().split())
        click.echo(f"specrt: error: {message}{where}; see --help", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
