"""The committed demo weights: they load, fit together, and are as good as demo.json says."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from specrt.export.demo import demo_dataset, load_demo, packaged_weights_dir  # noqa: E402
from specrt.export.demo.evaluator import accuracy, embed  # noqa: E402
from specrt.export.demo.report import sample_per_class  # noqa: E402
from specrt.export.demo.training import token_nll, tokenize  # noqa: E402
from specrt.runtime.sampling import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def demo():
    torch.set_num_threads(1)
    return load_demo()


def per_token_cost(cfg) -> int:
    """Multiply-adds per decoded token: the transformer layers plus the output head."""
    per_layer = 4 * cfg.dim * cfg.dim + 3 * cfg.dim * cfg.ffn_hidden
    return cfg.n_layer * per_layer + cfg.dim * cfg.vocab_size


def test_packaged_weights_are_small_and_complete():
    folder = packaged_weights_dir()
    files = sorted(p.name for p in folder.iterdir() if p.suffix in (".json", ".safetensors"))
    assert files == ["demo.json", "draft.safetensors", "eagle.json", "eagle.safetensors", "evaluator.safetensors",
                     "target.safetensors", "vq.safetensors"]
    assert sum((folder / name).stat().st_size for name in files) <= 25 * 2**20


def test_models_fit_together(demo):
    t, d, vq = demo.target.config, demo.draft.config, demo.vq.config
    assert t.vocab_size == d.vocab_size == vq.codebook_size >= 256
    assert t.grid_size == d.grid_size == 32 // vq.downsample == 8
    assert t.num_classes == d.num_classes == 10 and demo.target.null_class == 10
    assert t.n_layer >= 4 and vq.codebook_l2_norm and vq.codebook_embed_dim == 8
    assert per_token_cost(t) >= 8 * per_token_cost(d)  # the draft is about an order of magnitude cheaper
    assert demo.target.tok_embeddings.weight.dtype == torch.float32  # fp16 on disk, fp32 in memory
    assert isinstance(demo.sampling_defaults, SamplingParams)


def test_recorded_quality_meets_the_acceptance_bars(demo):
    q = demo.config["quality"]
    assert q["ar_accuracy_ratio"] >= 0.8
    assert q["sd_draft_len"] == 4 and q["sd_mean_accepted_length"] > 1.3
    assert q["sampling"] == {k: v for k, v in demo.config["sampling_defaults"].items()}


def test_evaluator_and_tokenizer_work_on_held_out_digits(demo):
    split = demo_dataset()
    assert accuracy(demo.evaluator, split.held_out_images, split.held_out_labels) >= 0.9
    images = split.held_out_images[:64]
    codes = tokenize(demo.vq, images)
    with torch.no_grad():
        recon = demo.vq.decode_codes(torch.from_numpy(codes).reshape(-1, 8, 8)).numpy()
    assert float(np.mean((recon - images) ** 2)) < 0.05
    # the target models held-out digits better than the draft, and both beat a uniform guess
    labels = split.held_out_labels[:64]
    target_nll, draft_nll = token_nll(demo.target, codes, labels), token_nll(demo.draft, codes, labels)
    assert target_nll < draft_nll < np.log(demo.target.config.vocab_size)


def test_ar_samples_are_recognisable_digits(demo):
    images, labels = sample_per_class(demo, 2, demo.sampling_defaults, seed=0)
    predicted = embed(demo.evaluator, images)[1]
    assert np.mean(predicted == labels) >= 0.7
