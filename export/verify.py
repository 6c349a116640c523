"""Check a bundle's graphs in onnxruntime (CPU) against the PyTorch models they came from.

The cases are the ones decoding produces: windows of 1, 3, 16 and max_window tokens at
several committed lengths, a speculative tree (each node sees its ancestors), a CFG batch
([cond; uncond] rows sharing the image tokens), the prefill with real and null classes (c2i) or left-padded captions of different
lengths with CFG rows (t2i), and the VQ decoder. Graph inputs are named and shaped only from the manifest, so a manifest that
lies fails here too. The reference calls GPT.step / GPT.prefill directly, not the export
wrappers, then the sampling head (specrt.runtime.head) on their logits.

The head's `mix` is built here from the contract's definition (docs/contracts.md, "Sampling
head"), not by the runtime: an identity (no CFG) at temperature 1 for most windows, at
temperature 0.7 for the tree, and CFG with scale 2 at temperature 1 for the CFG batch and
the CFG prefill. `probs` is compared like logits; `draws` must match exactly, with the
uniforms placed away from CDF boundaries (see `uniforms_off_boundaries`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from specrt.export.bundle import ModelSet
from specrt.export.onnx_export import decode_codes, is_prompt_model
from specrt.lazy import require
from specrt.manifest import GraphSpec, Manifest, read_manifest
from specrt.runtime.kv_inputs import past_feeds, stacked_shape
from specrt.runtime.head import SamplingHead

# Max |onnxruntime - torch| allowed per output, fp32 graphs. The VQ decoder is a deep conv
# stack whose outputs are pixels in [-1, 1]: 1e-3 is far below one 8-bit level (7.8e-3).
# probs: the softmax of mix @ logits moves by at most about p·(Σ|mix|)·Δlogit, below the
# logits' own tolerance for the mixes used here. draws: the count of differing draws.
COUNTED = ("draws", "tokens", "fronts")  # integer outputs: how many differ (a growth graph's candidates and frontiers too)
TOLERANCES = {"logits": 1e-4, "hidden": 1e-4, "present_kv": 1e-4, "probs": 1e-4, "draws": 0, "image": 1e-3,
              "embeddings": 1e-4}
TEXT_CASES = ("a photo", "A much longer prompt that the tokenizer will have to cut at the caption length " * 4)
# How far (as a fraction of the CDF's total) a draw's threshold u·total is kept from every CDF
# boundary. onnxruntime sums the CDF sequentially in float32, torch differently; over 16384
# probabilities the two sums drift apart by a few 1e-6, so 2e-5 leaves a wide margin.
BOUNDARY_MARGIN = 2e-5
CFG_SCALE = 2.0  # CFG cases: guided = 2·cond − 1·uncond


@dataclass(frozen=True)
class Comparison:
    """One output of one case. For `draws`, max_abs_diff is the number of draws that differ
    and `compared` how many were compared (rows whose threshold could not be kept off a CDF
    boundary are left out, which BOUNDARY_MARGIN makes rare)."""

    graph: str
    case: str
    output: str
    max_abs_diff: float
    tolerance: float
    compared: int = 0

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

    def draw_counts(self, graph: str, output: str = "draws") -> tuple[int, int]:
        """(draws, or another COUNTED output's entries, that differ; those compared) over every case of `graph`."""
        draws = [c for c in self.comparisons if c.graph == graph and c.output == output]
        return int(sum(c.max_abs_diff for c in draws)), sum(c.compared for c in draws)

    def format(self) -> str:
        lines = [f"{'graph':<15} {'output':<11} {'max |diff|':>11} {'tolerance':>10}  worst case"]
        for (graph, output), c in self.worst().items():
            flag = "" if c.passed else "   FAIL"
            if output in COUNTED:
                differ, compared = self.draw_counts(graph, output)
                where = f"  {c.case}" if differ else ""
                lines.append(f"{graph:<15} {output:<11} {f'{differ}/{compared}':>11} {'exact':>10}  "
                             f"{output} that differ, all cases{where}{flag}")
                continue
            lines.append(f"{graph:<15} {output:<11} {c.max_abs_diff:>11.3e} {c.tolerance:>10.0e}  {c.case}{flag}")
        n_cases = len({(c.graph, c.case) for c in self.comparisons})
        lines.append(f"{n_cases} cases: {'all within tolerance' if self.passed else 'SOME ABOVE TOLERANCE'}")
        return "\n".join(lines)


@dataclass(frozen=True)
class StepCase:
    """One step-graph input set: ids/positions [B,W], mask [B,W,C+W], the head's mix [I,B]
    (past_kv and the uniforms are drawn by the caller)."""

    name: str
    input_ids: np.ndarray
    positions: np.ndarray
    attention_mask: np.ndarray
    mix: np.ndarray


def guidance(images: int, cfg_scale: float | None = None, temperature: float = 1.0) -> np.ndarray:
    """The head's mix [images, batch], written from docs/contracts.md: without CFG identity / T;
    with CFG scale s, row i has s/T at cond row i and (1 − s)/T at uncond row images + i."""
    eye = np.eye(images)
    mix = eye if cfg_scale is None else np.concatenate([eye * cfg_scale, eye * (1.0 - cfg_scale)], axis=1)
    return (mix / temperature).astype(np.float32)


def uniforms_off_boundaries(probs: np.ndarray, rng: np.random.Generator,
                            margin: float = BOUNDARY_MARGIN) -> tuple[np.ndarray, np.ndarray]:
    """One float32 uniform per row of `probs` [..., V] whose threshold u·total keeps at least
    `margin`·total from every CDF boundary; and a bool mask of the rows where that held.

    Why: the head draws #{v : cdf_v <= u·cdf_V}. Two correct implementations sum the CDF in
    a different order, so their boundaries differ by float32 rounding (~1e-7 per term), and
    a threshold within that distance of a boundary may legitimately give draws one apart.
    Such a tie says nothing about the graph. Rather than excuse mismatches near boundaries
    after the fact (which, with 16384 narrow bins, would also excuse an off-by-one bug), the
    uniforms are chosen so no tie can occur, and then draws must match exactly. A random
    uniform whose threshold falls too close to a boundary is moved to the centre of the
    row's most probable bin; a row whose bins are all narrower than 2·margin is not compared.
    """
    cdf = np.cumsum(probs.astype(np.float64), axis=-1)
    cdf /= cdf[..., -1:]
    uniforms = rng.random(probs.shape[:-1]).astype(np.float32)
    usable = np.ones(uniforms.shape, dtype=bool)
    for index in np.ndindex(uniforms.shape):
        edges = cdf[index][:-1]  # the boundaries a threshold can cross (the last bin is clamped)
        if not len(edges):
            continue
        u = float(uniforms[index])
        if np.abs(edges - u).min() >= margin:
            continue
        widest = int(np.argmax(probs[index]))
        low = edges[widest - 1] if widest > 0 else 0.0
        high = edges[widest] if widest < len(edges) else 1.0
        centre = np.float32((low + high) / 2)
        uniforms[index] = centre
        usable[index] = np.abs(edges - float(centre)).min() >= margin
    return uniforms, usable


def _sequence_end(config) -> int:
    """cond_len + the image tokens: LlamaGen's grid², a unified model's whole stream (row ends included)."""
    return config.cond_len + (config.grammar.stream_len if is_prompt_model(config) else config.grid_size**2)


def _positions(config, positions: np.ndarray) -> np.ndarray:
    """Slots past the last image token (a window longer than what is left) are padding:
    they repeat the last valid position, as the runtime does (GPT.step needs positions < seq_len)."""
    return np.minimum(positions, _sequence_end(config) - 1)


def causal_case(name: str, rng: np.random.Generator, config, capacity: int, batch: int, window: int, length: int,
                cfg: bool = False, temperature: float = 1.0) -> StepCase:
    """A plain window after `length` committed tokens; with cfg the second half of the batch
    repeats the first half's tokens (the uncond rows of LlamaGen's CFG) and the mix guides
    with CFG_SCALE, else it is the identity (both over `temperature`)."""
    rows = batch // 2 if cfg else batch
    ids = rng.integers(0, config.vocab_size, size=(rows, window))
    if cfg:
        ids = np.concatenate([ids, ids])
    positions = np.broadcast_to(_positions(config, length + np.arange(window)), (batch, window))
    mask = np.zeros((batch, window, capacity + window), dtype=bool)
    mask[:, :, :length] = True
    mask[:, :, capacity:] = np.tril(np.ones((window, window), dtype=bool))
    mix = guidance(rows, CFG_SCALE if cfg else None, temperature)
    return StepCase(name, ids.astype(np.int32), positions.astype(np.int32), mask, mix)


def tree_case(name: str, rng: np.random.Generator, config, capacity: int, window: int, length: int,
              temperature: float = 0.7) -> StepCase:
    """A random draft tree of `window` nodes in topological order: node i hangs under a random
    earlier node (or the committed prefix), sees itself and its ancestors, and sits at the
    position of its depth. One image, no CFG, sampled at `temperature`."""
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
    return StepCase(name, ids, _positions(config, length + depth)[None].astype(np.int32), mask,
                    guidance(1, None, temperature))


def step_cases(config, capacity: int, max_window: int, seed: int = 0) -> list[StepCase]:
    """Windows 1, 3, 16, max at several committed lengths, a CFG batch and a tree."""
    rng = np.random.default_rng(seed)
    seq_end = _sequence_end(config)
    cases = []
    windows = sorted({w for w in (1, 3, 16, max_window) if w <= max_window})
    for window in windows:
        # just after the prefill, mid-image, and the window that ends on the last image token
        for length in sorted({config.cond_len, (config.cond_len + seq_end) // 2, max(config.cond_len, seq_end - window)}):
            cases.append(causal_case(f"W={window} past={length}", rng, config, capacity, 1, window, length))
    mid = (config.cond_len + seq_end) // 2
    cases.append(causal_case(f"CFG s={CFG_SCALE:g} batch 4 W={min(5, max_window)} past={mid}", rng, config, capacity, 4,
                             min(5, max_window), mid, cfg=True))
    cases.append(tree_case(f"tree T=0.7 W={min(12, max_window)} past={mid}", rng, config, capacity,
                           min(12, max_window), mid))
    return cases


def _session(path: Path, threads: int):
    ort = require("onnxruntime", "bundle verification")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def head_reference(logits: torch.Tensor, mix: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, torch.Tensor], np.ndarray]:
    """(uniforms, {probs, draws} from the torch head, rows whose draws are compared) for one case."""
    head = SamplingHead()
    probs, _ = head(logits, torch.from_numpy(mix), torch.zeros(mix.shape[0], logits.shape[1]))
    uniforms, usable = uniforms_off_boundaries(probs.numpy(), rng)
    probs, draws = head(logits, torch.from_numpy(mix), torch.from_numpy(uniforms))
    return uniforms, {"probs": probs, "draws": draws}, usable


def _compare(graph: GraphSpec, case: str, got: list[np.ndarray], reference: dict[str, torch.Tensor],
             usable: np.ndarray | None = None, scaled: tuple[str, ...] = ()) -> Iterator[Comparison]:
    """Each output against torch's; `scaled` outputs' tolerance grows with their largest |value|
    above 1 (float32 rounding is relative)."""
    for spec, value in zip(graph.outputs, got):
        expected = reference[spec.name].detach()
        counted = spec.name in COUNTED
        expected = expected.numpy() if counted or spec.dtype == "float64" else expected.float().numpy()
        if value.shape != expected.shape:
            raise AssertionError(f"{graph.name} {case}: {spec.name} shape {value.shape} != torch {expected.shape}")
        if counted:
            if value.dtype != np.dtype(spec.dtype):
                raise AssertionError(f"{graph.name} {case}: {spec.name} are {value.dtype}, the contract says {spec.dtype}")
            compared = usable if usable is not None and spec.name == "draws" else np.ones(value.shape, dtype=bool)
            differ = int((value != expected)[compared].sum())
            yield Comparison(graph.name, case, spec.name, float(differ), TOLERANCES["draws"], int(compared.sum()))
            continue
        if spec.dtype == "float64":  # scores: −inf (no mass) must match −inf
            value, expected = (np.where(np.isneginf(x), -1e300, x) for x in (value, expected))
        diff = float(np.abs(value.astype(np.float64) - expected).max()) if value.size else 0.0
        tolerance = TOLERANCES.get(spec.name, 1e-4)
        if spec.name in scaled and value.size:
            tolerance *= max(1.0, float(np.abs(expected).max()))
        yield Comparison(graph.name, case, spec.name, diff, tolerance)


def _verify_step(manifest: Manifest, graph: GraphSpec, model, capacity: int, max_window: int,
                 seed: int, threads: int) -> Iterator[Comparison]:
    session = _session(manifest.root / graph.file, threads)
    config = model.config
    rng = np.random.default_rng(seed + 1)
    for case in step_cases(config, capacity, max_window, seed):
        batch = case.input_ids.shape[0]
        past_kv = rng.standard_normal(stacked_shape(graph, "max", batch=batch)).astype(np.float32)
        args = [torch.from_numpy(case.input_ids).long(), torch.from_numpy(case.positions).long(),
                torch.from_numpy(case.attention_mask), torch.from_numpy(past_kv)]
        feeds = {}
        if "hidden" in graph.input_names:  # an EAGLE head: the features before each token
            feeds["hidden"] = rng.standard_normal((*case.input_ids.shape, config.dim)).astype(np.float32)
            args.insert(1, torch.from_numpy(feeds["hidden"]))
        with torch.no_grad():
            logits, hidden, present_kv = model.step(*args)
            uniforms, head, usable = head_reference(logits, case.mix, rng)
        feeds.update({"input_ids": case.input_ids, "positions": case.positions,
                      "attention_mask": case.attention_mask, **past_feeds(graph, past_kv), "mix": case.mix,
                      "uniforms": uniforms})
        got = session.run(list(graph.output_names), {name: feeds[name] for name in graph.input_names})
        yield from _compare(graph, case.name, got, {"logits": logits, "hidden": hidden, "features": hidden,
                                                    "present_kv": present_kv, **head}, usable)


def _verify_chain(manifest: Manifest, graph: GraphSpec, model, capacity: int, max_window: int,
                  seed: int, threads: int) -> Iterator[Comparison]:
    """A draft chain graph against runtime.chain.DraftChain over the model (HeadChain for an
    EAGLE head's, with random features before the window tokens), on the step cases whose window
    leaves room for the drafts, drafting after each image's last window slot: the present rows,
    every draft's row and the drafts themselves (fed back inside the graph). A head's present
    rows get a tolerance relative to their magnitude: its own features feed its next drafts, and
    through that recursion an untrained head's rows grow to hundreds (float32 rounding grows with them)."""
    from specrt.runtime.chain import DraftChain, HeadChain

    steps = int(graph.input("uniforms").shape[1])
    chain = (HeadChain if "hidden" in graph.input_names else DraftChain)(model, steps)
    yield from _verify_drafting(manifest, graph, chain, capacity, max_window, seed, threads, steps - 1,
                                f"{steps} drafts", stream=2)


def _verify_tree(manifest: Manifest, graph: GraphSpec, model, capacity: int, max_window: int,
                 seed: int, threads: int) -> Iterator[Comparison]:
    """A draft tree graph against runtime.chain.DraftTree (HeadTree for an EAGLE head's) over the
    model, as _verify_chain: the present rows, the inner nodes' rows and every node's token
    (drawn inside the graph)."""
    from specrt.runtime.chain import DraftTree, HeadTree
    from specrt.runtime.tree import StaticShape
    from specrt.runtime.tree_call import TreeLayout

    layout = TreeLayout(StaticShape(graph.tree))
    tree = (HeadTree if "hidden" in graph.input_names else DraftTree)(model, layout)
    yield from _verify_drafting(manifest, graph, tree, capacity, max_window, seed, threads, len(layout.fed),
                                f"a tree of {layout.nodes - 1}", stream=3)


def _verify_growth(manifest: Manifest, graph: GraphSpec, model, capacity: int, max_window: int,
                   seed: int, threads: int) -> Iterator[Comparison]:
    """A draft growth graph against runtime.chain.DraftGrowth (HeadGrowth for an EAGLE head's)
    over the model, as _verify_chain: the present rows, every candidate's token and score and the
    frontiers chosen."""
    from specrt.runtime.chain import DraftGrowth, HeadGrowth

    depth, top_k = graph.growth["depth"], graph.growth["top_k"]
    growth = (HeadGrowth if "hidden" in graph.input_names else DraftGrowth)(model, depth, top_k)
    yield from _verify_drafting(manifest, graph, growth, capacity, max_window, seed, threads,
                                (depth - 1) * top_k, f"a dynamic tree {depth}x{top_k}", stream=4)


def _verify_drafting(manifest: Manifest, graph: GraphSpec, module, capacity: int, max_window: int, seed: int,
                     threads: int, fed: int, what: str, stream: int) -> Iterator[Comparison]:
    """A drafting graph (a chain's, tree's or growth's) against its module on the step cases whose
    window leaves room for the `fed` rows after it, drafting below each image's last window slot,
    with random uniforms where it takes them and random features for an EAGLE head's (from
    seed + stream: each kind its own numbers)."""
    session = _session(manifest.root / graph.file, threads)
    pairs = "hidden" in graph.input_names
    rng = np.random.default_rng(seed + stream)
    for case in step_cases(module.model.config, capacity, max_window, seed):
        batch, window = case.input_ids.shape
        if window + fed > max_window:
            continue
        images = case.mix.shape[0]
        past_kv = rng.standard_normal(graph.shape_at(graph.input("past_kv"), "max", batch=batch)).astype(np.float32)
        feeds = {"input_ids": case.input_ids, "positions": case.positions, "attention_mask": case.attention_mask,
                 "past_kv": past_kv, "last": np.full(images, window - 1, dtype=np.int32), "mix": case.mix}
        if "uniforms" in graph.input_names:
            feeds["uniforms"] = rng.random((images, int(graph.input("uniforms").shape[1]))).astype(np.float32)
        if pairs:
            feeds["hidden"] = rng.standard_normal((batch, window, module.model.config.dim)).astype(np.float32)
        with torch.no_grad():
            outputs = module(*(torch.from_numpy(feeds[name]) for name in graph.input_names))
        got = session.run(list(graph.output_names), feeds)
        yield from _compare(graph, f"{case.name} + {what}", got, dict(zip(graph.output_names, outputs)),
                            scaled=("present_kv",) if pairs else ())


def prefill_cases(config, rng: np.random.Generator) -> Iterator[tuple[str, dict[str, np.ndarray], np.ndarray]]:
    """(name, condition feeds, mix): real and null classes (c2i); captions of different
    lengths, left-padded as LlamaGen's sample_t2i.py pads them, with CFG rows (t2i); token
    prompts of different lengths, left-padded, with CFG rows of their own (unified models)."""
    if is_prompt_model(config):
        cond_len, vocab = config.cond_len, int(getattr(config, "text_vocab_size", None) or 2)
        for name, lengths, cfg in (("full prompt", [cond_len], False),
                                   (f"CFG s={CFG_SCALE:g} prompts of lengths 2 and {cond_len}", [2, cond_len, 1, 3], True),
                                   ("3 padded prompts T=0.5", [max(cond_len // 2, 1), cond_len, 1], False)):
            lengths = np.minimum(np.array(lengths), cond_len)
            mask = np.arange(cond_len)[None] >= cond_len - lengths[:, None]
            ids = rng.integers(0, vocab, size=mask.shape).astype(np.int32)
            images = len(lengths) // 2 if cfg else len(lengths)
            mix = guidance(images, CFG_SCALE) if cfg else guidance(images, None, 0.5 if images == 3 else 1.0)
            yield name, {"input_ids": ids, "prompt_mask": mask}, mix
        return
    if config.model_type == "c2i":
        cases = (("class 0", [0], guidance(1)),
                 (f"CFG s={CFG_SCALE:g} [{config.num_classes - 1}; null]", [config.num_classes - 1, config.num_classes],
                  guidance(1, CFG_SCALE)),
                 ("3 classes T=0.5", [1 % config.num_classes, 2 % config.num_classes, 0], guidance(3, None, 0.5)))
        for name, classes, mix in cases:
            yield name, {"class_ids": np.array(classes, dtype=np.int32)}, mix
        return
    cond_len = config.cond_len
    for name, lengths, cfg in (("full caption", [cond_len], False),
                               (f"CFG s={CFG_SCALE:g} captions of lengths 1 and {cond_len}", [1, cond_len], True),
                               ("3 padded captions T=0.5", [max(cond_len // 2, 1), cond_len, 1], False)):
        lengths = np.array(lengths)
        mask = np.arange(cond_len)[None] >= cond_len - lengths[:, None]
        captions = (rng.standard_normal((len(lengths), cond_len, config.caption_dim)) * mask[..., None]).astype(np.float32)
        uncond = np.zeros(len(lengths), dtype=bool)
        if cfg:
            captions, mask = np.concatenate([captions, captions]), np.concatenate([mask, mask])
            uncond = np.repeat([False, True], len(lengths))
        mix = guidance(len(lengths), CFG_SCALE) if cfg else guidance(len(lengths), None, 0.5 if len(lengths) == 3 else 1.0)
        yield name, {"captions": captions, "caption_mask": mask, "uncond": uncond}, mix


def _verify_prefill(manifest: Manifest, graph: GraphSpec, model, seed: int, threads: int) -> Iterator[Comparison]:
    session = _session(manifest.root / graph.file, threads)
    rng = np.random.default_rng(seed + 3)
    for name, condition, mix in prefill_cases(model.config, rng):
        args = [torch.from_numpy(condition[key]) for key in ("class_ids", "input_ids", "captions", "caption_mask",
                                                             "prompt_mask", "uncond") if key in condition]
        first = args[0].long() if "class_ids" in condition or "input_ids" in condition else args[0]
        with torch.no_grad():
            logits, hidden, present_kv = model.prefill(first, *args[1:])
            uniforms, head, usable = head_reference(logits, mix, rng)
        got = session.run(list(graph.output_names), {**condition, "mix": mix, "uniforms": uniforms})
        yield from _compare(graph, name, got, {"logits": logits, "hidden": hidden, "present_kv": present_kv, **head},
                            usable)


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


def _verify_text(manifest: Manifest, graph: GraphSpec, encoder, threads: int) -> Iterator[Comparison]:
    """The text encoder graph on a short and a truncated prompt, tokenised by the encoder itself."""
    session = _session(manifest.root / graph.file, threads)
    ids, mask = encoder.tokenize(TEXT_CASES)
    got = session.run(list(graph.output_names), {"input_ids": ids.astype(np.int32), "attention_mask": mask.astype(np.int32)})
    with torch.no_grad():
        expected = encoder.model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
    yield from _compare(graph, f"{len(TEXT_CASES)} prompts", got, {"embeddings": expected})


def verify_bundle(bundle: str | Path | Manifest, models: ModelSet, seed: int = 0, threads: int = 2) -> VerifyReport:
    """Run every graph of the bundle in onnxruntime CPU and compare with `models` in torch (a
    ModelSet, or a unified bundle's export.unified.writer.UnifiedModels: the same roles)."""
    manifest = bundle if isinstance(bundle, Manifest) else read_manifest(bundle)
    max_window = int(manifest.limits["max_window"])
    comparisons: list[Comparison] = []
    for name, graph in manifest.graphs.items():
        if graph.role == "vq":
            comparisons += _verify_vq(manifest, graph, models.vq, seed, threads)
            continue
        if graph.role == "text":
            comparisons += _verify_text(manifest, graph, models.text_encoder, threads)
            continue
        model = models.target if graph.role == "target" else models.draft
        capacity = int(manifest.models[graph.role]["capacity"])
        if graph.kind == "prefill":
            comparisons += _verify_prefill(manifest, graph, model, seed, threads)
        elif graph.kind == "chain":
            comparisons += _verify_chain(manifest, graph, model, capacity, max_window, seed, threads)
        elif graph.kind == "tree":
            comparisons += _verify_tree(manifest, graph, model, capacity, max_window, seed, threads)
        elif graph.kind == "growth":
            comparisons += _verify_growth(manifest, graph, model, capacity, max_window, seed, threads)
        else:
            comparisons += _verify_step(manifest, graph, model, capacity, max_window, seed, threads)
    return VerifyReport(tuple(comparisons))
