"""The PyTorch runner's ways of running the blocks' products and attention (models/step_kernels.py)
in whole decodes.

`fused` must decode what `separate` decodes (the same sums); the Triton kernels (`skinny` products,
`triton` attention) must keep the device round whole under torch.compile(fullgraph=True) (a graph
break would be a round a GPU cannot capture) and actually call their operators there. On a CPU an
operator's kernel is its torch reference, so this is the round's structure, not a kernel's speed."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specrt.models import skinny_matmul, window_attention  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402
from specrt.runtime.rounds import plan_round  # noqa: E402
from specrt.runtime.decoding import Decoding  # noqa: E402
from specrt.runtime.methods import make_method  # noqa: E402
from specrt.runtime.sampling import SamplingParams, guidance_mix  # noqa: E402
from round_runs import run_to_end  # noqa: E402
from test_rounds import tiny_models  # noqa: E402
from _toy_exact import one_torch_thread  # noqa: E402, F401 (autouse fixture)

GREEDY = SamplingParams(cfg_scale=2.0, temperature=0.0)
GUIDED = SamplingParams(cfg_scale=2.0, temperature=0.9)


def _pipeline(step_matmuls: str, dtype=torch.float32, loop: str = "host", step_attention: str = "sdpa") -> Pipeline:
    target, draft, vq = tiny_models(vocab=16, grid=4, classes=10)
    pipe = Pipeline.from_torch(target.to(dtype), draft.to(dtype), vq, max_window=16, compile=False,
                               sampling_defaults=GREEDY, step_matmuls=step_matmuls, step_attention=step_attention)
    pipe.loop = loop
    return pipe


def test_a_cpu_runner_keeps_the_products_apart_by_default_and_fuses_when_asked():
    target, draft, vq = tiny_models(vocab=16, grid=4, classes=10)
    pipe = Pipeline.from_torch(target, draft, vq, max_window=16, compile=False)
    assert pipe.target.step_matmuls == "separate"
    assert all(layer.feed_forward.gate_up is None for layer in pipe.target.gpt.layers)
    fused = _pipeline("fused")
    assert fused.target.step_matmuls == fused.draft.step_matmuls == "fused"
    assert all(layer.feed_forward.gate_up is not None for layer in fused.target.gpt.layers)
    with pytest.raises(ValueError, match="choose from separate, fused, skinny"):
        _pipeline("tiled")


@pytest.mark.parametrize("loop", ["host", "round"])
@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 3}), ("sjd", {"window": 3})])
def test_fused_products_decode_what_separate_ones_decode(loop, method, params):
    """Greedy: nothing drawn at random, so the same logits give the same tokens (the same sums in
    another layout; a tie at an argmax would flip one, and 16 tokens a vocabulary make that rare)."""
    tokens = {}
    for matmuls in ("separate", "fused"):
        pipe = _pipeline(matmuls, loop=loop)
        tokens[matmuls] = pipe.generate([3, 6, 1], method=method, seed=4, decode=False, **params).tokens
    np.testing.assert_array_equal(tokens["fused"], tokens["separate"])
    assert len({tuple(row.ravel()) for row in tokens["fused"]}) > 1


KERNELS = [("skinny", "sdpa", skinny_matmul), ("fused", "triton", window_attention)]


@pytest.mark.parametrize("matmuls,attention,module", KERNELS, ids=["skinny-matmuls", "triton-attention"])
@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"draft_len": 3}), ("sjd-pac", {"window": 3,
                                                                                             "proactive_drafting": False})])
def test_a_round_with_triton_kernels_traces_whole_and_runs_their_operator(monkeypatch, method, params, matmuls,
                                                                          attention, module):
    """bfloat16 weights (the kernels take half precision): the compiled round gives the eager round's
    tokens, and the kernel's operator ran inside it (its CPU kernel, the torch reference, counted)."""
    calls = []
    reference = module.reference_partials
    monkeypatch.setattr(module, "reference_partials", lambda *args: calls.append(1) or reference(*args))
    pipe = _pipeline(matmuls, dtype=torch.bfloat16, loop="round", step_attention=attention)
    method_ = make_method(method, **params)
    mix = guidance_mix(2, GUIDED)
    rows = Decoding(pipe.target, None, GUIDED, [], None).condition_rows(pipe.conditions([3, 6]))
    tokens = []
    for compiled in (False, True):
        round_ = plan_round(method_, pipe.target, pipe.draft, GUIDED, mix, None)
        with torch.inference_mode():
            state = round_.start(rows, [5, 6], pipe.target.spec.num_image_tokens)  # its prefill may call it too
            calls.clear()
            run_to_end(round_, state, compiled, pipe.target.spec.num_image_tokens)
            tokens.append(state.tokens[:, :16].clone())
        assert calls, f"the kernel's operator did not run in the {'compiled' if compiled else 'eager'} round"
    torch.testing.assert_close(tokens[1], tokens[0], rtol=0, atol=0)
