"""`specrt bench` end to end on a tiny random-weight demo: table, JSON schema, plot, errors.

One run (PyTorch backend, 3 images per setting, every method plus a Cool-SD sweep) is shared
by the schema tests; it takes a few seconds. The onnxruntime path with its cached export is
tested once, the export itself a copy of the session's demo bundle.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from specrt.bench.settings import DEFAULT_METHODS
from specrt.cli import main
from tiny_demo import GRID, run_cli

TOKENS = GRID * GRID
IMAGES = 3
RESULT_KEYS = {"method", "params", "mean_accepted_length", "target_forwards_per_image", "latency_s", "speedup_vs_ar",
               "breakdown_s", "quality"}
BREAKDOWN = {"target_forward", "draft_forward", "verify_sample", "cache", "vq_decode"}




@pytest.fixture(scope="module")
def tiny_run(demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--backend", "torch", "--demo-weights", str(demo_dir), "--images", str(IMAGES),
            "--sweep", "cool-sd:delta=1.5,3", "--methods", ",".join(DEFAULT_METHODS), "--no-progress",
            "--json", str(out / "r.json"), "--plot", str(out / "r.png"), "--markdown", str(out / "r.md")]
    try:
        main(argv)
    except SystemExit as exc:
        assert not exc.code, f"specrt bench exited {exc.code}"
    return out, json.loads((out / "r.json").read_text())


def test_json_has_every_field_for_every_setting(tiny_run):
    _, payload = tiny_run
    assert {"device", "backend", "bundle", "settings", "results"} <= set(payload)
    assert payload["backend"] == "torch" and payload["device"]
    labels = [r["label"] for r in payload["results"]]
    assert labels == ["ar", "sd", "cool-sd(delta=1.5)", "cool-sd(delta=3)", "lantern", "sjd", "sjd-pac"]
    for result in payload["results"]:
        assert RESULT_KEYS <= set(result), result["label"]
        assert set(result["breakdown_s"]) == BREAKDOWN
        assert all(v >= 0 for v in result["breakdown_s"].values())
        assert result["latency_s"]["p90"] >= result["latency_s"]["median"] > 0
        assert {"class_accuracy", "frechet_distance"} <= set(result["quality"])
        assert 0.0 <= result["quality"]["class_accuracy"] <= 1.0
        assert result["images"] == IMAGES
        # every image has TOKENS tokens: accepted length x target forwards must give them back
        assert result["mean_accepted_length"] * result["target_forwards_per_image"] == pytest.approx(TOKENS)


def test_numbers_are_consistent_with_the_methods(tiny_run):
    _, payload = tiny_run
    by_label = {r["label"]: r for r in payload["results"]}
    ar = by_label["ar"]
    assert ar["speedup_vs_ar"] == 1.0 and ar["mean_accepted_length"] == 1.0
    assert ar["target_forwards_per_image"] == TOKENS and ar["breakdown_s"]["draft_forward"] == 0.0
    for label in ("sd", "cool-sd(delta=1.5)", "lantern"):
        assert by_label[label]["draft_forwards_per_image"] > 0
    graphs = lambda r: sum(r["breakdown_s"][k] for k in ("target_forward", "draft_forward", "vq_decode"))  # noqa: E731
    assert ar["predicted_speedup_vs_ar"] == 1.0 and ar["measured_over_predicted"] == 1.0
    for label, result in by_label.items():
        expected = ar["latency_s"]["median"] / result["latency_s"]["median"]
        assert result["speedup_vs_ar"] == pytest.approx(expected)
        # the cost model on the run's own graph timings, beside the measured speed-up (means) for every setting
        assert result["predicted_speedup_vs_ar"] == pytest.approx(graphs(ar) / graphs(result))
        assert result["mean_speedup_vs_ar"] == pytest.approx(ar["latency_s"]["mean"] / result["latency_s"]["mean"])
        assert result["measured_over_predicted"] == pytest.approx(
            result["mean_speedup_vs_ar"] / result["predicted_speedup_vs_ar"])
    # Theorem 2: lossless methods have zero TV; Cool-SD gets positive estimates from the runtime
    assert by_label["sjd-pac"]["theory"]["tv_bound"] == 0.0
    cool = by_label["cool-sd(delta=3)"]["theory"]
    assert cool["tv_bound"] > 0 and cool["expected_accepted_length"] >= 1.0
    floor = payload["settings"]["fd_noise_floor"]
    assert floor["images"] == IMAGES and np.isfinite(floor["frechet_distance"])


def test_plot_is_a_png_and_markdown_has_every_row(tiny_run):
    out, payload = tiny_run
    markdown = (out / "r.md").read_text(encoding="utf-8").splitlines()
    rows = [line for line in markdown if line.startswith("| ") and not line.startswith("| setting")]
    assert [row.split("|")[1].strip() for row in rows] == [r["label"] for r in payload["results"]]
    with Image.open(out / "r.png") as image:
        assert image.format == "PNG" and image.width > 600 and image.height > 300


def test_interleaving_does_not_change_images(demo_dir):
    """Same seed, same image: a setting's images do not depend on which settings ran around it."""
    from specrt.bench.measure import run_settings
    from specrt.bench.models import open_models
    from specrt.bench.settings import build_settings

    models = open_models(backend="torch", demo_weights=demo_dir, judge=False)
    alone, _ = run_settings(models.pipeline, build_settings("sd"), images=2, seed=5)
    mixed, _ = run_settings(models.pipeline, build_settings("sd,sjd-pac,cool-sd"), images=2, seed=5)
    for a, b in zip(alone[1].images, mixed[1].images):
        assert np.array_equal(a, b)
    # nor on the batch size they were decoded at
    batched, _ = run_settings(models.pipeline, build_settings("sd"), images=2, seed=5, batches=(2,))
    assert batched[1].batch == 2 and len(batched[1].latencies) == 1  # one call of two images
    for a, b in zip(alone[1].images, batched[1].images):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("demo, matmuls", [("c2i", None), ("c2i", "fused"), ("chameleon", "fused")])
def test_the_torch_step_choices_reach_the_demos_runners_and_are_named(demo, matmuls):
    """`specrt bench --backend torch --step-matmuls` (the device round's stage on a GPU compares
    them): the demo's runners fuse their products where asked (a CPU keeps them apart by default),
    and the run's source names the choices."""
    from specrt.bench.models import open_models

    models = open_models(backend="torch", judge=False, demo=demo, step_matmuls=matmuls)
    fused = [name for name, buffer in models.pipeline.target.gpt.named_buffers() if "gate_up" in name]
    assert bool(fused) == (matmuls == "fused")
    assert f"{matmuls or 'separate'} matmuls, sdpa attention" in models.bundle


def test_batch_sizes_in_one_run(demo_dir, tmp_path, capsys):
    """--batch 1,2: every setting at both sizes, the speed-up against ar at the same size, images/s."""
    code, out, _ = run_cli(["bench", "--backend", "torch", "--demo-weights", str(demo_dir), "--images", "2",
                            "--methods", "sjd", "--batch", "1,2", "--no-progress", "--json", str(tmp_path / "b.json")],
                           capsys)
    assert code == 0 and "img/s" in out
    payload = json.loads((tmp_path / "b.json").read_text())
    assert [(r["label"], r["batch"]) for r in payload["results"]] == [("ar", 1), ("sjd", 1), ("ar batch=2", 2),
                                                                         ("sjd batch=2", 2)]
    assert payload["settings"]["tokens_identical_across_batches"] is True
    by_label = {r["label"]: r for r in payload["results"]}
    for label in ("sjd", "sjd batch=2"):
        ar = by_label["ar" if label == "sjd" else "ar batch=2"]
        assert by_label[label]["speedup_vs_ar"] == pytest.approx(ar["latency_s"]["median"] / by_label[label]["latency_s"]["median"])
    assert by_label["sjd batch=2"]["images_per_s"] > 0 and by_label["sjd batch=2"]["target_calls_per_image"] > 0


@pytest.mark.parametrize("argv, fragment", [
    (["bench", "--methods", "ar,medusa"], "unknown method(s) medusa"),
    (["bench", "--sweep", "cool-sd:delta"], "is not KEY=V1,V2"),
    (["bench", "--sweep", "sd:delta=2"], "sd has no parameter 'delta'"),
    (["bench", "--profile-arch", "llamagen-c2i-Q"], "unknown --profile-arch"),
    (["bench", "--profile-arch", "llamagen-c2i-B", "--windows", "0,4"], "positive integers"),
    (["bench", "--profile-arch", "llamagen-c2i-B", "--profile-images", "1,0"], "--profile-images '1,0'"),
    (["bench", "--profile-arch", "llamagen-c2i-B", "--profile-dtypes", "fp32,fp64"], "choose from fp32, bf16"),
    (["bench", "--device", "cuda"], "applies to --backend torch"),
    (["bench", "--batch", "1,0"], "--batch must be an integer in [1,"),
    (["bench", "--step-matmuls", "fused"], "apply to --backend torch and --profile-arch, not to --backend ort"),
    (["bench", "--backend", "torch", "--step-matmuls", "skinny"], "times a Triton kernel on a CUDA --device"),
    (["bench", "--backend", "torch", "--step-attention", "triton"], "times a Triton kernel on a CUDA --device"),
    (["bench", "--demo", "mar", "--backend", "torch", "--step-matmuls", "fused"], "this family's bench has no such"),
])
def test_user_errors_exit_2_with_one_line(argv, fragment, capsys):
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith("specrt: error:") and fragment in err
    assert err.count("\n") == 1 and out == ""


def test_bundle_with_torch_backend_is_refused(tmp_path, capsys):
    code, _, err = run_cli(["bench", str(tmp_path), "--backend", "torch"], capsys)
    assert code == 2 and "ort backend" in err


def test_ort_backend_exports_the_demo_once_into_the_cache(demo_dir, demo_bundle, tmp_path, capsys, monkeypatch):
    """The export is the session's demo bundle copied in (the exporter itself is tested in
    tests/export and by the session fixture, which runs this same demo_bundle function): what is
    checked here is the CLI's cache — export on first use, into --cache-dir, then reuse."""
    import shutil

    from specrt.export import bundle as export_bundle

    exports = []

    def copied_export(models, out, options, progress=None, reuse=None):
        assert reuse is None  # only an EAGLE bundle copies graphs from the cached demo's
        exports.append(options)
        shutil.copytree(demo_bundle, out)

    monkeypatch.setattr(export_bundle, "write_bundle", copied_export)
    argv = ["bench", "--demo-weights", str(demo_dir), "--cache-dir", str(tmp_path), "--images", "1",
            "--methods", "sd", "--json", str(tmp_path / "r.json")]
    code, _, err = run_cli(argv, capsys)
    assert code == 0 and "exporting the demo bundle" in err
    assert exports == [export_bundle.ExportOptions()]  # the defaults, which the cache name hashes
    bundles = [p for p in tmp_path.iterdir() if p.name.startswith("demo-")]
    assert len(bundles) == 1 and (bundles[0] / "manifest.json").is_file()
    payload = json.loads((tmp_path / "r.json").read_text())
    assert payload["backend"] == "ort" and [r["method"] for r in payload["results"]] == ["ar", "sd"]
    code, _, err = run_cli(argv, capsys)  # second run: the cached bundle, no export
    assert code == 0 and "exporting" not in err and len(exports) == 1
