"""LTH14/mar checkpoint layout -> specrt's MAR-style model (export/mar/checkpoint.py), random weights.

The layouts are written here from MAR's module definitions (models/mar.py: timm Blocks named
encoder_blocks/decoder_blocks with mlp.fc1/fc2, z_proj_ln, *_pos_embed_learned with the buffer
positions, mask_token; models/diffloss.py: SimpleMLPAdaLN with out_channels = 2C and 256
timestep features), and saved as MAR saves them ({'model', 'model_ema'}).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specrt.errors import SpecrtError  # noqa: E402
from specrt.export.mar.checkpoint import load_mar_checkpoint, load_mar_head  # noqa: E402
from specrt.models.mar.model import MAR, MARConfig, random_mar  # noqa: E402

CFG = MARConfig(token_dim=3, seq_len=4, dim=16, n_layer=2, n_head=2, num_classes=5, head_width=8, head_depth=2,
                diffusion_steps=1000, schedule="cosine", input_norm=True, head_freq_dim=256)


def mar_layout(model: MAR, seed: int = 7) -> dict:
    """Our model's weights under MAR's names (causal variant), the head with MAR's 2C outputs."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, value in model.state_dict().items():
        name = key.replace("transformer.blocks.", "encoder_blocks.").replace(".mlp.0.", ".mlp.fc1.") \
                  .replace(".mlp.2.", ".mlp.fc2.") if key.startswith("transformer.blocks.") else key
        name = {"transformer.pos_embed": "encoder_pos_embed_learned", "transformer.fake_latent": "fake_latent"}.get(name, name)
        name = name.replace("transformer.norm.", "encoder_norm.").replace("transformer.", "")
        if name.startswith("diffloss.net.final_layer.linear."):  # MAR appends the learned-variance rows
            value = torch.cat([value, torch.randn(value.shape, generator=gen)])
        out[name] = value.clone()
    return out


def test_a_causal_mar_layout_loads_exactly(tmp_path):
    model = random_mar(CFG, seed=0)
    path = tmp_path / "checkpoint-last.pth"
    torch.save({"model": {k: torch.zeros_like(v) for k, v in mar_layout(model).items()},
                "model_ema": mar_layout(model), "epoch": 3}, path)
    loaded = load_mar_checkpoint(path, n_head=2)
    assert loaded.cfg == CFG
    for key, value in model.state_dict().items():  # the EMA weights, not 'model'
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)
    tokens, ids, positions = torch.randn(1, 3, 3), torch.tensor([2]), torch.arange(3)
    past = model.transformer.empty_cache(1)
    z_ref = model.transformer.step(tokens, ids, positions, *past)[0]
    torch.testing.assert_close(loaded.transformer.step(tokens, ids, positions, *past)[0], z_ref)


def test_the_masked_encoder_decoder_is_refused_and_its_head_loads():
    model = random_mar(CFG, seed=1)
    state = mar_layout(model)
    state.update({"mask_token": torch.zeros(1, 1, 16), "decoder_embed.weight": torch.zeros(16, 16),
                  "decoder_blocks.0.norm1.weight": torch.ones(16), "decoder_blocks.1.norm1.weight": torch.ones(16),
                  "encoder_pos_embed_learned": torch.zeros(1, 64 + 4, 16),
                  "diffusion_pos_embed_learned": torch.zeros(1, 4, 16)})
    with pytest.raises(SpecrtError, match=r"masked bidirectional .*2 encoder \+ 2 decoder blocks.*buffer_size 64") as err:
        load_mar_checkpoint(state, n_head=2)
    assert "\n" not in str(err.value)
    head, cfg = load_mar_head(state)
    assert (cfg.token_dim, cfg.head_width, cfg.head_depth, cfg.head_freq_dim) == (3, 8, 2, 256)
    x, t, z = torch.randn(5, 3), torch.randint(0, 1000, (5,)), torch.randn(5, 16)
    with torch.no_grad():  # MAR's head with its 2C outputs, computed by hand: ε is the first C
        net = model.diffloss.net
        c = net.time_embed(t) + net.cond_embed(z)
        h = net.input_proj(x)
        for block in net.res_blocks:
            h = block(h, c)
        shift, scale = net.final_layer.adaLN_modulation(c).chunk(2, dim=-1)
        full = torch.nn.functional.linear(net.final_layer.norm_final(h) * (1 + scale) + shift,
                                          state["diffloss.net.final_layer.linear.weight"],
                                          state["diffloss.net.final_layer.linear.bias"])
        torch.testing.assert_close(head(x, t, z), full[:, :3])


@pytest.mark.parametrize("state, message", [
    ({"model": {"blocks.0.weight": torch.zeros(1)}}, "not an LTH14/mar checkpoint"),
    ({"diffloss.net.input_proj.weight": torch.zeros(8, 3)}, "lacks class_emb.weight"),
])
def test_what_cannot_be_mapped_is_one_line(state, message):
    with pytest.raises(SpecrtError, match=message):
        load_mar_checkpoint(state, n_head=2)


def test_an_unknown_key_is_named():
    state = mar_layout(random_mar(CFG, seed=2))
    state["diffusion_pos_embed_learned"] = torch.zeros(1, 4, 16)
    with pytest.raises(SpecrtError, match="no counterpart .* diffusion_pos_embed_learned"):
        load_mar_checkpoint(state, n_head=2)
