"""Check a bundle's graphs in onnxruntime (CPU) against the PyTorch models they came from.

The cases are the ones decoding produces: windows of 1, 3, 16 and max_window tokens at
several committed lengths, a speculative tree (each node sees its ancestors), a CFG batch
([cond; uncond] rows sharing the image tokens), the prefill with real and null classes and
the VQ decoder. Graph inputs are named and shaped only from the manifest, so a manifest that
lies fails here too. The reference calls GPT.step / GPT.prefill directly, not the export
wrappers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from specrt.export.bundle import ModelSet
from specrt.export.onnx_export import decode_codes
from specrt.lazy import require
from specrt.manifest import GraphSpec, Manifest, read_manifest

# Max |onnxruntime - torch| allowed per output, fp32 graphs. The VQ decoder is a deep conv
# stack whose outputs are pixels in [-1, 1]: 1e-3 is far below one 8-bit level (7.8e-3).
TOLERANCES = {"logits": 1e-4, "hidden": 1e-4, "present_kv": 1e-4, "image": 1e-3}


@dataclass(frozen=True)
class Comparison:
    graph: str
    case: str
    output: str
    max_abs_diff: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance


@dataclass(frozen=True)
class VerifyReport:
    comparisons: tuple[Comparison, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def worst(self) -> dict[tuple[str, str], Comparison]:
        """Per (graph, output), the case with the largest difference."""
        worst: dict[tuple[str, str], Comparison] = {}
        for c in self.comparisons:
            key = (c.graph, c.output)
            if key not in worst or c.max_abs_diff > worst[key].max_abs_diff:
                worst[key] = c
        return worst

    def format(self) -> str:
        lines = [f"{'graph':<15} {'output':<11} {'max |diff|':>11} {'tolerance':>10}  worst case"]
        for (graph, output), c in self.worst().items():
            flag = "" if c.passed else "   FAIL"
            lines.append(f"{graph:<15} {output:<11} {c.max_abs_diff:>11.3e} {c.tolerance:>10.0e}  {c.case}{flag}")
        n_cases = len({(c.graph, c.case) for c in self.comparisons})
        lines.append(f"{n_cases} cases: {'all within tolerance' if self.passed else 'SOME ABOVE TOLERANCE'}")
        return "\n".join(lines)


@dataclass(frozen=True)
class StepCase:
    """One step-graph input set: ids/positions [B,W], mask [B,W,C+W], past_kv for batch B."""

    name: str
    input_ids: np.ndarray
    positions: np.ndarray
    attention_mask: np.ndarray


def _positions(config, positions: np.ndarray) -> np.ndarray:
    """Slots past the last image token (a window longer than what is left) are padding:
    they repeat the last valid position, as the runtime does (GPT.step needs positions < seq_len)."""
    return np.minimum(positions, config.cond_len + config.grid_size**2 - 1)


def causal_case(name: str, rng: np.random.Generator, config, capacity: int, batch: int, window: int, length: int,
                cfg: bool = False) -> StepCase:
    """A plain window after `length` committed tokens; with cfg the second half of the batch
    repeats the first half's tokens (the uncond rows of LlamaGen's CFG)."""
    rows = batch // 2 if cfg else batch
    ids = rng.integers(0, config.vocab_size, size=(rows, window))
    if cfg:
        ids = np.concatenate([ids, ids])
    positions = np.broadcast_to(_positions(config, length + np.arange(window)), (batch, window))
    mask = np.zeros((batch, window, capacity + window), dtype=bool)
    mask[:, :, :length] = True
    mask[:, :, capacity:] = np.tril(np.ones((window, window), dtype=bool))
    return StepCase(name, ids.astype(np.int32), positions.astype(np.int32), mask)


def tree_case(name: str, rng: np.random.Generator, config, capacity: int, window: int, length: int) -> StepCase:
    """A random draft tree of `window` nodes in topological order: node i hangs under a random
    earlier node (or the committed prefix), sees itself and its ancestors, and sits at the
    position of its depth."""
    parent = np.array([rng.integers(-1, i) for i in range(window)])
    depth = np.zeros(window, dtype=np.int64)
    window_mask = np.eye(window, dtype=bool)
    for i in range(window):
        if parent[i] >= 0:
            depth[i] = depth[parent[i]] + 1
            window_mask[i] |= window_mask[parent[i]]
    mask = np.zeros((1, window, capacity + window), dtype=bool)
    mask[0, :, :length] = True
    mask[0, :, capacity:] = window_mask
    ids = rng.integers(0, config.vocab_size, size=(1, window)).astype(np.int32)
    return StepCase(name, ids, _positions(config, length + depth)[None].astype(np.int32), mask)


def step_cases(config, capacity: int, max_window: int, seed: int = 0) -> list[StepCase]:
    """Windows 1, 3, 16, max at several committed lengths, a CFG batch and a tree."""
    rng = np.random.default_rng(seed)
    seq_end = config.cond_len + config.grid_size**2
    cases = []
    windows = sorted({w for w in (1, 3, 16, max_window) if w <= max_window})
    for window in windows:
        # just after the prefill, mid-image, and the window that ends on the last image token
        for length in sorted({config.cond_len, (config.cond_len + seq_end) // 2, max(config.cond_len, seq_end - window)}):
            cases.append(causal_case(f"W={window} past={length}", rng, config, capacity, 1, window, length))
    mid = (config.cond_len + seq_end) // 2
    cases.append(causal_case(f"CFG batch 4 W={min(5, max_window)} past={mid}", rng, config, capacity, 4,
                             min(5, max_window), mid, cfg=True))
    cases.append(tree_case(f"tree W={min(12, max_window)} past={mid}", rng, config, capacity, min(12, max_window), mid))
    return cases


def _session(path: Path, threads: int):
    ort = require("onnxruntime", "bundle verification")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _compare(graph: GraphSpec, case: str, got: list[np.ndarray], reference: dict[str, torch.Tensor]) -> Iterator[Comparison]:
    for spec, value in zip(graph.outputs, got):
        expected = reference[spec.name].detach().float().numpy()
        if value.shape != expected.shape:
            raise AssertionError(f"{graph.name} {case}: {spec.name} shape {value.shape} != torch {expected.shape}")
        diff = float(np.abs(value.astype(np.float64) - expected).max()) if value.size else 0.0
        yield Comparison(graph.name, case, spec.name, diff, TOLERANCES.get(spec.name, 1e-4))


def _verify_step(manifest: Manifest, graph: GraphSpec, model, capacity: int, max_window: int,
                 seed: int, threads: int) -> Iterator[Comparison]:
    session = _session(manifest.root / graph.file, threads)
    config = model.config
    rng = np.random.default_rng(seed + 1)
    for case in step_cases(config, capacity, max_window, seed):
        batch = case.input_ids.shape[0]
        kv_shape = graph.shape_at(graph.input("past_kv"), "max", batch=batch)
        past_kv = rng.standard_normal(kv_shape).astype(np.float32)
        feeds = {"input_ids": case.input_ids, "positions": case.positions,
                 "attention_mask": case.attention_mask, "past_kv": past_kv}
        got = session.run(list(graph.output_names), {name: feeds[name] for name in graph.input_names})
        with torch.no_grad():
            logits, hidden, present_kv = model.step(torch.from_numpy(case.input_ids).long(),
                                                    torch.from_numpy(case.positions).long(),
                                                    torch.from_numpy(case.attention_mask), torch.from_numpy(past_kv))
        yield from _compare(graph, case.name, got, {"logits": logits, "hidden": hidden, "present_kv": present_kv})


def _verify_prefill(manifest: Manifest, graph: GraphSpec, model, threads: int) -> Iterator[Comparison]:
    session = _session(manifest.root / graph.file, threads)
    config = model.config
    for name, classes in (("class 0", [0]), (f"CFG [{config.num_classes - 1}; null]", [config.num_classes - 1, config.num_classes])):
        class_ids = np.array(classes, dtype=np.int32)
        got = session.run(list(graph.output_names), {"class_ids": class_ids})
        with torch.no_grad():
            logits, hidden, present_kv = model.prefill(torch.from_numpy(class_ids).long())
        yield from _compare(graph, name, got, {"logits": logits, "hidden": hidden, "present_kv": present_kv})


def _verify_vq(manifest: Manifest, graph: GraphSpec, vq, seed: int, threads: int) -> Iterator[Comparison]:
    session = _session(manifest.root / graph.file, threads)
    rng = np.random.default_rng(seed + 2)
    codes_spec = graph.input("codes")
    for batch in (1, 2):
        codes = rng.integers(0, vq.config.codebook_size, size=graph.shape_at(codes_spec, "min", batch=batch)).astype(np.int32)
        got = session.run(list(graph.output_names), {"codes": codes})
        with torch.no_grad():
            image = decode_codes(vq, torch.from_numpy(codes))
        yield from _compare(graph, f"batch {batch}", got, {"image": image})


def verify_bundle(bundle: str | Path | Manifest, models: ModelSet, seed: int = 0, threads: int = 2) -> VerifyReport:
    """Run every graph of the bundle in onnxruntime CPU and compare with `models` in torch."""
    manifest = bundle if isinstance(bundle, Manifest) else read_manifest(bundle)
    max_window = int(manifest.limits["max_window"])
    comparisons: list[Comparison] = []
    for name, graph in manifest.graphs.items():
        if graph.role == "vq":
            comparisons += _verify_vq(manifest, graph, models.vq, seed, threads)
            continue
        model = models.target if graph.role == "target" else models.draft
        capacity = int(manifest.models[graph.role]["capacity"])
        if graph.kind == "prefill":
            comparisons += _verify_prefill(manifest, graph, model, threads)
        else:
            comparisons += _verify_step(manifest, graph, model, capacity, max_window, seed, threads)
    return VerifyReport(tuple(comparisons))
