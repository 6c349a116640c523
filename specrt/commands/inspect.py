"""`specrt inspect BUNDLE`: print a bundle's manifest readably (any family: runtime/families) and
lint a LlamaGen-family bundle's graphs for TensorRT.

Exit code 0 when the lint finds no errors (warnings allowed), 1 when it finds errors, 2 for
a bundle that cannot be read (SpecrtError: missing files, bad hashes, wrong version). A bundle
made for onnxruntime on purpose (its int4 MatMulNBits graphs) runs here: its TensorRT findings
are notes, it is reported as onnxruntime-only and exits 0, unless --require-trt makes them errors.
"""
from __future__ import annotations

from pathlib import Path

import click


@click.command(name="inspect")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--lint/--no-lint", default=True, show_default=True, help="Check the graphs against TensorRT 10.3's ONNX parser.")
@click.option("--max-opset", type=int, default=20, show_default=True,
              help="Newest opset the target TensorRT parses (20 for TensorRT 10.3; raise it for newer stacks).")
@click.option("--require-trt", is_flag=True,
              help="The bundle must build on TensorRT: onnxruntime-only graphs (int4 MatMulNBits) are errors too.")
@click.pass_context
def command(ctx: click.Context, bundle: Path, lint: bool, max_opset: int, require_trt: bool) -> None:
    """Print a bundle's manifest and lint its graphs for TensorRT (exit 1 on lint errors; an
    onnxruntime-only bundle, e.g. int4 MatMulNBits, is a note unless --require-trt)."""
    from specrt.runtime.family_registry import read_bundle

    family, manifest = read_bundle(bundle)  # the manifest read once: what is wrong with it is one line
    click.echo(family.describe(manifest))  # the family's own checks first (runtime/families)
    if family.name != "llamagen" or not lint:  # the TensorRT lint knows the LlamaGen graphs' contract only
        return
    from specrt.export.lint import ERROR, NOTE, WARNING, lint_bundle
    from specrt.export.trt_ops import TRT_VERSION

    findings = lint_bundle(manifest, max_opset=max_opset)
    count = {severity: sum(f.severity == severity for f in findings) for severity in (ERROR, WARNING, NOTE)}
    notes = f", {count[NOTE]} note(s)" if count[NOTE] else ""
    click.echo(f"lint (TensorRT {TRT_VERSION}, opset <= {max_opset}): {count[ERROR]} error(s), "
               f"{count[WARNING]} warning(s){notes}")
    for finding in findings:
        click.echo(f"  {finding}")
    ort_only = list(dict.fromkeys(f.graph for f in findings if f.severity == NOTE))
    if ort_only:
        click.echo(f"runs on: onnxruntime only (ort, ort-cuda); TensorRT {TRT_VERSION} cannot build "
                   f"{', '.join(ort_only)}{' (--require-trt: an error)' if require_trt else ''}")
    if count[ERROR] or (require_trt and ort_only):
        ctx.exit(1)
