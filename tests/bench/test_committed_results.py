"""The committed default run (bench/results/demo.json): complete, and showing every method's speed and fidelity.

These read the numbers `specrt bench --json bench/results/demo.json` measured on the trained
demo; they fail if a re-run that is committed loses a method, a field, or one of the
properties the README and docs/benchmarks.md state.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrt.bench.settings import DEFAULT_METHODS

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
pytestmark = pytest.mark.skipif(not (RESULTS / "demo.json").is_file(), reason="no committed bench results yet")


@pytest.fixture(scope="module")
def payload():
    return json.loads((RESULTS / "demo.json").read_text())


def by_label(payload):
    return {r["label"]: r for r in payload["results"]}


def cool_sd(payload):
    rows = [r for r in payload["results"] if r["method"] == "cool-sd"]
    return sorted(rows, key=lambda r: r["params"]["relaxation_budget"])


def test_every_method_measured_on_a_named_device(payload):
    assert payload["device"] and payload["backend"] == "ort"
    assert {r["method"] for r in payload["results"]} == set(DEFAULT_METHODS)
    assert payload["settings"]["fd_noise_floor"]["frechet_distance"] is not None
    assert (RESULTS / "demo.png").is_file()


def test_sjd_pac_accepts_more_than_sjd(payload):
    rows = by_label(payload)
    assert rows["sjd-pac"]["mean_accepted_length"] > rows["sjd"]["mean_accepted_length"]


def test_cool_sd_accepted_length_grows_with_delta(payload):
    lengths = [r["mean_accepted_length"] for r in cool_sd(payload)]
    assert len(lengths) >= 3 and lengths == sorted(lengths)
    assert lengths[0] > by_label(payload)["sd"]["mean_accepted_length"]


def test_cool_sd_fidelity_does_not_improve_with_delta(payload):
    """More relaxation cannot buy fidelity: the largest δ is not better than SD by more than the noise floor."""
    floor = payload["settings"]["fd_noise_floor"]["frechet_distance"]
    sd = by_label(payload)["sd"]["quality"]["frechet_distance"]
    assert cool_sd(payload)[-1]["quality"]["frechet_distance"] >= sd - floor


@pytest.mark.parametrize("family", [("sd", "sjd", "sjd-pac"), ("cool-sd", "lantern")], ids=["lossless", "relaxed"])
def test_each_family_beats_ar_or_the_profile_shows_where_it_would(payload, family):
    """Faster than ar in the same run; where the demo is too small for that on this CPU, the
    committed --profile-arch run must cover the family and show that the same accepted lengths
    do better on LlamaGen-B's step costs (the demo's cost structure, not the method, is the limit)."""
    measured = max(r["speedup_vs_ar"] for r in payload["results"] if r["method"] in family)
    if measured > 1.0:
        return
    profile = json.loads((RESULTS / "profile-llamagen-c2i-B.json").read_text())
    predicted = [p for p in profile["predictions"] if p["method"] in family]
    assert {p["label"] for p in predicted} == {r["label"] for r in payload["results"] if r["method"] in family}
    assert max(p["predicted_speedup"] for p in predicted) > measured
    assert (RESULTS / "profile-llamagen-c2i-B.png").is_file()


@pytest.mark.skipif(not (RESULTS / "demo-h100.json").is_file(), reason="no committed GPU results")
def test_gpu_results_name_the_gpu_and_cover_every_method():
    """The demo on PyTorch + CUDA graphs and the LlamaGen profiles, measured on an H100,
    committed with the device named; the README and docs/benchmarks.md quote them beside the CPU figures."""
    run = json.loads((RESULTS / "demo-h100.json").read_text())
    assert "H100" in run["device"] and run["backend"] == "torch-cuda"
    assert {r["method"] for r in run["results"]} == set(DEFAULT_METHODS)
    for result in run["results"]:  # bytes read back per model call: O(W + V), not W·V
        assert result["host_bytes_per_forward"] is not None and result["host_bytes_per_forward"] > 0
    eager = json.loads((RESULTS / "demo-h100-eager.json").read_text())  # before CUDA graphs
    speed = lambda payload: {r["label"]: r["latency_s"]["median"] for r in payload["results"]}  # noqa: E731
    assert speed(run)["ar"] < speed(eager)["ar"] / 3  # CUDA graphs: the fix the H100 run made
    for arch in ("B", "XL"):
        profile = json.loads((RESULTS / f"profile-llamagen-c2i-{arch}-h100.json").read_text())
        assert "H100" in profile["device"] and profile["cuda_graphs"] is True
        assert {(c["dtype"], c["images"]) for c in profile["curves"]} == {("fp32", 1), ("fp32", 8), ("bf16", 1),
                                                                           ("bf16", 8)}
        for curve in profile["curves"]:
            assert curve["windows"] == [1, 2, 4, 8, 16, 32, 64]
            assert 0 < curve["memory_bound_floor_s"] < curve["target_step_s"][0]  # no step beats the bandwidth
    readme = (RESULTS.parents[1] / "README.md").read_text()
    assert "H100" in readme and "demo-h100" in readme and "llamagen-c2i-XL" in readme
    benchmarks = (RESULTS.parents[1] / "docs" / "benchmarks.md").read_text()
    assert "demo-h100" in benchmarks and "llamagen-c2i-XL --device cuda" in benchmarks


def test_int4_step_of_gpt_b_is_faster_than_fp32_at_one_token():
    """The committed `bench --profile-arch llamagen-c2i-B` run timed the exported GPT-B step on
    onnxruntime at fp32 and int4 (MatMulNBits, accuracy_level 4), interleaved in one run."""
    profile = json.loads((RESULTS / "profile-llamagen-c2i-B-int4.json").read_text())
    fp32, int4 = (profile["onnxruntime_target_step_s"][p] for p in ("fp32", "int4"))
    assert profile["windows"][0] == 1 and int4[0] < fp32[0]
    sizes = profile["onnxruntime_weight_bytes_per_step"]
    assert sizes["int4"] < sizes["fp32"] / 4


def test_committed_precision_run_has_the_self_draft_beside_the_independent_one():
    """`specrt bench --precision fp32,int8,int4,self-int4` one run, every precision;
    the self-draft's sd accepts more than the independent draft's, on the unchanged target."""
    run = json.loads((RESULTS / "precision-demo.json").read_text())
    rows = {(r["precision"], r["label"]): r for r in run["rows"]}
    assert {p for p, _ in rows} == {"fp32", "int8", "int4", "self-int4"}
    assert rows["self-int4", "sd"]["accepted_length"] > rows["fp32", "sd"]["accepted_length"] + 1
    assert rows["self-int4", "ar"]["greedy_agreement"] == 1.0  # the same fp32 target
    assert rows["int4", "ar"]["weight_mb_per_target_step"] < rows["fp32", "ar"]["weight_mb_per_target_step"] / 4
    assert "AMD EPYC" in run["device"]


def test_batch_8_costs_ar_sd_and_sjd_less_per_image_than_batch_1():
    """bench/results/demo-batch.json (`specrt bench --batch 1,8`): one run, the same tokens at both
    sizes, and ar's, sd's and sjd's per-image latency at batch 8 below their own at batch 1.
    SJD-PAC is not among them on this CPU: its 65-token window over 16 model rows is compute-bound
    and a batch waits for its slowest image (quiet 2-core EPYC, 2026-11-24: 139 vs 132 ms per image;
    docs/benchmarks.md, "Batches")."""
    path = RESULTS / "demo-batch.json"
    if not path.is_file():
        pytest.skip("no committed batch run")
    batch_run = json.loads(path.read_text())
    assert batch_run["settings"]["tokens_identical_across_batches"] is True
    latency = {(r["method"], r["batch"]): r["latency_s"]["median"] for r in batch_run["results"]}
    for method in ("ar", "sd", "sjd"):
        assert latency[(method, 8)] < latency[(method, 1)], method
    assert latency[("sjd-pac", 8)] < 1.25 * latency[("sjd-pac", 1)]  # no worse than a straggling batch


@pytest.mark.skipif(not (RESULTS / "demo-t2i.json").is_file(), reason="no committed t2i bench results")
def test_t2i_demo_run_scores_prompt_following_for_every_method_and_ar_passes_the_bar():
    """`specrt bench --demo t2i` on a named device, every method with prompt following
    beside the Fréchet distance, and AR samples showing the words of their prompts at >= 80% of
    the rate the evaluator reads them on real held-out digits (all words together, and each
    word: the digit and every attribute)."""
    run = json.loads((RESULTS / "demo-t2i.json").read_text())
    assert "EPYC" in run["device"] and run["settings"]["prompts"]
    assert {r["method"] for r in run["results"]} == set(DEFAULT_METHODS)
    real = run["settings"]["fd_noise_floor"]["real_prompt_following"]
    for result in run["results"]:
        following = result["quality"]["prompt_following"]
        assert set(following) == set(real) == {"digit", "thickness", "slant", "width", "words", "all"}
        assert result["quality"]["frechet_distance"] is not None
    ar = by_label(run)["ar"]["quality"]["prompt_following"]
    for key in ("words", "digit", "thickness", "slant", "width"):  # "all" (every word at once) falls short
        assert ar[key] >= 0.8 * real[key], key
