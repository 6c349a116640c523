"""`specrt build`: TensorRT engines for a bundle, or the trtexec lines that build them."""
from __future__ import annotations

import click


@click.command(name="build")
@click.argument("bundle", type=click.Path(file_okay=False, path_type=str))
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True,
              help="Engine precision; norms and softmax stay fp32 (TensorRT 11: the graph is converted first).")
@click.option("--workspace", default="4G", show_default=True,
              help="TensorRT workspace memory pool limit (K/M/G suffix; a plain number is MiB).")
@click.option("--max-window", type=int, default=None,
              help="Build for windows up to N (below the exported max) to save engine memory.")
@click.option("--graph", "graphs", multiple=True, help="Build only this graph (repeatable); default: every graph.")
@click.option("--print-trtexec", is_flag=True,
              help="Print the equivalent trtexec lines instead of building (no TensorRT needed).")
@click.option("--trt-major", type=click.IntRange(10, None), default=None,
              help="With --print-trtexec: target TensorRT major (default: the installed one, else 10 as on JetPack 6).")
@click.option("--force", is_flag=True, help="Rebuild even when a matching engine is cached.")
def command(bundle: str, precision: str, workspace: str, max_window: int | None, graphs: tuple[str, ...],
            print_trtexec: bool, trt_major: int | None, force: bool) -> None:
    """Build TensorRT engines from a bundle (one per graph, cached per GPU + TensorRT version)."""
    from specrt.engines.build import build_bundle, require_tensorrt
    from specrt.engines.precision import trt_major as major_of
    from specrt.engines.trtexec import parse_size, trtexec_script
    from specrt.lazy import available

    workspace_bytes = parse_size(workspace)
    if print_trtexec:
        if trt_major is None:
            trt_major = major_of(require_tensorrt().__version__) if available("tensorrt") else 10
        click.echo(trtexec_script(bundle, precision, workspace_bytes, max_window, trt_major, list(graphs) or None))
        return
    require_tensorrt()  # fail at once, before reading anything
    results = build_bundle(bundle, precision, workspace_bytes, max_window, force, list(graphs) or None,
                           progress=click.echo)
    built = sum(r.built for r in results)
    click.echo(f"done: {built} built, {len(results) - built} cached")
