"""specrt.validation: every numeric input checked once for type, finiteness and range, with one
line naming the value and the allowed range — through the module itself, every method's PARAMS,
the Python API (Pipeline.generate) and the CLI."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specrt import validation
from specrt.errors import SpecrtError
from specrt.runtime.methods import METHODS, make_method
from specrt.runtime.sampling import SamplingParams


def test_integer_accepts_exact_integers_only():
    assert validation.integer("n", 4) == 4
    assert validation.integer("n", "4") == 4
    assert validation.integer("n", 4.0) == 4  # JSON may spell an integer 4.0
    assert validation.integer("n", np.int64(7), low=0, high=7) == 7
    for bad in (True, None, 4.5, "4.5", "four", math.nan, math.inf, [4], "", np.float32(np.nan)):
        with pytest.raises(SpecrtError, match="n must be an integer"):
            validation.integer("n", bad)
    with pytest.raises(SpecrtError, match=r"^n must be an integer in \[1, 3\], got 0$"):
        validation.integer("n", 0, low=1, high=3)


def test_number_rejects_nan_inf_and_bools_and_names_the_range():
    assert validation.number("x", "0.5", low=0, high=1, low_open=True) == 0.5
    assert validation.number("x", np.float32(2)) == 2.0
    for bad in (math.nan, "nan", math.inf, "-inf", True, None, "x", [1.0]):
        with pytest.raises(SpecrtError, match="^x must be a finite number"):
            validation.number("x", bad)
    with pytest.raises(SpecrtError, match=r"^x must be a finite number in \(0, 1\], got 0$"):
        validation.number("x", 0, low=0, high=1, low_open=True)
    with pytest.raises(SpecrtError, match=r"^x must be a finite number > 0, got -1$"):
        validation.number("x", -1, low=0, low_open=True)


def test_flag_is_strict():
    assert validation.flag("b", True) is True and validation.flag("b", "off") is False
    assert validation.flag("b", np.bool_(True)) is True
    for bad in (1, 0, 2, "maybe", None, 1.0):
        with pytest.raises(SpecrtError, match="b must be true or false"):
            validation.flag("b", bad)


def test_json_object_takes_objects_only():
    assert validation.json_object("p", '{"draft_len": 3}') == {"draft_len": 3}
    assert validation.json_object("p", "") == {} and validation.json_object("p", None) == {}
    with pytest.raises(SpecrtError, match="p is not valid JSON: Expecting"):
        validation.json_object("p", "{draft_len")
    with pytest.raises(SpecrtError, match="p must be a JSON object, got list"):
        validation.json_object("p", "[1]")


def test_thread_counts_are_bounded_by_the_machines_cpus(monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert validation.threads("--threads", 8) == 8 and validation.threads("--threads", "1") == 1
    assert validation.threads("--threads", 0, zero_means_default=True) == 0
    for bad in (9, 100000, 0, -1, 1.5, True, "x"):
        with pytest.raises(SpecrtError, match=r"^--threads must be an integer in \[1, 8\]: this machine has 8 CPU"):
            validation.threads("--threads", bad)
    with pytest.raises(SpecrtError, match=r"in \[0, 8\] \(0: the library's default\)"):
        validation.threads("--threads", 9, zero_means_default=True)
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # cannot tell: one thread is always allowed
    assert validation.threads("--threads", 1) == 1


def test_seed_and_class_ids():
    assert validation.seed(2**64 - 1) == 2**64 - 1
    for bad in (-1, 2**64, 1.5, "x", True):
        with pytest.raises(SpecrtError, match=r"seed must be an integer in \[0, 18446744073709551615\]"):
            validation.seed(bad)
    assert validation.class_ids(np.array([0, 9]), 10) == [0, 9]
    assert validation.class_ids(3, 10) == [3]
    for bad in ([10], [-1], [1.5], ["a"], [True]):
        with pytest.raises(SpecrtError, match=r"out of range: this model has classes 0..9"):
            validation.class_ids(bad, 10)
    with pytest.raises(SpecrtError, match="no class ids"):
        validation.class_ids([], 10)


@pytest.mark.parametrize("key, value, message", [
    ("cfg_scale", math.nan, "cfg_scale must be a finite number in [0, 1000], got nan"),
    ("cfg_scale", -1.0, "cfg_scale must be a finite number in [0, 1000]"),
    ("temperature", math.inf, "temperature must be a finite number in [0, 1000], got inf"),
    ("temperature", 1e-30, "temperature must be 0 (greedy) or >= 0.001"),
    ("top_k", 2.5, "top_k (0 disables it) must be an integer"),
    ("top_k", -3, "top_k (0 disables it) must be an integer"),
    ("top_p", 0.0, "top_p must be a finite number in (0, 1], got 0.0"),
    ("top_p", math.nan, "top_p must be a finite number in (0, 1]"),
])
def test_sampling_params_are_checked(key, value, message):
    with pytest.raises(SpecrtError) as info:
        SamplingParams(**{key: value})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_sampling_params_normalise_types():
    params = SamplingParams(cfg_scale="2", temperature=1, top_k="5", top_p=1)
    assert (params.cfg_scale, params.top_k) == (2.0, 5) and isinstance(params.top_k, int)


# Every parameter of every method: a meaningless value is refused with a line naming it.
BAD_VALUES = {
    "draft_len": [0, -1, 2.5, math.nan, True, "x"],
    "window": [0, -1, 3.5, math.inf],  # L = drafts verified per step: 1 is the smallest
    "tree": ["cone", 2],  # sjd-pac: spine | full; sd family: chain | static | dynamic
    "static_tree": ["oak", 25],
    "total_tokens": [0, -1, 2.5, math.nan],
    "depth": [0, 1.5, "deep"],
    "tree_top_k": [0, -3, 2.5, True],
    "branching": [0, -2, 1.5],
    "tree_depth": [-1, 0.5],
    "relaxation_budget": [0.5, math.nan, math.inf, -1.0, True],
    "decay": [0.0, -0.1, math.nan, 1e9],
    "slope_len": [0, -8, 8.5],
    "tvd_budget": [-0.1, 1.5, math.nan],
    "ratio": [0.9, math.inf, math.nan],
    "neighbours_k": [-1, 2.5],
    "schedule": ["cosine", 3],
    "resampling": ["g*", None],
    "theorem2": [2, "maybe", 1.0],
    "adaptive_continuation": [3, "sometimes"],
    "fused_drafting": [0, "yes please"],
    "proactive_drafting": [-1, "x"],
    "coupling": ["copula", 1],
    "group": [-1, 2.5, math.nan, True, 10**7],  # gsd G: a count of ranks, 0 = no grouping
    "gap": [-0.1, 1.5, math.nan],
    "radius": [-1.0, math.inf, math.nan],
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_parameter_has_a_range(method):
    for key in METHODS[method].PARAMS:
        assert key in BAD_VALUES, f"{method} parameter {key} has no bad values listed here"
        for value in BAD_VALUES[key]:
            with pytest.raises(SpecrtError) as info:
                make_method(method, **{key: value})
            line = str(info.value)
            assert key in line and "must be" in line and "\n" not in line, line
        make_method(method, **{key: METHODS[method].PARAMS[key].default})  # the default is valid


def test_string_values_from_the_cli_are_parsed_exactly():
    method = make_method("sjd-pac", window="8", adaptive_continuation="false", branching="2")
    assert (method.window, method.adaptive_continuation, method.branching) == (8, False, 2)
    with pytest.raises(SpecrtError, match="cool-sd linear schedule needs slope_len"):
        make_method("cool-sd", schedule="linear", draft_len=4, slope_len=2)


def test_pipeline_generate_checks_seed_and_class_ids():
    pytest.importorskip("torch")  # the toy backend runs the sampling head in torch
    from specrt.runtime.backends.toy import toy_models
    from specrt.runtime.pipeline import Pipeline

    target, draft, vq = toy_models(max_window=4)
    pipe = Pipeline(target, vq, draft, sampling_defaults={"cfg_scale": 1.0})
    for seed in (-1, 1.5, "x", 2**64):
        with pytest.raises(SpecrtError, match="seed must be an integer"):
            pipe.generate([0], seed=seed)
    for ids in ([1.5], [True], ["a"], [2]):
        with pytest.raises(SpecrtError, match="out of range"):
            pipe.generate(ids)
    with pytest.raises(SpecrtError, match="temperature must be"):
        pipe.generate([0], temperature=float("nan"))
    with pytest.raises(SpecrtError, match="unknown method"):
        pipe.generate([0], method=["ar"])
    assert pipe.generate([1], seed=2**64 - 1).tokens.shape == (1, 2, 2)


@pytest.mark.parametrize("args, message", [
    (["--cfg-scale", "nan"], "cfg_scale must be a finite number"),
    (["--temperature", "-1"], "temperature must be a finite number in [0, 1000]"),
    (["--top-k", "-2"], "top_k"),
    (["--top-p", "inf"], "top_p must be a finite number in (0, 1]"),
    (["--seed", "-5"], "seed must be an integer"),
    (["--seed", "abc"], "'abc' is not a valid integer"),
    (["--class", "1.5"], "'1.5' is not a valid integer"),
    (["--method", "sd", "--param", "draft_len=nan"], "sd draft_len (L) must be an integer"),
    (["--method", "sjd", "--param", "adaptive_continuation=2"], "must be true or false"),
    (["--max-window", "0"], "--max-window must be an integer"),
])
def test_cli_rejects_bad_numbers_with_one_line(args, message, capfd):
    pytest.importorskip("torch")
    from specrt.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *args])
    err = capfd.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("specrt: error: ") and message in err, err


# ---- every integer a command takes has a ceiling, checked as it is parsed ---------------------------


def _integer_parameters():
    import click

    from specrt.cli import cli

    def walk(command, path):
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, [*path, name])
        for param in command.params:
            if isinstance(param.type, click.types.IntParamType) and param.param_type_name == "option":
                yield path, param

    return [pytest.param(path, param, id=f"{' '.join(path)} {param.opts[0]}") for path, param in walk(cli, [])]


@pytest.mark.parametrize("path, param", _integer_parameters())
def test_every_integer_flag_of_every_command_is_bounded_before_it_runs(path, param, capsys, monkeypatch):
    """2^64 exceeds every ceiling (seeds included) and 2^40 every count's: each is one line and
    exit 2 from parsing itself, so no command body (no model load, no allocation) runs."""
    from cli_helpers import one_line, run
    from specrt.validation import SEED_MAX

    for command in _commands():  # the commands themselves, not the groups (their callbacks run first)
        monkeypatch.setattr(command, "callback", lambda *a, **k: pytest.fail("a command ran"))
    values = [str(SEED_MAX + 1), str(-(SEED_MAX + 1))] + ([] if "seed" in param.name else [str(2**40)])
    for value in values:
        code, err = run([*path, param.opts[0], value], capsys)
        assert code == 2 and param.opts[0] in one_line(err), (value, err)


def _commands():
    from specrt.cli import cli

    stack, found = [cli], []
    while stack:
        command = stack.pop()
        if not hasattr(command, "commands"):
            found.append(command)
        stack.extend(getattr(command, "commands", {}).values())
    return found


def test_counts_beyond_the_machines_memory_are_refused_before_allocation(monkeypatch):
    from specrt import validation

    monkeypatch.setattr(validation, "machine_memory", lambda: 1 << 30)  # 1 GiB free: half of it the budget
    assert validation.within_memory("images", 1024, 1 << 19, "x") == 1024  # 0.5 GiB: fits
    with pytest.raises(SpecrtError, match=r"images 1025: x would take 0\.5 GiB, more than half the 1\.0 GiB .* at most 1024"):
        validation.within_memory("images", 1025, 1 << 19, "x")


def test_the_python_api_bounds_images_by_memory(monkeypatch):
    from types import SimpleNamespace

    from specrt import validation
    from specrt.bench import run as bench_run
    from specrt.export.demo.registry import get_demo

    pipe = get_demo(None).hook("torch_pipeline")(None, threads=1)
    monkeypatch.setattr(validation, "machine_memory", lambda: 1 << 20)  # 1 MiB free
    monkeypatch.setattr(type(pipe), "_generate", lambda *a, **k: pytest.fail("decoding started"))
    with pytest.raises(SpecrtError, match="the images and tokens of one call would take"):
        pipe.generate([0] * 1000, method="ar")
    monkeypatch.setattr(bench_run, "run_settings", lambda *a, **k: pytest.fail("the bench started"))
    models = SimpleNamespace(pipeline=pipe, drafts={}, prompts=None)
    with pytest.raises(SpecrtError, match="images 1000: every setting's images"):
        bench_run.benchmark(models, [object()], images=1000)
    with pytest.raises(SpecrtError, match=r"images must be an integer in \[1, 1048576\]"):
        bench_run.benchmark(models, [object()], images=10**20)


@pytest.mark.parametrize("images, words", [(8, "mean nothing at this size"), (64, "mean nothing"),
                                           (65, "rough at this size"), (179, "rough"), (180, None), (1000, None)])
def test_bench_says_when_its_fidelity_columns_mean_nothing(images, words):
    from specrt.bench.run import FIDELITY_IMAGES, fidelity_sample_note

    note = fidelity_sample_note(images, feature_dim=64)
    assert (note is None) if words is None else (words in note and f"--images {FIDELITY_IMAGES}" in note)
