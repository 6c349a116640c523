"""Reproduce one onnxruntime-vs-PyTorch comparison with NVIDIA's polygraphy.

`specrt export --verify` is our own check; this module lets the same comparison run through
an independent tool (`polygraphy run --onnxrt`, CPU, no TensorRT), and later through
`--trt` on a GPU box with the same command plus one flag. Random inputs make no sense for
token ids, positions and masks, so polygraphy gets them from a data loader script; the
PyTorch outputs are saved as a polygraphy RunResults file:

    python -m specrt.export.polygraphy_case bundle --graph target_step --out pg_case
    polygraphy run bundle/target_step.onnx --onnxrt \\
        --data-loader-script pg_case/data_loader.py \\
        --load-outputs pg_case/torch_outputs.json --atol 1e-4 --rtol 0
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from specrt.errors import SpecrtError
from specrt.manifest import GraphSpec, Manifest, read_manifest

_LOADER = '''"""polygraphy --data-loader-script for {graph} of {bundle} (written by specrt.export.polygraphy_case)."""
from specrt.export.polygraphy_case import graph_feeds


def load_data():
    yield from graph_feeds({bundle!r}, {graph!r})
'''


def _step_feeds(manifest: Manifest, graph: GraphSpec, seed: int) -> Iterator[dict[str, np.ndarray]]:
    from specrt.export.verify import causal_case, tree_case

    config = _ConfigView(manifest.models[graph.role])
    capacity = config.capacity
    max_window = int(manifest.limits["max_window"])
    mid = (config.cond_len + config.cond_len + config.grid_size**2) // 2
    rng = np.random.default_rng(seed)
    cases = [causal_case("CFG", rng, config, capacity, 2, min(5, max_window), mid, cfg=True),
             tree_case("tree", rng, config, capacity, min(12, max_window), mid)]
    for case in cases:
        batch = case.input_ids.shape[0]
        kv_shape = graph.shape_at(graph.input("past_kv"), "max", batch=batch)
        yield {"input_ids": case.input_ids, "positions": case.positions, "attention_mask": case.attention_mask,
               "past_kv": rng.standard_normal(kv_shape).astype(np.float32)}


class _ConfigView:
    """The manifest's model entry with the attribute names the case builders read."""

    def __init__(self, entry: dict):
        self.__dict__.update(entry)


def graph_feeds(bundle: str | Path, graph_name: str, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Deterministic inputs for one graph, named and shaped from the manifest only."""
    manifest = read_manifest(bundle, check_hashes=False)
    graph = manifest.graph(graph_name)
    if graph.kind == "step":
        yield from _step_feeds(manifest, graph, seed)
    elif graph.kind == "prefill":
        entry = manifest.models[graph.role]
        yield {"class_ids": np.array([0, entry["null_class"]], dtype=np.int32)}
    else:
        rng = np.random.default_rng(seed)
        shape = graph.shape_at(graph.input("codes"), "opt")
        yield {"codes": rng.integers(0, manifest.models["vq"]["codebook_size"], size=shape).astype(np.int32)}


def torch_outputs(manifest: Manifest, graph_name: str, models, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the PyTorch model gives for one feed dict, by the graph's output names."""
    import torch

    graph = manifest.graph(graph_name)
    t = {name: torch.from_numpy(value) for name, value in feeds.items()}
    with torch.no_grad():
        if graph.role == "vq":
            from specrt.export.onnx_export import decode_codes

            produced = {"image": decode_codes(models.vq, t["codes"])}
        else:
            model = models.target if graph.role == "target" else models.draft
            if graph.kind == "prefill":
                logits, hidden, present_kv = model.prefill(t["class_ids"].long())
            else:
                logits, hidden, present_kv = model.step(t["input_ids"].long(), t["positions"].long(),
                                                        t["attention_mask"], t["past_kv"])
            produced = {"logits": logits, "hidden": hidden, "present_kv": present_kv}
    return {name: produced[name].float().numpy() for name in graph.output_names}


def write_case(bundle: str | Path, graph_name: str, models, out_dir: str | Path) -> Path:
    """Write out_dir/data_loader.py and out_dir/torch_outputs.json (polygraphy RunResults)."""
    from specrt.lazy import require

    require("polygraphy", "the polygraphy comparison")
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    bundle = Path(bundle).absolute()
    manifest = read_manifest(bundle)
    manifest.graph(graph_name)  # a clear error for an unknown graph
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_loader.py").write_text(_LOADER.format(bundle=str(bundle), graph=graph_name))
    iterations = [IterationResult(torch_outputs(manifest, graph_name, models, feeds), runner_name="torch")
                  for feeds in graph_feeds(bundle, graph_name)]
    RunResults([("torch", iterations)]).save(str(out / "torch_outputs.json"))
    return out


def polygraphy_command(bundle: str | Path, graph_name: str, out_dir: str | Path) -> str:
    """The polygraphy command line that compares onnxruntime with the saved torch outputs."""
    manifest = read_manifest(bundle, check_hashes=False)
    onnx_path = Path(bundle) / manifest.graph(graph_name).file
    tolerances = " ".join(f"{name}:{1e-3 if name == 'image' else 1e-4:g}" for name in manifest.graph(graph_name).output_names)
    out = Path(out_dir)
    return (f"polygraphy run {onnx_path} --onnxrt --data-loader-script {out / 'data_loader.py'} "
            f"--load-outputs {out / 'torch_outputs.json'} --atol {tolerances} --rtol 0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specrt.export.polygraphy_case", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("--graph", default="target_step")
    parser.add_argument("--out", default="pg_case")
    parser.add_argument("--demo-weights", default=None, help="demo weights folder the bundle was exported from")
    args = parser.parse_args(argv)
    try:
        from specrt.export.sources import demo_models

        write_case(args.bundle, args.graph, demo_models(args.demo_weights), args.out)
        print(polygraphy_command(args.bundle, args.graph, args.out))
    except SpecrtError as exc:
        print(f"specrt: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
