"""t(W) of a LlamaGen architecture's exported step graph on onnxruntime: fp32 beside int8 and int4.

The cost model (bench/cost_model.py) times the PyTorch modules; what a deployment ships is the
ONNX step graph, and its int4 copy (`specrt quantize --mode int4`: onnxruntime MatMulNBits) reads
about an eighth of the fp32 weight bytes per step (4 bits plus a scale per block), its int8 copy
(`--mode int8 --backend onnxruntime`: MatMulNBits, 8 bits) about a quarter. Here the step graph of the
architecture (random weights, real dims) is exported once, quantized with the same function
`specrt quantize` uses, and every precision is timed on onnxruntime with the same feeds,
interleaved: a CFG pair (batch 2), the KV cache half full, windows W as given.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from specrt.bench.cost_model import PROFILE_ARCHS, StepLatency, _interleaved_best
from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.kv_inputs import past_feeds

PRECISIONS = ("fp32", "int8", "int4")


def weight_bytes(model) -> int:
    """Bytes of weights one step reads at small batch: every initializer (int4 packed two per
    byte) except tables read only through Gather (token / class embeddings), of which a step
    reads a few rows."""
    from onnx import TensorProto, helper

    gathered = {node.input[0] for node in model.graph.node if node.op_type == "Gather"}
    other = {name for node in model.graph.node if node.op_type != "Gather" for name in node.input}
    total = 0.0
    for init in model.graph.initializer:
        if init.name in gathered and init.name not in other:
            continue
        count = int(np.prod(init.dims)) if init.dims else 1
        if init.data_type in (TensorProto.INT4, TensorProto.UINT4):
            total += count / 2
        else:
            total += count * helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    return int(total)


def step_feeds(graph: Any, kv: np.ndarray, past: int, window: int, cfg_scale: float) -> dict[str, np.ndarray]:
    """A step graph's inputs for one CFG pair (batch 2): `window` new tokens after `past` committed
    cache columns of the stacked cache `kv` [L, 2, 2, Hkv, capacity, D] (bound in the graph's own
    form: kv_inputs.past_feeds), guided at `cfg_scale`. What both step profiles run."""
    capacity = kv.shape[4]
    mask = np.zeros((2, window, capacity + window), dtype=bool)
    mask[:, :, :past] = True
    mask[:, :, capacity:] = np.tri(window, dtype=bool)
    return {
        "input_ids": np.zeros((2, window), np.int32),
        "positions": np.broadcast_to(past + np.arange(window, dtype=np.int32), (2, window)).copy(),
        "attention_mask": mask,
        **past_feeds(graph, kv),
        "mix": np.array([[cfg_scale, 1.0 - cfg_scale]], np.float32),  # over the [cond; uncond] pair
        "uniforms": np.full((1, window), 0.5, np.float32),
    }


def measure_onnx_steps(arch: str, windows: Sequence[int], repeats: int = 7, threads: Optional[int] = None,
                       precisions: Sequence[str] = PRECISIONS, progress: Optional[Callable[[str], None]] = None
                       ) -> dict[str, tuple[StepLatency, int]]:
    """time_onnx_steps for a LlamaGen architecture of PROFILE_ARCHS with random weights."""
    if arch not in PROFILE_ARCHS:
        raise SpecrtError(f"unknown --profile-arch {arch!r}; choose from {', '.join(PROFILE_ARCHS)}")
    from specrt.models.llamagen_gpt import gpt_config

    name, image_size = PROFILE_ARCHS[arch]
    return time_onnx_steps(gpt_config(name, image_size=image_size), arch, windows, repeats, threads, precisions,
                           progress=progress)


def time_onnx_steps(config, arch: str, windows: Sequence[int], repeats: int = 7, threads: Optional[int] = None,
                    precisions: Sequence[str] = PRECISIONS, block_size: int = 32, accuracy_level: int = 4,
                    progress: Optional[Callable[[str], None]] = None) -> dict[str, tuple[StepLatency, int]]:
    """precision -> (t(W) of the exported target step of a GPT `config` (random weights, seed 0)
    on onnxruntime, weight bytes read per step)."""
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise SpecrtError(f"--precision for --profile-arch: {', '.join(unknown)} not measured; choose from "
                          f"{', '.join(PRECISIONS)}")
    torch = require("torch", "specrt bench --profile-arch")
    onnx = require("onnx", "specrt bench --profile-arch")
    from specrt.engines.quantize import QuantizeOptions, quantize_model
    from specrt.export.bundle import ExportOptions
    from specrt.export.onnx_export import GraphLimits, capacity_for, export_step
    from specrt.models.llamagen_gpt import GPT
    from specrt.runtime.backends.ort_backend import session_options

    ort = require("onnxruntime", "specrt bench --profile-arch")
    say = progress or (lambda _msg: None)
    torch.manual_seed(0)
    capacity = capacity_for(config, max(windows))
    out: dict[str, tuple[StepLatency, int]] = {}
    with tempfile.TemporaryDirectory(prefix="specrt-profile-") as tmp:
        say(f"{arch}: exporting the target step graph (random weights) for onnxruntime ...")
        spec = export_step(GPT(config).eval(), "target", GraphLimits(capacity=capacity, max_window=max(windows),
                                                                      max_batch=2), Path(tmp), with_hidden=False,
                           kv_inputs=ExportOptions().step_kv_inputs)  # the form `specrt export` writes here
        paths = {"fp32": Path(tmp) / spec.file}
        model = onnx.load(str(paths["fp32"]))
        sizes = {"fp32": weight_bytes(model)}
        quantizers = {"int4": (QuantizeOptions(mode="int4", block_size=block_size, accuracy_level=accuracy_level),
                               f"MatMulNBits, block {block_size}, accuracy_level {accuracy_level}"),
                      "int8": (QuantizeOptions(mode="int8", tool="onnxruntime", accuracy_level=accuracy_level),
                               "MatMulNBits, 8 bits, its default block")}
        for precision in (p for p in precisions if p in quantizers):
            options, how = quantizers[precision]
            say(f"{arch}: {precision} ({how}) ...")
            quantized, _record = quantize_model(model, options, scratch=Path(tmp))
            paths[precision] = Path(tmp) / f"target_step.{precision}.onnx"
            paths[precision].write_bytes(quantized.SerializeToString())
            sizes[precision] = weight_bytes(quantized)
        del model
        kv = np.zeros((config.n_layer, 2, 2, config.n_kv_head, capacity, config.head_dim), np.float32)
        past = config.cond_len + config.num_image_tokens // 2  # the cache half full
        feeds = {w: step_feeds(spec, kv, past, w, cfg_scale=2.0) for w in windows}
        sessions = {p: ort.InferenceSession(str(paths[p]), sess_options=session_options(threads),
                                            providers=["CPUExecutionProvider"]) for p in precisions}
        # every (precision, W) in one round-robin, so a busy phase of the machine hits both alike
        fns = [(lambda s=sessions[p], f=feeds[w]: s.run(["present_kv", "probs", "draws"], f))
               for p in precisions for w in windows]
        report = lambda done: say(f"{arch} {'/'.join(precisions)} (onnxruntime): round {done}/{repeats}")  # noqa: E731
        times = _interleaved_best(fns, repeats, lambda: None, report)
        for k, precision in enumerate(precisions):
            curve = times[k * len(windows):(k + 1) * len(windows)]
            out[precision] = (StepLatency(f"{arch} {precision} (ort)", "cpu", list(windows), curve, float("nan")),
                              sizes[precision])
    return out


def onnx_table(curves: dict[str, tuple[StepLatency, int]]) -> str:
    """t(W) per precision, and each precision's time relative to fp32 at the same W."""
    row = lambda name, cells: f"{name:<16}" + "".join(f"{c:>8}" for c in cells)  # noqa: E731
    first = next(iter(curves.values()))[0]
    lines = [row("W", first.windows)]
    base = curves.get("fp32")
    for precision, (curve, size) in curves.items():
        lines += [f"{curve.arch}: {size / 1e6:.0f} MB of weights read per step",
                  row("  t(W) ms", [f"{1000 * t:.1f}" for t in curve.target_s])]
        if base is not None and precision != "fp32":
            lines.append(row("  t / t_fp32", [f"{t / b:.2f}" for t, b in zip(curve.target_s, base[0].target_s)]))
    return "\n".join(lines)
