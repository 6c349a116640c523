"""`specrt generate --demo chameleon --prompt ...` with every method: the unified family's demo on
PyTorch through the CLI, the grammar kept, the digit drawn (the shipped checkpoints)."""
from __future__ import annotations

import numpy as np
import pytest

from cli_helpers import exit_code

METHODS = [("ar", []), ("sd", ["--param", "draft_len=4"]), ("cool-sd", ["--param", "relaxation_budget=2"]),
           ("lantern", ["--param", "tvd_budget=0.3"]), ("sjd", []), ("sjd-pac", [])]


@pytest.mark.parametrize("method,extra", METHODS, ids=[m for m, _ in METHODS])
def test_generate_with_every_method(method, extra, tmp_path, capsys):
    out = tmp_path / "two.png"
    assert exit_code("generate", "--demo", "chameleon", "--prompt", "a thin two", "--method", method, *extra,
                "--out", out, "--save-tokens", tmp_path / "t.npy", "--threads", 1) == 0
    assert out.is_file() and f", {method}: " in capsys.readouterr().out  # the closing line names the method
    assert np.load(tmp_path / "t.npy").shape == (1, 8, 8)


def test_the_demo_draws_the_asked_digits():
    """Through the whole unified path (recipe, grammar, CFG 3 by default) the shipped target draws
    what the prompt names: the t2i evaluator reads the digit of most of 10 images (the training
    report measured 98.8% over 160)."""
    from specrt.export.demo.registry import get_demo
    from specrt.export.demo.t2i.evaluator import predict
    from specrt.export.demo.unified.store import load_evaluator
    from specrt.runtime.pipeline import from_uint8

    pipe = get_demo("chameleon").hook("torch_pipeline")(None, threads=1)
    digits = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    result = pipe.generate(prompts=[f"the digit {d}" for d in digits], method="sjd", seed=0)
    assert pipe.grammar.is_valid(result.stream).all()
    read = predict(load_evaluator(), from_uint8(result.images))["digit"]
    assert (read == np.arange(10)).mean() >= 0.7


def test_a_trained_weights_folder_runs_on_pytorch_with_its_own_tokenizer(tmp_path):
    """`--weights DIR` (what `specrt demo train` writes: target/, draft/, demo.json): the pipeline reads
    the tokenizer from DIR/target like the models, and a copy of the shipped folder draws the shipped tokens."""
    import shutil

    from specrt.export.demo.registry import get_demo
    from specrt.export.demo.unified.store import weights_dir

    folder = tmp_path / "trained"
    shutil.copytree(weights_dir(), folder, ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    pipelines = [get_demo("chameleon").hook("torch_pipeline")(weights, threads=1) for weights in (None, folder)]
    shipped, copied = (pipe.generate(prompts=["a thin two"], method="ar", seed=3, decode=False) for pipe in pipelines)
    np.testing.assert_array_equal(shipped.tokens, copied.tokens)
