"""`specrt quantize BUNDLE --out QBUNDLE`: INT8 / FP8 / INT4 graphs, or a quantized self-draft.

Flags map onto specrt.engines.quantize: --mode / --backend (--tool) / --block-size /
--accuracy-level / --calibration-* onto QuantizeOptions, the rest onto quantize_bundle.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from specrt.errors import SpecrtError
from specrt.runtime.threads import checked as checked_threads


@click.command(name="quantize")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True,
              help="Bundle directory to write (refused if it exists, unless --force).")
@click.option("--mode", help="int8 | fp8 | int4: quantize the --graphs of the bundle.")
@click.option("--self-draft", "self_draft", metavar="int4|int8",
              help="Instead of --mode: keep the target, make the draft a quantized copy of the target.")
@click.option("--graphs", default="target,draft", show_default=True, metavar="LIST",
              help="With --mode: roles (target, draft) or graph names (target_step, ...) to quantize.")
@click.option("--backend", "--tool", "tool", type=click.Choice(["onnxruntime", "modelopt"]),
              help="The quantizer, and so the runtime its graphs run fast on: onnxruntime (MatMulNBits, int4 or "
                   "int8 weights, for onnxruntime) or modelopt (QDQ for TensorRT; pip install 'specrt[quant]'). "
                   "Default: onnxruntime for int4, and for int8 on a machine without TensorRT or a GPU onnxruntime; "
                   "modelopt for fp8 and GPU machines' int8. --tool is its older name.")
@click.option("--block-size", type=int, default=None,
              help="int4, and onnxruntime's int8: weights per quantization block (default 32 for int4, 128 for int8).")
@click.option("--accuracy-level", type=int, default=4, show_default=True,
              help="onnxruntime: compute type of MatMulNBits (0 default/fp32, 4 int8: fastest on CPU).")
@click.option("--calibration-size", type=int, default=32, show_default=True,
              help="modelopt: feeds per graph kept for calibration (recorded from the bundle's own generations).")
@click.option("--calibration-images", type=int, default=4, show_default=True,
              help="modelopt: images generated (AR and SD in turn) to record calibration feeds from.")
@click.option("--calibration-method", help="modelopt: its calibration method (default: max for int8/fp8, rtn_dq for int4).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the calibration generations.")
@click.option("--threads", type=int, default=None, callback=checked_threads, help="onnxruntime threads while recording calibration feeds.")
@click.option("--force", is_flag=True, help="Replace an existing --out (only once the new bundle is complete).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress lines on stderr.")
def command(bundle: Path, out: Path, mode: Optional[str], self_draft: Optional[str], graphs: str, tool: Optional[str],
            block_size: Optional[int], accuracy_level: int, calibration_size: int, calibration_images: int,
            calibration_method: Optional[str], seed: int, threads: Optional[int], force: bool, progress: bool) -> None:
    """Write a quantized copy of a bundle (INT8 / FP8 / INT4 graphs, or a quantized self-draft)."""
    from specrt import validation
    from specrt.engines.quantize import MADE_FOR, QuantizeOptions, quantize_bundle
    from specrt.bundle_dir import refuse_existing
    from specrt.paths import output_folder

    output_folder("--out", out)  # its parent exists and takes files: before calibration
    refuse_existing(out, force)  # and --force replaces only a bundle or an empty folder
    if (mode is None) == (self_draft is None):
        raise SpecrtError("give exactly one of --mode int8|fp8|int4 and --self-draft int4|int8")
    if self_draft is not None and self_draft not in ("int4", "int8"):
        raise SpecrtError(f"--self-draft must be int4 or int8, got {self_draft!r}")
    options = QuantizeOptions(mode=mode or self_draft, tool=tool, block_size=block_size, accuracy_level=accuracy_level,
                              calibration_size=calibration_size, calibration_images=calibration_images,
                              calibration_method=calibration_method, seed=seed)
    if threads is not None:
        validation.threads("--threads", threads)
    names = [g.strip() for g in graphs.split(",") if g.strip()]
    if not names:
        raise SpecrtError("--graphs is empty")
    say = (lambda msg: click.echo(msg, err=True)) if progress else None
    manifest = quantize_bundle(bundle, out, options, names, self_draft=self_draft is not None, force=force,
                               threads=threads, progress=say)
    done = [name for name, spec in manifest.graphs.items() if spec.quantization]
    made_for = ", ".join(MADE_FOR[options.tool, options.mode])
    click.echo(f"wrote {manifest.root}: {', '.join(done)} {options.mode} ({options.tool}, runs fast on {made_for}); "
               f"check it with: specrt inspect {out}")
