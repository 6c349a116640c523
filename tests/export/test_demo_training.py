"""`specrt demo train`'s code path on a tiny subset: every model trains, saves and loads back."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from specrt.export.demo import configs  # noqa: E402
from specrt.export.demo.dataset import load_split  # noqa: E402
from specrt.export.demo.evaluator import frechet_distance  # noqa: E402
from specrt.export.demo.pipeline import subset_split, train_demo  # noqa: E402
from specrt.export.demo.store import WEIGHT_FILES, load_demo  # noqa: E402
from specrt.models.llamagen_gpt import GPTConfig  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    small_gpt = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=configs.CODEBOOK_SIZE, num_classes=10,
                          grid_size=configs.GRID_SIZE, multiple_of=32)
    models = train_demo(out, seed=0, steps_scale=0.004, progress=False, split=subset_split(load_split(), 48, 40),
                        target_config=small_gpt, draft_config=small_gpt, evaluate=False, threads=1)
    return out, models


def test_training_writes_every_model_and_its_metrics(trained):
    out, models = trained
    for filename in WEIGHT_FILES.values():
        assert (out / filename).stat().st_size > 0
    config = json.loads((out / "demo.json").read_text())
    assert config["format"] == "specrt-demo" and config["training"]["seed"] == 0
    assert config["training"]["target"]["steps"] == round(configs.DemoTrainingConfig().target.steps * 0.004)
    assert config["dataset"]["tokenized_sequences"] == 48 * (2 * config["training"]["max_shift"] + 1) ** 2
    for role in ("vq", "target", "draft", "evaluator"):
        assert all(np.isfinite(v) for v in config["metrics"][role].values()), role
    assert 0.0 <= config["metrics"]["evaluator"]["held_out_accuracy"] <= 1.0
    assert config["sampling_defaults"] == configs.SAMPLING_DEFAULTS


def test_saved_weights_load_back_as_the_trained_models(trained):
    out, models = trained
    loaded = load_demo(out)
    classes, tokens = torch.tensor([3, 10]), torch.randint(0, configs.CODEBOOK_SIZE, (2, 64))
    with torch.no_grad():
        # weights are rounded to fp16 before saving, so what is stored is exactly what was evaluated
        assert torch.equal(loaded.target(classes, tokens), models.target(classes, tokens))
        images = torch.from_numpy(load_split().held_out_images[:4])
        assert loaded.vq.encode(images)[1].shape == (4, 8, 8)
        assert loaded.vq.decode_codes(torch.zeros(1, 8, 8, dtype=torch.long)).shape == (1, 3, 32, 32)
        assert torch.equal(loaded.evaluator(images), models.evaluator(images))


def test_same_seed_gives_the_same_evaluator():
    from specrt.export.demo.training import train_evaluator

    split = subset_split(load_split(), 64, 32)
    schedule = configs.Schedule(steps=3, batch_size=16, lr=1e-3, warmup=1)
    a, _ = train_evaluator(split, configs.DEFAULT_EVALUATOR, schedule, 2, seed=5, progress=False)
    b, _ = train_evaluator(split, configs.DEFAULT_EVALUATOR, schedule, 2, seed=5, progress=False)
    c, _ = train_evaluator(split, configs.DEFAULT_EVALUATOR, schedule, 2, seed=6, progress=False)
    assert torch.equal(a.fc.weight, b.fc.weight)
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_same_seed_gives_the_same_gpt():
    from specrt.export.demo.training import train_gpt

    cfg = GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=16, num_classes=10, grid_size=4, multiple_of=32,
                    dropout=0.1)
    rng = np.random.default_rng(0)
    codes, labels = rng.integers(0, 16, (40, 16)), rng.integers(0, 10, 40)
    schedule = configs.Schedule(steps=3, batch_size=8, lr=1e-3, warmup=1)
    a, _ = train_gpt(cfg, codes, labels, schedule, 0.1, seed=1, desc="a", progress=False)
    b, _ = train_gpt(cfg, codes, labels, schedule, 0.1, seed=1, desc="b", progress=False)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_frechet_distance_is_zero_for_identical_sets_and_grows_with_a_mean_shift():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(500, 8))
    assert abs(frechet_distance(feats, feats)) < 1e-6
    assert frechet_distance(feats, feats + 1.0) == pytest.approx(8.0, rel=1e-6)
