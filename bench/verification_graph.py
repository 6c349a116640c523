"""SD chain verification on the host (numpy) against the same verification as an onnxruntime graph.

Why: the onnxruntime / TensorRT runner verifies drafts on the host, so the target graph's
probability rows leave the graph every round. export/verification_graph.py builds the
verification (uniforms from the round's counters included) as a graph that could run fused
after the target graph, returning two numbers an image. This script times both on a CPU, at the
demo's vocabulary (512) and LlamaGen's (16384), draft lengths 4 and 8, batches 1 and 8, and
counts the bytes each way, so the decision (docs/verification-graph.md) rests on numbers.

    python -m specrt.bench.verification_graph [--repeats 300] [--json out.json]

Columns: `ctr` is numpy's counter_uniforms for the round's B·(L + 1) uniforms (the tests' and the
next token's), `verify` runtime.verification.chains.verify_chains on numpy rows with them, `host`
the two together (the host loop's verification); `graph` onnxruntime's CPU session.run of the
verification graph, uniforms included, one thread. Each is the median of `--repeats` calls, host
and graph interleaved call by call on the same rows, so load from other processes falls on both. Rows are
random and peaked; every second input's draft rows are close to the target's, so rounds accept long
prefixes as well as reject early (`acc.len`: the graph's mean accepted drafts).
`rows out`: the probability rows the host path reads out of the graphs each round, P [B, L + 1, V]
and Q [B, L, V] in float32 (the graph path returns 2·B int64); `PCIe` and `C2C` the time those bytes
take at an assumed effective device-to-host bandwidth (LINKS), which a GPU runner would save.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import click
import numpy as np

from specrt.lazy import require

VOCABS = {"demo": 512, "llamagen": 16384}
# effective device-to-host bandwidth, bytes/s: ~80% of each link's peak in one direction
LINKS = {"PCIe": 0.8 * 64e9, "C2C": 0.8 * 450e9}  # PCIe 5.0 x16; NVLink-C2C (Grace Hopper), 450 GB/s a way
INPUT_SETS = 16  # distinct random inputs a case cycles through


@dataclass
class Case:
    """One (vocabulary, draft length, batch)'s medians in microseconds, and its bytes."""

    vocab: int
    draft_len: int
    images: int
    accepted_mean: float
    verify_us: float
    counter_us: float
    host_us: float
    graph_us: float
    rows_bytes: int

    def link_us(self, link: str) -> float:
        return self.rows_bytes / LINKS[link] * 1e6


def _rows(rng: np.random.Generator, shape: tuple, vocab: int) -> np.ndarray:
    logits = rng.standard_normal((*shape, vocab)) * 3.0
    rows = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (rows / rows.sum(axis=-1, keepdims=True)).astype(np.float32)


def _inputs(rng: np.random.Generator, vocab: int, draft_len: int, images: int, close: bool) -> dict[str, Any]:
    """One round's rows and drafts, for both paths."""
    p = _rows(rng, (images, draft_len + 1), vocab)
    mix = 0.05 if close else 1.0
    q = ((1 - mix) * p[:, :draft_len] + mix * _rows(rng, (images, draft_len), vocab)).astype(np.float32)
    cdf = np.cumsum(q.astype(np.float64), axis=-1)
    drafts = np.minimum((cdf < rng.random((images, draft_len, 1)) * cdf[..., -1:]).sum(-1), vocab - 1)
    feeds = {"p": p, "q": q, "drafts": drafts, "limits": np.full(images, draft_len, dtype=np.int64),
             "seed_low": rng.integers(0, 2**32, images), "seed_high": rng.integers(0, 2**32, images),
             "index": rng.integers(1, 200, images), "round": rng.integers(0, 100, images)}
    host = {"p_block": p, "q_block": np.ascontiguousarray(q.transpose(1, 0, 2)), "drafts": drafts.tolist(),
            "draws": rng.integers(0, vocab, (images, draft_len + 1))}
    return {"feeds": feeds, "host": host}


def _session(model: Any) -> Any:
    ort = require("onnxruntime", "the verification graph bench")
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def measure(vocab: int, draft_len: int, images: int, repeats: int, seed: int = 0) -> Case:
    """Medians of `repeats` calls of each path on the same rows (see the module docstring)."""
    from specrt.export.verification_graph import chain_verification_model
    from specrt.runtime.counter_random import NEXT, TEST, counter_uniforms, draw_slot
    from specrt.runtime.verification.chains import verify_chains
    from specrt.runtime.verification.rules import VANILLA

    rng = np.random.default_rng(seed)
    sets = [_inputs(rng, vocab, draft_len, images, close=bool(k % 2)) for k in range(INPUT_SETS)]
    session = _session(chain_verification_model(draft_len, vocab))
    offsets, kinds = np.append(np.arange(draft_len), 0), np.append(np.full(draft_len, TEST), NEXT)
    verify, counters, host, graph, accepted = [], [], [], [], []
    for call in range(repeats + INPUT_SETS):  # the first pass over the inputs warms both paths up
        inputs = sets[call % INPUT_SETS]
        h, f = inputs["host"], inputs["feeds"]
        start = time.perf_counter_ns()
        # the round's uniforms in one call, as the graph hashes them: tests at index + j, the next token's at index
        uniforms = counter_uniforms(f["seed_low"][:, None], f["seed_high"][:, None], f["index"][:, None] + offsets,
                                    draw_slot(kinds, 0, f["round"][:, None]))
        coins, next_uniforms = uniforms[:, :draft_len], uniforms[:, draft_len]
        middle = time.perf_counter_ns()
        verify_chains(h["p_block"], h["q_block"], h["drafts"], VANILLA, coins, next_uniforms, h["draws"])
        after_host = time.perf_counter_ns()
        count, _ = session.run(None, f)
        end = time.perf_counter_ns()
        if call >= INPUT_SETS:
            counters.append(middle - start)
            verify.append(after_host - middle)
            host.append(after_host - start)
            graph.append(end - after_host)
            accepted.append(float(count.mean()))
    rows_bytes = images * (2 * draft_len + 1) * vocab * 4
    return Case(vocab, draft_len, images, statistics.fmean(accepted), *(statistics.median(times) / 1e3
                for times in (verify, counters, host, graph)), rows_bytes)


def machine() -> str:
    """The CPU's model name and core count (what the results file is named after)."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} cores {cpu}"


def table(cases: list[Case]) -> list[str]:
    """The printed table, one line a case."""
    lines = [f"{'vocab':>6}{'L':>3}{'B':>3}{'acc.len':>8}{'ctr us':>8}{'verify us':>10}{'host us':>9}{'graph us':>10}"
             f"{'graph/host':>11}{'rows out':>10}{'PCIe us':>9}{'C2C us':>8}"]
    for c in cases:
        lines.append(f"{c.vocab:>6}{c.draft_len:>3}{c.images:>3}{c.accepted_mean:>8.2f}{c.counter_us:>8.1f}"
                     f"{c.verify_us:>10.1f}{c.host_us:>9.1f}{c.graph_us:>10.1f}{c.graph_us / c.host_us:>10.2f}x"
                     f"{c.rows_bytes / 1e6:>8.2f}MB{c.link_us('PCIe'):>9.1f}{c.link_us('C2C'):>8.1f}")
    return lines


@click.command()
@click.option("--vocabs", default="512,16384", show_default=True, help="Vocabulary sizes (the demo's, LlamaGen's).")
@click.option("--draft-lens", default="4,8", show_default=True, help="Draft lengths L.")
@click.option("--images", "images_text", default="1,8", show_default=True, help="Batch sizes (images).")
@click.option("--repeats", type=click.IntRange(min=1, max=100_000), default=300, show_default=True,
              help="Timed calls of each path per case (the median is reported).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the cases as JSON here.")
def main(vocabs: str, draft_lens: str, images_text: str, repeats: int, json_path: Optional[Path]) -> None:
    """Time SD chain verification on the host and as an onnxruntime graph (the module docstring)."""
    ort = require("onnxruntime", "the verification graph bench")
    cases = [measure(v, length, b, repeats) for v in _ints(vocabs) for length in _ints(draft_lens)
             for b in _ints(images_text)]
    links = ", ".join(f"{name} {rate / 1e9:.0f} GB/s" for name, rate in LINKS.items())
    header = (f"SD chain verification, VANILLA rule: numpy host loop vs onnxruntime {ort.__version__} CPU graph "
              f"(1 thread); {machine()}; medians of {repeats} interleaved calls; links assumed: {links}")
    click.echo("\n".join([header, *table(cases)]))
    if json_path:
        json_path.write_text(json.dumps({"header": header, "cases": [asdict(c) for c in cases]}, indent=1) + "\n")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    main()
