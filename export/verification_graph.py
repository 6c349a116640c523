"""Speculative verification as an ONNX graph: the counter uniforms and SD chain verification.

Why: the onnxruntime / TensorRT runner verifies drafts on the host (runtime.verification.chains),
so every round the target graph's probability rows [images, L + 1, V] leave the graph. A graph
that verifies where the rows are — fused after the target graph, taking the round's state
(seed halves, token index, round) and computing its uniforms from the counters — would return
two numbers an image instead. Whether that pays is measured by bench/verification_graph.py and
decided in docs/verification-graph.md; this module only builds the graphs, and
tests/export/test_verification_graph.py holds them to the runtime's own functions.

What the graphs compute, each the graph form of one runtime function:
- `uniforms_model`: runtime.counter_random.counter_uniforms (mix32 with BitwiseXor, BitShift,
  Mul and BitwiseAnd over uint64; every value stays below 2^59, so uint64 and the runtime's
  int64 agree bit for bit);
- `chain_verification_model`: runtime.verification.chains.verify_chain_block with the VANILLA
  rule (f = min(1, P/Q), residual Norm([P − Q]_+)) and runtime.sampling.inverse_cdf, with the
  tests' uniforms (kind TEST) and the next token's (kind NEXT) drawn in the graph, keyed as
  runtime.rounds.state.RoundState.uniforms keys them.

ONNX's BitShift takes unsigned integers only, so the hash runs on uint64 (onnxruntime's CPU
kernels have BitShift, BitwiseXor / BitwiseAnd and Mul for uint64; its CUDA kernels have none of
the bitwise ones). TensorRT 10's ONNX parser has none of the bitwise operators and computes no
float64 (export/trt_ops.py), so these are graphs for onnxruntime's CPU provider.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.counter_random import _IMAGE, _MASK32, _MULTIPLIER, _POSITION, _SECOND, _SEED, _SLOT
from specrt.runtime.rounds.state import KINDS, NEXT, PARTS, TEST

OPSET = 18  # the bundle's default opset (export.onnx_export.DEFAULT_OPSET): BitwiseXor / BitwiseAnd need 18
UNIFORM_INPUTS = ("seed", "image", "position", "slot")
CHAIN_INPUTS = ("p", "q", "drafts", "limits", "seed_low", "seed_high", "index", "round")
CHAIN_OUTPUTS = ("accepted", "next_token")
EMPTY_MASS = 1e-12  # runtime.verification.formulas.normalise: a row with no more mass falls back on P


class _Graph:
    """Nodes and constants of one graph, each output named once (a tiny onnx.helper emitter)."""

    def __init__(self) -> None:
        self.onnx = require("onnx", "the verification graph")
        self.nodes: list[Any] = []
        self.constants: list[Any] = []
        self._count = 0

    def _name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def op(self, op_type: str, *inputs: str, **attributes: Any) -> str:
        out = self._name(op_type.lower())
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [out], name=out, **attributes))
        return out

    def const(self, value: Any, dtype: Any) -> str:
        name = self._name("const")
        self.constants.append(self.onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def u64(self, value: int) -> str:
        return self.const(value, np.uint64)

    def model(self, inputs: Sequence[Any], outputs: Sequence[Any], name: str, opset: int) -> Any:
        helper = self.onnx.helper
        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), initializer=self.constants)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="specrt")
        self.onnx.checker.check_model(model)
        return model


def _mix32(g: _Graph, x: str) -> str:
    """runtime.counter_random.mix32 on uint64 values below 2^32."""
    shift, multiplier, mask = g.u64(16), g.u64(_MULTIPLIER), g.u64(_MASK32)
    for _ in range(2):
        x = g.op("BitwiseAnd", g.op("Mul", g.op("BitwiseXor", g.op("BitShift", x, shift, direction="RIGHT"), x),
                                    multiplier), mask)
    return g.op("BitwiseXor", g.op("BitShift", x, shift, direction="RIGHT"), x)


def _coordinate(g: _Graph, value: str, offset: int) -> str:
    """(value mod 2^32) ^ offset, on uint64, from an int64 coordinate."""
    return g.op("BitwiseXor", g.op("BitwiseAnd", g.op("Cast", value, to=g.onnx.TensorProto.UINT64), g.u64(_MASK32)),
                g.u64(offset))


def _uniforms(g: _Graph, seed: str, image: str, position: str, slot: str) -> str:
    """runtime.counter_random.counter_uniforms: float64 uniforms in (0, 1) of int64 coordinates
    (broadcast)."""
    key = _mix32(g, _coordinate(g, seed, _SEED))
    key = _mix32(g, g.op("BitwiseXor", key, _coordinate(g, image, _IMAGE)))
    key = _mix32(g, g.op("BitwiseXor", key, _coordinate(g, position, _POSITION)))
    high = _mix32(g, g.op("BitwiseXor", key, _coordinate(g, slot, _SLOT)))
    low = _mix32(g, g.op("BitwiseXor", high, g.u64(_SECOND)))
    bits = g.op("Add", g.op("Mul", g.op("BitShift", high, g.u64(5), direction="RIGHT"), g.u64(1 << 26)),
                g.op("BitShift", low, g.u64(6), direction="RIGHT"))
    as_double = g.op("Cast", bits, to=g.onnx.TensorProto.DOUBLE)
    return g.op("Div", g.op("Add", as_double, g.const(0.5, np.float64)), g.const(float(1 << 53), np.float64))


def _round_slot(g: _Graph, rounds: str, kinds: Any) -> str:
    """RoundState.uniforms' slot for part 0 of a kind of draw: kind + KINDS · PARTS · round (kinds an
    int or an array broadcasting with rounds)."""
    return g.op("Add", g.op("Mul", rounds, g.const(KINDS * PARTS, np.int64)), g.const(kinds, np.int64))


def _inverse_cdf(g: _Graph, rows: str, uniforms: str, vocab: int) -> str:
    """runtime.sampling.inverse_cdf of rows [B, V] (float32 or float64: the CDF is summed in the
    rows' own dtype, as the runtime's is) with uniforms [B] (float64): the count of CDF entries at
    or below u · total, at most V − 1."""
    cdf = g.op("Cast", g.op("CumSum", rows, g.const(-1, np.int64)), to=g.onnx.TensorProto.DOUBLE)
    total = g.op("Slice", cdf, g.const([-1], np.int64), g.const([vocab], np.int64), g.const([-1], np.int64))
    scaled = g.op("Mul", g.op("Unsqueeze", uniforms, g.const([1], np.int64)), total)
    # counted in float32 (exact below 2^24 entries): onnxruntime's int64 ReduceSum is ~15x slower on a CPU
    at_or_below = g.op("Cast", g.op("LessOrEqual", cdf, scaled), to=g.onnx.TensorProto.FLOAT)
    count = g.op("Cast", g.op("ReduceSum", at_or_below, g.const([1], np.int64), keepdims=0),
                 to=g.onnx.TensorProto.INT64)
    return g.op("Min", count, g.const(vocab - 1, np.int64))


def _row_at(g: _Graph, rows: str, index: str) -> str:
    """rows [B, N, V] at index [B] along N: [B, V]."""
    return g.op("GatherND", rows, g.op("Unsqueeze", index, g.const([1], np.int64)), batch_dims=1)


def _residual(g: _Graph, p_row: str, q_row: str) -> str:
    """VANILLA's resampling row: Norm([P − Q]_+) in float64, P where the residual has no mass
    (runtime.verification.formulas.residual)."""
    double = g.onnx.TensorProto.DOUBLE
    p64 = g.op("Cast", p_row, to=double)
    mass = g.op("Max", g.op("Sub", p64, g.op("Cast", q_row, to=double)), g.const(0.0, np.float64))
    total = g.op("ReduceSum", mass, g.const([-1], np.int64), keepdims=1)
    empty = g.op("LessOrEqual", total, g.const(EMPTY_MASS, np.float64))
    return g.op("Where", empty, p64, g.op("Div", mass, g.op("Where", empty, g.const(1.0, np.float64), total)))


def uniforms_model(opset: int = OPSET) -> Any:
    """The counter uniforms as a graph: int64 seed, image, position, slot (any broadcasting shapes;
    all rank 1 here) -> float64 uniforms, bit for bit runtime.counter_random.counter_uniforms."""
    onnx = require("onnx", "the verification graph")
    g = _Graph()
    inputs = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, ["n"]) for name in UNIFORM_INPUTS]
    g.nodes.append(onnx.helper.make_node("Identity", [_uniforms(g, *UNIFORM_INPUTS)], ["uniforms"]))
    output = onnx.helper.make_tensor_value_info("uniforms", onnx.TensorProto.DOUBLE, ["n"])
    return g.model(inputs, [output], "counter_uniforms", opset)


def chain_verification_model(draft_len: int, vocab: int, opset: int = OPSET) -> Any:
    """SD chain verification for a batch of images as one graph (verify_chain_block, VANILLA rule).

    Inputs: p [B, L + 1, V] float32 (the target's rows: row j predicts draft j + 1, row L the
    bonus position), q [B, L, V] float32 (the rows the drafts were drawn from), drafts [B, L],
    limits [B] (how many drafts may count), and the round's state: seed_low / seed_high [B], index
    [B] (the token index of the first draft: the image's committed length) and round [B], all
    int64. Outputs: accepted [B] and next_token [B], int64. The tests' uniforms are
    RoundState.uniforms(index + j, TEST), the next token's RoundState.uniforms(index, NEXT)."""
    if vocab >= 1 << 24:
        raise SpecrtError(f"the verification graph counts CDF entries in float32: a vocabulary of {vocab} is too large")
    onnx = require("onnx", "the verification graph")
    tensor, T = onnx.helper.make_tensor_value_info, onnx.TensorProto
    g = _Graph()
    p, q, drafts, limits, seed_low, seed_high, index, rounds = CHAIN_INPUTS
    inputs = [tensor(p, T.FLOAT, ["B", draft_len + 1, vocab]), tensor(q, T.FLOAT, ["B", draft_len, vocab]),
              tensor(drafts, T.INT64, ["B", draft_len]), *[tensor(name, T.INT64, ["B"]) for name in CHAIN_INPUTS[3:]]]
    column = g.const([1], np.int64)

    def per_image(name: str) -> str:  # [B] -> [B, 1], to broadcast over the draft positions
        return g.op("Unsqueeze", name, column)

    steps = g.const(np.arange(draft_len), np.int64)  # [L]
    # every uniform of the round in one hash: the L tests' at index + j, then the next token's at index
    offsets, kinds = np.append(np.arange(draft_len), 0), np.append(np.full(draft_len, TEST), NEXT)
    uniforms = _uniforms(g, per_image(seed_low), per_image(seed_high),
                         g.op("Add", per_image(index), g.const(offsets, np.int64)),
                         _round_slot(g, per_image(rounds), kinds))  # [B, L + 1]
    coins = g.op("Slice", uniforms, g.const([0], np.int64), g.const([draft_len], np.int64), column)
    next_uniforms = g.op("Squeeze", g.op("Slice", uniforms, g.const([draft_len], np.int64),
                                         g.const([draft_len + 1], np.int64), column), column)

    drafted = g.op("Unsqueeze", drafts, g.const([2], np.int64))  # [B, L, 1]
    # P's rows 0..L−1 at the drafts: GatherElements reads only the rows its indices [B, L, 1] cover
    at_drafts = [g.op("Cast", g.op("Squeeze", g.op("GatherElements", rows, drafted, axis=2), g.const([2], np.int64)),
                      to=T.DOUBLE) for rows in (p, q)]
    p_at, q_at = at_drafts
    relaxed = g.op("Greater", q_at, p_at)  # runtime.verification.formulas.acceptance: min(1, P/Q)
    f = g.op("Where", relaxed, g.op("Div", p_at, g.op("Where", relaxed, q_at, g.const(1.0, np.float64))),
             g.const(1.0, np.float64))
    passed = g.op("And", g.op("LessOrEqual", coins, f), g.op("Less", steps, per_image(limits)))
    failures = g.op("CumSum", g.op("Cast", g.op("Not", passed), to=T.INT64), column)
    leading = g.op("Cast", g.op("Equal", failures, g.const(0, np.int64)), to=T.INT64)
    accepted = g.op("ReduceSum", leading, column, keepdims=0)  # τ: the leading passes

    stop = g.op("Min", accepted, g.const(draft_len - 1, np.int64))
    resampled = _inverse_cdf(g, _residual(g, _row_at(g, p, stop), _row_at(g, q, stop)), next_uniforms, vocab)
    bonus = _inverse_cdf(g, _row_at(g, p, accepted), next_uniforms, vocab)
    next_token = g.op("Where", g.op("Less", accepted, limits), resampled, bonus)
    g.nodes.append(onnx.helper.make_node("Identity", [accepted], ["accepted"]))
    g.nodes.append(onnx.helper.make_node("Identity", [next_token], ["next_token"]))
    outputs = [tensor(name, T.INT64, ["B"]) for name in CHAIN_OUTPUTS]
    return g.model(inputs, outputs, "sd_chain_verification", opset)


def op_types(model: Any) -> list[str]:
    """The distinct operators a graph uses, sorted: what a runtime must implement to run it."""
    return sorted({node.op_type for node in model.graph.node})
