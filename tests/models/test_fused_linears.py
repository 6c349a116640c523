"""Products over one input run as one (models/fused_linears.py): LlamaGen's feed-forward (tested with
the skinny matmul) and the unified-vocabulary LM's q/k/v and gate/up, biases included."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specrt.export.unified.config import UnifiedConfig  # noqa: E402
from specrt.export.unified.model import UnifiedLM  # noqa: E402
from specrt.models.fused_linears import fuse_linears  # noqa: E402
from specrt.models.step_setup import fuse_projections, set_step_matmuls  # noqa: E402
from specrt.runtime.grammar import ImageGrammar  # noqa: E402


def tiny_unified(bias: bool) -> UnifiedLM:
    """A Janus-layout (plain pre-norm) UnifiedLM with random weights, biases on its projections or not."""
    dim, head_dim = 16, 8
    config = UnifiedConfig(architecture="chameleon", n_layer=2, n_head=2, n_kv_head=1, head_dim=head_dim, dim=dim,
                           ffn_hidden=2 * dim, text_vocab_size=16, norm_eps=1e-5,
                           inv_freq=[1.0 / 10000 ** (i / head_dim) for i in range(0, head_dim, 2)], rope_scaling=1.0,
                           grammar=ImageGrammar(2, 2, 3, row_end=True), cond_len=3, image_token_ids=(8, 9, 10),
                           row_end_id=11, attention_bias=bias, mlp_bias=bias)
    torch.manual_seed(3)
    model = UnifiedLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.5)
    return model


def logits(model: UnifiedLM) -> torch.Tensor:
    ids = torch.tensor([[0, 5, 6], [0, 0, 7]])
    mask = ids != 0
    stream = torch.tensor([[0, 1, 3, 2, 0, 3], [2, 2, 3, 1, 0, 3]])
    with torch.no_grad():
        return model.image_logits_of(ids, mask, stream)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_unified_lm_fused_gives_its_logits_and_keeps_its_checkpoint(bias):
    model = tiny_unified(bias)
    apart = logits(model)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert fuse_projections(model) == 4  # each layer's attention and MLP
    attention = model.layers[0].self_attn
    assert attention.q_proj.weight.data_ptr() == attention.qkv_weight.data_ptr()  # views, no second copy
    assert (attention.qkv_bias is not None) == bias
    torch.testing.assert_close(logits(model), apart, rtol=1e-5, atol=1e-4)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)
    changed = {name: tensor * 2 if "up_proj" in name or "v_proj" in name else tensor for name, tensor in before.items()}
    model.load_state_dict(changed)  # writes through the views into the fused buffers
    fused_changed = logits(model)
    assert not torch.allclose(fused_changed, apart)
    set_step_matmuls(model, "separate")
    assert attention.qkv_weight is None and model.layers[0].mlp.gate_up_weight is None
    torch.testing.assert_close(logits(model), fused_changed, rtol=1e-5, atol=1e-4)


def test_a_fused_unified_lm_still_trains_its_projections():
    model = tiny_unified(bias=True).train()
    fuse_projections(model)
    ids = torch.tensor([[0, 5, 6]])
    model.image_logits_of(ids, ids != 0, torch.tensor([[0, 1, 3, 2, 0, 3]])).sum().backward()
    layer = model.layers[0]
    for linear in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
        assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0
        assert linear.bias.grad is not None


def test_layers_with_and_without_biases_are_not_fused_together():
    with pytest.raises(ValueError, match="all have biases or none"):
        fuse_linears([torch.nn.Linear(4, 3), torch.nn.Linear(4, 3, bias=False)])


# (what is set, its choices: plain then the kernel's, the kernel's module, the operator's calls a step)
KERNEL_CHOICES = {"triton-attention": ("attention", ("sdpa", "triton"), "window_attention", 1),
                  # q/k/v fused, o, gate/up fused, down
                  "skinny-biased-products": ("matmuls", ("separate", "skinny"), "skinny_matmul", 4)}


@pytest.mark.parametrize("choice", list(KERNEL_CHOICES))
def test_the_unified_lm_runs_a_step_through_the_triton_kernels_where_asked(monkeypatch, choice):
    """One decode step of the unified LM's first layer over a static cache in bfloat16, biases on:
    with step attention "triton" its attention, with step matmuls "skinny" its four products, run
    the kernel's operator (its CPU kernel, the torch reference, counted), and the step's output
    matches the plain one's (scaled_dot_product_attention, F.linear); set back, the plain step
    again, bit for bit."""
    import importlib

    from specrt.models.step_setup import set_step_attention

    what, choices, module_name, calls_a_step = KERNEL_CHOICES[choice]
    setter = set_step_attention if what == "attention" else set_step_matmuls
    kernel = importlib.import_module(f"specrt.models.{module_name}")
    calls = []
    reference = kernel.reference_partials
    monkeypatch.setattr(kernel, "reference_partials", lambda *args: calls.append(1) or reference(*args))
    model = tiny_unified(bias=True).to(torch.bfloat16)
    step = one_decode_step(model)
    outputs = []
    for name in choices:
        setter(model, name)
        outputs.append(step())
    assert len(calls) == calls_a_step
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0.02, atol=0.05)
    setter(model, choices[0])
    assert torch.equal(step(), outputs[0]) and len(calls) == calls_a_step


def one_decode_step(model: UnifiedLM, rows: int = 2, capacity: int = 5):
    """A function running one decode step of `model`'s first layer (bfloat16) over a static cache of
    `capacity` positions, the same random inputs every call: its output in float32."""
    from specrt.models.kv_cache import CacheWrite, additive_mask

    config = model.config
    generator = torch.Generator().manual_seed(4)
    cache = torch.randn(rows, config.n_kv_head, capacity + 1, config.head_dim, generator=generator).bfloat16()
    x = torch.randn(rows, 1, config.dim, generator=generator).bfloat16()
    cos = torch.ones(rows, 1, 1, config.head_dim, dtype=torch.bfloat16)
    sin = torch.zeros(rows, 1, 1, config.head_dim, dtype=torch.bfloat16)
    mask = additive_mask(torch.ones(rows, 1, 1, capacity + 1, dtype=torch.bool), torch.bfloat16)

    def step() -> torch.Tensor:
        with torch.no_grad():
            return model.layers[0](x, cos, sin, CacheWrite(cache.clone(), capacity),
                                   CacheWrite(cache.clone(), capacity), mask)[0].float()
    return step
