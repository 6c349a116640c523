"""The --profile-arch cost model: window costs from runtime defaults, predicted speed-ups, output."""
from __future__ import annotations

import pytest
from PIL import Image

from specrt.bench.cost_model import StepLatency, parse_windows, prediction_table, predicted_speedup, \
    run_predicted_speedup, window_cost, write_profile_plot
from specrt.errors import SpecrtError

FLAT = StepLatency("test", "cpu", [1, 8, 64], [0.010, 0.010, 0.010], draft_s=0.001)
LINEAR = StepLatency("test", "cpu", [1, 8, 64], [0.010, 0.080, 0.640], draft_s=0.001)


def test_window_cost_uses_the_runtime_defaults():
    assert window_cost("ar", {}) == (1, 0)
    assert window_cost("sd", {}) == (5, 4)  # draft_len 4: target sees pending + 4 drafts
    assert window_cost("cool-sd", {"relaxation_budget": 3, "draft_len": 6}) == (7, 6)
    assert window_cost("sd", {"tree": "static"}) == (26, 5)  # mc_sim_7b_63: 25 drafts, one pass per depth
    assert window_cost("lantern", {"tree": "dynamic", "total_tokens": 15, "depth": 4}) == (16, 4)
    assert window_cost("sjd", {}) == (17, 0)  # L = 16 drafts + the pending token
    assert window_cost("sjd-pac", {}) == (65, 0)
    with pytest.raises(SpecrtError):
        window_cost("medusa", {})


def test_predicted_speedup_on_flat_and_linear_step_costs():
    # flat t(W): the speed-up is the accepted length, less the draft's share
    assert predicted_speedup(FLAT, "ar", {}, 1.0) == pytest.approx(1.0)
    assert predicted_speedup(FLAT, "sjd-pac", {}, 6.0) == pytest.approx(6.0)
    assert predicted_speedup(FLAT, "sd", {}, 3.0) == pytest.approx(3.0 * 0.010 / (0.010 + 4 * 0.001))
    # compute-bound t(W) ∝ W: a window of 64 needs an accepted length above 64 to break even
    assert predicted_speedup(LINEAR, "sjd-pac", {}, 6.0) == pytest.approx(6.0 / 64)
    assert LINEAR.target(4) == pytest.approx(0.010 + 3 / 7 * 0.070)  # interpolated between measured windows


def test_prediction_table_and_plot(tmp_path):
    measured = [{"method": "ar", "params": {}, "label": "ar", "mean_accepted_length": 1.0, "speedup_vs_ar": 1.0},
                {"method": "sjd-pac", "params": {}, "label": "sjd-pac", "mean_accepted_length": 6.0,
                 "speedup_vs_ar": None}]
    text, predictions = prediction_table(FLAT, measured)
    assert "sjd-pac" in text and "6.00x" in text
    assert [p["predicted_speedup"] for p in predictions] == pytest.approx([1.0, 6.0])
    write_profile_plot(str(tmp_path / "p.png"), FLAT, predictions, "test")
    with Image.open(tmp_path / "p.png") as image:
        assert image.format == "PNG"


def test_batches_use_the_batch_run_and_pay_for_stragglers():
    """At 8 images per step the prediction takes the `--batch 8` results: the same accepted length,
    but a batch that ran 1.5 steps per image round (its slowest images) costs 1.5 times the steps."""
    at8 = StepLatency("test", "cuda", [1, 8, 64], [0.020, 0.020, 0.020], draft_s=0.001, images=8, tokens=256)
    measured = [{"method": "ar", "params": {}, "label": "ar", "mean_accepted_length": 1.0, "batch": 1},
                {"method": "sjd", "params": {}, "label": "sjd", "mean_accepted_length": 3.0, "batch": 1},
                {"method": "ar", "params": {}, "label": "ar batch=8", "mean_accepted_length": 1.0, "batch": 8,
                 "target_forwards_per_image": 256.0, "target_calls_per_image": 32.0},
                {"method": "sjd", "params": {}, "label": "sjd batch=8", "mean_accepted_length": 3.0, "batch": 8,
                 "target_forwards_per_image": 80.0, "target_calls_per_image": 15.0}]
    _, predictions = prediction_table(at8, measured)
    assert [p["label"] for p in predictions] == ["ar batch=8", "sjd batch=8"]
    assert [p["straggle"] for p in predictions] == pytest.approx([1.0, 1.5])
    assert predictions[1]["predicted_speedup"] == pytest.approx(3.0 / 1.5)
    assert predictions[0]["predicted_images_per_s"] == pytest.approx(8 / (256 * 0.020))
    assert predictions[1]["predicted_images_per_s"] == pytest.approx(8 * 3.0 / (256 * 1.5 * 0.020))
    _, at1 = prediction_table(FLAT, measured)  # batch 1: the batch-1 results, no straggle
    assert [p["label"] for p in at1] == ["ar", "sjd"] and at1[1]["straggle"] == 1.0


@pytest.mark.parametrize("images, lag", [(1, 1.0), (8, 1.5)], ids=["batch1", "batch8-straggling"])
def test_run_prediction_is_the_cost_model_on_the_run_own_step_costs(images, lag):
    """A bench run whose graphs cost exactly what a t(W) profile says (sd: W = 5, 4 draft calls per
    step) gets, from its breakdown alone, the speed-up predicted_speedup gives on that profile."""
    tokens, tau = 64, 2.5
    latency = StepLatency("run", "cpu", [1, 5], [0.010, 0.015], draft_s=0.002, images=images, tokens=tokens)
    steps = tokens / tau * lag / images  # graph steps an image pays for: its forwards, straggle, shared by the batch
    setting = {"target_forward": steps * 0.015, "draft_forward": steps * 4 * 0.002, "vq_decode": 0.0}
    ar = {"target_forward": tokens / images * 0.010, "draft_forward": 0.0, "vq_decode": 0.0}
    assert run_predicted_speedup(setting, ar) == pytest.approx(predicted_speedup(latency, "sd", {}, tau, lag))
    assert run_predicted_speedup(ar, ar) == 1.0


def test_run_prediction_adds_the_vq_decode_to_both_sides():
    ar = {"target_forward": 0.090, "draft_forward": 0.0, "verify_sample": 0.0, "cache": 0.012, "vq_decode": 0.010}
    setting = {"target_forward": 0.040, "draft_forward": 0.010, "verify_sample": 0.004, "cache": 0.020,
               "vq_decode": 0.010}
    assert run_predicted_speedup(setting, ar) == pytest.approx(0.100 / 0.060)  # host parts (verify, cache) are free
    assert run_predicted_speedup({}, ar) is None and run_predicted_speedup(setting, {}) is None


def test_bytes_per_step_counts_weights_but_embeddings_and_the_whole_kv_buffer():
    torch = pytest.importorskip("torch")
    from specrt.bench.cost_model import bytes_per_step, memory_bandwidth
    from specrt.models.llamagen_gpt import GPT, GPTConfig

    model = GPT(GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=64, num_classes=3, grid_size=2))
    kv = torch.zeros(2, 2, 2, 2, 9, 16)
    gathered = model.tok_embeddings.weight.numel() + model.cls_embedding.embedding_table.weight.numel()
    every = sum(p.numel() for p in model.parameters())
    assert bytes_per_step(model, kv) == 4 * (every - gathered) + 4 * kv.numel()
    assert bytes_per_step(model.to(torch.bfloat16), kv.to(torch.bfloat16)) == 2 * (every - gathered) + 2 * kv.numel()
    assert memory_bandwidth("cpu") is None  # no simple floor on a CPU


def test_parse_windows():
    assert parse_windows("8,1, 4,4") == (1, 4, 8)
    for bad in ("", "a,b", "0,2"):
        with pytest.raises(SpecrtError, match="--windows"):
            parse_windows(bad)
    with pytest.raises(SpecrtError, match="--profile-images '0'"):
        parse_windows("0", "--profile-images")


def test_onnx_step_profile_times_fp32_int8_and_int4_of_the_exported_graph():
    """The --profile-arch onnxruntime curves on a small GPT: every precision timed at every W,
    int8 and int4 reading far fewer weight bytes (embedding tables, read by Gather, not counted)."""
    from specrt.bench.onnx_profile import onnx_table, time_onnx_steps
    from specrt.models.llamagen_gpt import GPTConfig

    config = GPTConfig(dim=64, n_layer=2, n_head=2, vocab_size=256, num_classes=4, grid_size=4, multiple_of=32)
    curves = time_onnx_steps(config, "tiny", windows=(1, 3), repeats=1, threads=1)
    assert set(curves) == {"fp32", "int8", "int4"}
    (fp32, fp32_bytes), (int4, int4_bytes) = curves["fp32"], curves["int4"]
    assert fp32.windows == int4.windows == [1, 3] and all(t > 0 for t in fp32.target_s + int4.target_s)
    linear = 2 * (64 * 3 * 64 + 64 * 64 + 3 * 64 * 192) + 64 * 256  # wqkv, wo, w1/w2/w3 per layer, output head
    assert fp32_bytes >= 4 * linear and int4_bytes < fp32_bytes / 4
    int8_bytes = curves["int8"][1]
    assert int4_bytes < int8_bytes < fp32_bytes / 2 and all(t > 0 for t in curves["int8"][0].target_s)
    table = onnx_table(curves)
    assert "t / t_fp32" in table and "tiny int4 (ort)" in table
