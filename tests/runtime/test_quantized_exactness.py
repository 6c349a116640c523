"""Lossless with respect to the graph that verifies: exactness with quantized ONNX graphs.

A tiny LlamaGen GPT (vocab 3, 2x2 grid: 81 sequences) is exported to a bundle and quantized
with `specrt quantize` (onnxruntime int4 and int8, no extra package). The exact sequence distribution
of a bundle's target is enumerated from its own ONNX graph through the onnxruntime runner,
prefix by prefix, and SD's samples are compared with it by chi-square:

- int4 draft (CFG + top-k): P is the fp32 target's (unchanged), only the acceptance rate moves;
- int4 target: P is the int4 target's distribution — a different P, sampled exactly, and the
  same samples fail against the fp32 target's P;
- int8 target (onnxruntime's dynamic MatMulInteger, activations quantized on each call): SD with
  CFG + top-k and SJD sample the int8 graph's own P, enumerated the same way;
- a broken SD (resampling from P instead of the residual) is caught, with the int4 draft and with
  the int8 target.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from _toy_exact import chi_square
from specrt.engines.quantize import QuantizeOptions, quantize_bundle
from specrt.runtime.pipeline import Pipeline
from specrt.runtime.runner import ModelRunner
from specrt.runtime.sampling import SamplingParams, guidance_mix, needs_restriction, restrict
from specrt.runtime.window import Window

torch = pytest.importorskip("torch")

VOCAB, GRID, CLASSES, CLASS_ID = 3, 2, 2, 1
SAMPLES = 4_000  # 2,000 already told the int4 target's P from the fp32 one (chi2 124 vs 66 critical)
PLAIN = SamplingParams(cfg_scale=1.0)
GUIDED = SamplingParams(cfg_scale=2.0, temperature=0.9, top_k=2)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    return make_bundles(tmp_path_factory.mktemp("exact"))


def make_bundles(root: Path) -> dict[str, Path]:
    """fp32, int4-draft, int4-target and int8-target bundles of one tiny model family under `root`."""
    from specrt.export.bundle import ExportOptions, ModelSet, write_bundle
    from specrt.models.llamagen_gpt import GPT, GPTConfig
    from specrt.models.llamagen_vq import VQConfig, VQModel

    torch.manual_seed(0)
    gpt = dict(vocab_size=VOCAB, num_classes=CLASSES, grid_size=GRID, multiple_of=16)
    target, draft = GPT(GPTConfig(dim=64, n_layer=1, n_head=2, **gpt)), GPT(GPTConfig(dim=32, n_layer=1, n_head=2, **gpt))
    with torch.no_grad():  # weights of std 0.2, not 0.02: peaked, context-dependent rows
        for model in (target, draft):
            for weight in model.parameters():
                if weight.dim() == 2:
                    weight.mul_(0.2 / weight.std())
    vq = VQModel(VQConfig(codebook_size=VOCAB, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), z_channels=8,
                          num_res_blocks=1, norm_groups=4, codebook_show_usage=False))
    models = ModelSet(target=target.eval(), draft=draft.eval(), vq=vq.eval())
    write_bundle(models, root / "fp32", ExportOptions(max_window=4, max_batch=2, neighbours_k=1))
    out = {"fp32": root / "fp32"}
    for role in ("draft", "target"):
        out[role] = root / f"int4-{role}"
        quantize_bundle(out["fp32"], out[role], QuantizeOptions(mode="int4", block_size=16), graphs=[role])
    out["int8"] = root / "int8-target"
    quantize_bundle(out["fp32"], out["int8"], QuantizeOptions(mode="int8", tool="onnxruntime"), graphs=["target"])
    return out


def graph_distribution(runner: ModelRunner, sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x_1..x_4) of the graph behind `runner`, by the chain rule over its own rows, each
    computed from a fresh prefill and one step over the whole prefix (no cache reuse)."""
    runner.allocate(guidance_mix(1, sampling))
    rows = [CLASS_ID, runner.spec.null_class] if sampling.uses_cfg else [CLASS_ID]
    length = GRID * GRID
    next_row = {}
    for k in range(length):
        for prefix in itertools.product(range(VOCAB), repeat=k):
            runner.truncate(0)
            out = runner.prefill(np.array(rows), np.full((1, 1), 0.5))
            if k:
                out = runner.step(Window.chain(prefix), np.full((1, k), 0.5))
            probs = np.asarray(out.probs)[:, -1:]
            row = (restrict(probs, sampling) if needs_restriction(sampling) else probs.astype(np.float64))[0, 0]
            next_row[prefix] = row / row.sum()
    exact = {}
    for seq in itertools.product(range(VOCAB), repeat=length):
        exact[seq] = float(np.prod([next_row[seq[:k]][seq[k]] for k in range(length)]))
    return exact


def sd_tokens(bundle: Path, sampling: SamplingParams, method="sd", **params) -> np.ndarray:
    pipe = Pipeline(**_parts(bundle))
    return pipe.generate([CLASS_ID] * SAMPLES, method=method, seed=11, **vars(sampling), **params).tokens


def _parts(bundle: Path) -> dict:
    from specrt.runtime.backends.ort_backend import pipeline_parts_from_bundle

    return pipeline_parts_from_bundle(bundle, threads=1)


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a[s] - b[s]) for s in a)


def test_int4_draft_leaves_p_unchanged(bundles):
    p = graph_distribution(Pipeline(**_parts(bundles["fp32"])).target, GUIDED)
    statistic, critical = chi_square(sd_tokens(bundles["draft"], GUIDED, draft_len=3), p)
    assert statistic < critical, f"int4 draft: chi2 {statistic:.1f} >= {critical:.1f} against the fp32 target's P"


def test_int4_target_is_a_new_p_sampled_exactly(bundles):
    fp32 = graph_distribution(Pipeline(**_parts(bundles["fp32"])).target, PLAIN)
    p = graph_distribution(Pipeline(**_parts(bundles["target"])).target, PLAIN)
    assert abs(sum(p.values()) - 1) < 1e-6
    assert total_variation(p, fp32) > 0.02  # quantizing really moved P (TV 0.08 here)
    tokens = sd_tokens(bundles["target"], PLAIN, draft_len=3)
    statistic, critical = chi_square(tokens, p)
    assert statistic < critical, f"int4 target: chi2 {statistic:.1f} >= {critical:.1f} against its own P"
    # and the fp32 target's P is the wrong reference for it: the check tells them apart
    statistic, critical = chi_square(tokens, fp32)
    assert statistic > critical, f"int4 target passed against the fp32 P: chi2 {statistic:.1f} < {critical:.1f}"


@pytest.mark.parametrize("method,params,sampling", [("sd", {"draft_len": 3}, GUIDED), ("sjd", {"window": 3}, PLAIN)])
def test_int8_target_is_sampled_exactly(bundles, method, params, sampling):
    """The int8 target is the model: a speculative method samples its P, draft or no draft."""
    p = graph_distribution(Pipeline(**_parts(bundles["int8"])).target, sampling)
    assert abs(sum(p.values()) - 1) < 1e-6
    statistic, critical = chi_square(sd_tokens(bundles["int8"], sampling, method=method, **params), p)
    assert statistic < critical, f"{method} on the int8 target: chi2 {statistic:.1f} >= {critical:.1f} against its P"


@pytest.mark.parametrize("bundle,verifier", [("draft", "fp32"), ("int8", "int8")])
def test_a_broken_sd_is_still_caught_on_a_quantized_bundle(bundles, bundle, verifier):
    from test_losslessness import BrokenSD  # resamples from P instead of the residual Norm([P − Q]_+)

    p = graph_distribution(Pipeline(**_parts(bundles[verifier])).target, PLAIN)
    pipe = Pipeline(**_parts(bundles[bundle]))
    tokens = pipe.generate([CLASS_ID] * SAMPLES, method=BrokenSD(draft_len=3), seed=11, **vars(PLAIN)).tokens
    statistic, critical = chi_square(tokens, p)
    assert statistic > critical, f"broken SD passed: chi2 {statistic:.1f} < {critical:.1f}"
