"""LlamaGen VQ tokenizer: key layout of the real VQ-16, decode numerics against a plain
functional reference, quantizer semantics, trainability and ONNX export of the decoder."""
import pytest
import torch

from specrt.export.checkpoints import infer_vq_config, load_vq
from specrt.models.llamagen_vq import VQ_ARCHS, VQConfig, VQModel

from llamagen_reference import reference_vq_decode

SMALL = VQConfig(codebook_size=64, codebook_embed_dim=4, ch=16, ch_mult=(1, 2, 2), z_channels=32, norm_groups=8)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)


def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Perturb every parameter (GroupNorm affine included) so no term is an identity."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen) if name.endswith("weight") else 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))


def test_vq16_layout_and_decode_shape():
    model = VQModel(VQ_ARCHS["VQ-16"]).eval()
    state = model.state_dict()
    # Shapes as in LlamaGen's VQ-16 (ch 128, ch_mult 1,1,2,2,4, z 256, codebook 16384x8).
    expected = {
        "quantize.embedding.weight": (16384, 8),
        "quantize.codebook_used": (65536,),
        "quant_conv.weight": (8, 256, 1, 1),
        "post_quant_conv.weight": (256, 8, 1, 1),
        "encoder.conv_in.weight": (128, 3, 3, 3),
        "encoder.conv_blocks.2.res.0.nin_shortcut.weight": (256, 128, 1, 1),
        "encoder.conv_blocks.3.downsample.conv.weight": (256, 256, 3, 3),
        "encoder.conv_blocks.4.attn.1.q.weight": (512, 512, 1, 1),
        "encoder.conv_out.weight": (256, 512, 3, 3),
        "decoder.conv_in.weight": (512, 256, 3, 3),
        "decoder.mid.1.proj_out.weight": (512, 512, 1, 1),
        "decoder.conv_blocks.0.res.2.conv2.weight": (512, 512, 3, 3),
        "decoder.conv_blocks.0.attn.2.k.weight": (512, 512, 1, 1),
        "decoder.conv_blocks.0.upsample.conv.weight": (512, 512, 3, 3),
        "decoder.conv_blocks.1.res.0.nin_shortcut.weight": (256, 512, 1, 1),
        "decoder.conv_blocks.4.res.2.conv1.weight": (128, 128, 3, 3),
        "decoder.norm_out.weight": (128,),
        "decoder.conv_out.weight": (3, 128, 3, 3),
    }
    for key, shape in expected.items():
        assert tuple(state[key].shape) == shape, key
    assert not any(k.startswith("decoder.conv_blocks.4.upsample") for k in state)  # top level: no upsample
    assert not any(k.startswith("encoder.conv_blocks.4.downsample") for k in state)
    assert not any(k.startswith("decoder.conv_blocks.1.attn") for k in state)  # attention only at the lowest resolution
    assert 71_000_000 < sum(p.numel() for p in model.parameters()) < 73_000_000  # LlamaGen: "72M"
    assert infer_vq_config(state).ch_mult == (1, 1, 2, 2, 4)
    with torch.no_grad():
        image = model.decode_codes(torch.tensor([[[0, 5], [16383, 7]]], dtype=torch.int32))
    assert image.shape == (1, 3, 32, 32) and torch.isfinite(image).all()


def test_small_decode_matches_reference_after_checkpoint_roundtrip(tmp_path):
    source = VQModel(SMALL)
    _randomise(source)
    path = tmp_path / "vq.pt"
    torch.save({"model": source.state_dict(), "discriminator": {}, "steps": 3}, path)
    model = load_vq(path, norm_groups=8)
    assert model.config == SMALL
    codes = torch.randint(0, 64, (2, 3, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        image = model.decode_codes(codes.int())
        expected = reference_vq_decode(source.state_dict(), codes, levels=3, res_per_level=3, groups=8)
    assert image.shape == (2, 3, 12, 20)
    torch.testing.assert_close(image, expected, atol=1e-4, rtol=1e-4)
    decoder = load_vq(path, decoder_only=True, norm_groups=8)
    with torch.no_grad():
        torch.testing.assert_close(decoder(codes.int()), image, atol=0, rtol=0)


def test_encode_picks_nearest_normalised_codeword():
    model = VQModel(SMALL).eval()
    _randomise(model, seed=1)
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        quantized, codes, losses = model.encode(images)
        z = torch.nn.functional.normalize(model.quant_conv(model.encoder(images)), dim=1)
        codebook = torch.nn.functional.normalize(model.quantize.embedding.weight, dim=1)
    assert codes.shape == (2, 4, 4) and quantized.shape == (2, 4, 4, 4)
    # cosine similarity is maximal for the chosen code
    expected = torch.einsum("bchw,nc->bhwn", z, codebook).argmax(-1)
    assert torch.equal(codes, expected)
    torch.testing.assert_close(quantized, codebook[codes].permute(0, 3, 1, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(losses["commit_loss"], 0.25 * losses["vq_loss"])


def test_training_reduces_reconstruction_loss_and_reaches_the_encoder():
    torch.manual_seed(0)
    model = VQModel(SMALL).train()
    images = torch.rand(2, 3, 8, 8) * 2 - 1
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)

    def total_loss():
        reconstruction, losses = model(images)
        return (reconstruction - images).pow(2).mean() + losses["vq_loss"] + losses["commit_loss"], losses

    first, losses = total_loss()
    assert 0.0 < losses["codebook_usage"].item() <= 1.0
    first.backward()
    assert model.encoder.conv_in.weight.grad.abs().sum() > 0  # straight-through estimator
    optimiser.step()
    for _ in range(12):
        optimiser.zero_grad()
        loss, _ = total_loss()
        loss.backward()
        optimiser.step()
    assert loss.item() < 0.7 * first.item()


def test_config_rejects_groups_that_do_not_divide_channels():
    with pytest.raises(ValueError, match="norm_groups"):
        VQConfig(ch=48, norm_groups=32)


def test_decoder_exports_to_onnx_with_int32_codes(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from torch.export import Dim

    model = VQModel(SMALL).eval()
    _randomise(model)
    decoder = model.decoder_only().eval()
    path = tmp_path / "vq.onnx"
    example = torch.randint(0, 64, (2, 4, 4), dtype=torch.int32)
    torch.onnx.export(decoder, (example,), str(path), opset_version=18, input_names=["codes"], output_names=["image"],
                      dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    codes = torch.randint(0, 64, (3, 4, 4), dtype=torch.int32)
    (image,) = session.run(None, {"codes": codes.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(image), decoder(codes), atol=1e-4, rtol=1e-4)
