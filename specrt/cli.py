"""The `specrt` command line: a thin click layer over specrt.export, .runtime, .engines, .bench.

Every subcommand lives in specrt/commands/<name>.py and maps its flags onto one Python API
call. User mistakes raise SpecrtError, printed here as one line with exit code 2.
"""
import sys

import click

from specrt import __version__
from specrt.commands import bench, build, demo, export, generate, inspect, quantize, serve, train_draft
from specrt.errors import SpecrtError


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
      specrt serve bundle                 # Triton Inference Server (PyTriton), HTTP + gRPC
      specrt train-draft --out head       # an EAGLE draft head for the target (then export --eagle head)

    With no model arguments every command uses the embedded demo models.
    """


for command in (export.command, quantize.command, build.command, generate.command, bench.command, inspect.command,
                serve.serve_command, serve.triton_repo_command, train_draft.command, demo.group):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning SpecrtError into one line on stderr and exit code 2."""
    try:
        # With standalone_mode=False click returns ctx.exit(code)'s code instead of exiting.
        code = cli.main(args=argv, prog_name="specrt", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except SpecrtError as exc:
        click.echo(f"specrt: error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
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
