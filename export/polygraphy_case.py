"""Reproduce one onnxruntime-vs-PyTorch comparison with NVIDIA's polygraphy.

`specrt export --verify` is our own check; this module lets the same comparison run through
an independent tool (`polygraphy run --onnxrt`, CPU, no TensorRT), and later through
`--trt` on a GPU box with the same command plus one flag. Random inputs make no sense for
token ids, positions, masks and the sampling head's mix, so polygraphy gets them from a data
loader script (which replays the feeds saved beside it: the head's uniforms are placed off
CDF boundaries using the PyTorch probabilities, see specrt.export.verify); the PyTorch
outputs are saved as a polygraphy RunResults file:

    python -m specrt.export.polygraphy_case bundle --graph target_step --out pg_case
    polygraphy run bundle/target_step.onnx --onnxrt \\
        --data-loader-script pg_case/data_loader.py \\
        --load-outputs pg_case/torch_outputs.json --atol 1e-4 --rtol 0

(`polygraphy_command` prints the exact line, with per-output tolerances; draws exact.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from specrt.errors import SpecrtError
from specrt.manifest import GraphSpec, Manifest, read_manifest
from specrt.runtime.kv_inputs import past_feeds, stacked_feed, stacked_shape

FEEDS_FILE = "feeds.npz"
_LOADER = '''"""polygraphy --data-loader-script for {graph} of {bundle} (written by specrt.export.polygraphy_case)."""
from specrt.export.polygraphy_case import saved_feeds


def load_data():
    yield from saved_feeds({feeds!r})
'''


def _step_feeds(manifest: Manifest, graph: GraphSpec, seed: int) -> Iterator[dict[str, np.ndarray]]:
    from specrt.export.verify import causal_case, tree_case  # verify needs torch; only step feeds use it

    config = _ConfigView(manifest.models[graph.role])
    capacity = config.capacity
    max_window = int(manifest.limits["max_window"])
    mid = (config.cond_len + config.cond_len + config.grid_size**2) // 2
    rng = np.random.default_rng(seed)
    cases = [causal_case("CFG", rng, config, capacity, 2, min(5, max_window), mid, cfg=True),
             tree_case("tree", rng, config, capacity, min(12, max_window), mid)]
    for case in cases:
        batch = case.input_ids.shape[0]
        past_kv = rng.standard_normal(stacked_shape(graph, "max", batch=batch)).astype(np.float32)
        yield {"input_ids": case.input_ids, "positions": case.positions, "attention_mask": case.attention_mask,
               **past_feeds(graph, past_kv), "mix": case.mix,
               "uniforms": rng.random((case.mix.shape[0], case.input_ids.shape[1])).astype(np.float32)}


class _ConfigView:
    """The manifest's model entry with the attribute names the case builders read."""

    def __init__(self, entry: dict):
        self.__dict__.update(entry)


def graph_feeds(bundle: str | Path, graph_name: str, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Deterministic inputs for one graph, named and shaped from the manifest only (the head's
    uniforms are plain random numbers here; write_case moves them off CDF boundaries)."""
    manifest = read_manifest(bundle, check_hashes=False)
    graph = manifest.graph(graph_name)
    if graph.kind == "step":
        yield from _step_feeds(manifest, graph, seed)
    elif graph.kind == "prefill":
        entry = manifest.models[graph.role]
        scale = 2.0  # CFG [cond; uncond] of one image, temperature 1: mix [[s, 1 - s]]
        yield {"class_ids": np.array([0, entry["null_class"]], dtype=np.int32),
               "mix": np.array([[scale, 1.0 - scale]], dtype=np.float32),
               "uniforms": np.random.default_rng(seed).random((1, 1)).astype(np.float32)}
    else:
        rng = np.random.default_rng(seed)
        shape = graph.shape_at(graph.input("codes"), "opt")
        yield {"codes": rng.integers(0, manifest.models["vq"]["codebook_size"], size=shape).astype(np.int32)}


def saved_feeds(path: str | Path) -> Iterator[dict[str, np.ndarray]]:
    """The feed dicts write_case saved (npz keys `<iteration>/<input name>`), in order."""
    with np.load(path) as data:
        iterations: dict[int, dict[str, np.ndarray]] = {}
        for key in data.files:
            index, name = key.split("/", 1)
            iterations.setdefault(int(index), {})[name] = data[key]
    for index in sorted(iterations):
        yield iterations[index]


def torch_outputs(manifest: Manifest, graph_name: str, models, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the PyTorch model (and, for prefill/step, the sampling head) gives for one feed dict,
    by the graph's output names."""
    import torch

    from specrt.runtime.head import SamplingHead

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
                                                        t["attention_mask"], torch.from_numpy(stacked_feed(feeds)))
            probs, draws = SamplingHead()(logits, t["mix"], t["uniforms"])
            produced = {"logits": logits, "hidden": hidden, "present_kv": present_kv, "probs": probs, "draws": draws}
    return {name: produced[name].numpy() if name == "draws" else produced[name].float().numpy()
            for name in graph.output_names}


def _settle_uniforms(manifest: Manifest, graph_name: str, models, feeds: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """`feeds` with uniforms off the CDF boundaries of the PyTorch probabilities (exact draws)."""
    if "uniforms" not in feeds:
        return feeds
    from specrt.export.verify import uniforms_off_boundaries

    probs = torch_outputs(manifest, graph_name, models, feeds)["probs"]
    uniforms, _ = uniforms_off_boundaries(probs, np.random.default_rng(seed))
    return {**feeds, "uniforms": uniforms}


def write_case(bundle: str | Path, graph_name: str, models, out_dir: str | Path) -> Path:
    """Write out_dir/data_loader.py with the feeds it replays (feeds.npz) and
    out_dir/torch_outputs.json (polygraphy RunResults)."""
    from specrt.lazy import require

    require("polygraphy", "the polygraphy comparison")
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    bundle = Path(bundle).absolute()
    manifest = read_manifest(bundle)
    manifest.graph(graph_name)  # a clear error for an unknown graph
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_feeds = [_settle_uniforms(manifest, graph_name, models, feeds, seed)
                 for seed, feeds in enumerate(graph_feeds(bundle, graph_name))]
    np.savez(out / FEEDS_FILE, **{f"{i}/{name}": value for i, feeds in enumerate(all_feeds) for name, value in feeds.items()})
    (out / "data_loader.py").write_text(_LOADER.format(bundle=str(bundle), graph=graph_name,
                                                       feeds=str((out / FEEDS_FILE).absolute())))
    iterations = [IterationResult(torch_outputs(manifest, graph_name, models, feeds), runner_name="torch")
                  for feeds in all_feeds]
    RunResults([("torch", iterations)]).save(str(out / "torch_outputs.json"))
    return out


def _tolerance(output: str) -> str:
    from specrt.export.verify import TOLERANCES

    return f"{TOLERANCES.get(output, 1e-4):g}"


def polygraphy_command(bundle: str | Path, graph_name: str, out_dir: str | Path) -> str:
    """The polygraphy command line that compares onnxruntime with the saved torch outputs."""
    manifest = read_manifest(bundle, check_hashes=False)
    onnx_path = Path(bundle) / manifest.graph(graph_name).file
    tolerances = " ".join(f"{name}:{_tolerance(name)}" for name in manifest.graph(graph_name).output_names)
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
        from specrt.export.demo.c2i import model_set

        write_case(args.bundle, args.graph, model_set(args.demo_weights), args.out)
        print(polygraphy_command(args.bundle, args.graph, args.out))
    except SpecrtError as exc:
        print(f"specrt: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
