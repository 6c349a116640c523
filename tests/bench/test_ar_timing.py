"""`python -m specrt.bench.ar_timing`: plain AR timed end to end on random LlamaGen-layout weights."""
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specrt.bench.ar_timing", *args], capture_output=True, text=True,
                          timeout=300)


def test_times_each_batch_size_after_a_warm_up():
    done = _run("--arch", "GPT-B", "--image-size", "32", "--dtype", "fp32", "--images", "1,2", "--device", "cpu",
                "--repeats", "1", "--no-compile")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert "GPT-B c2i random weights, 32 px, fp32" in lines[0] and "eager step over a static KV cache" in lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["1", "2"]
    for batch, ms_image, ms_token, _ in rows:  # 4 tokens an image: a token's time is the call's over 4
        assert float(ms_token) == pytest.approx(float(ms_image) * int(batch) / 4, rel=0.02, abs=0.02)


@pytest.mark.parametrize("flags,message", [
    (["--images", "100000"], "--images 100000: at most 32 images a call"),
    (["--image-size", "100"], "--image-size 100: a multiple of 16"),
])
def test_sizes_that_would_exhaust_the_machine_are_one_line(flags, message):
    done = _run(*flags, "--device", "cpu")
    assert done.returncode == 2
    assert done.stderr.startswith("specrt.bench.ar_timing: error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1


def test_methods_in_both_loops_get_speedups_and_predictions_against_ar_in_their_loop():
    """`--methods ar,sjd --loop host,round`: a row per batch, method and loop; ar is 1.00x against itself
    in each loop, a method's prediction is a ratio of model-pass time (a round row's from its host
    twin), and meas/pred their quotient."""
    done = _run("--arch", "GPT-B", "--image-size", "32", "--dtype", "fp32", "--images", "2", "--device", "cpu",
                "--repeats", "1", "--no-compile", "--methods", "ar,sjd", "--loop", "host,round")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[1].split()[-7:] == ["method", "loop", "acc.len", "speed-up", "pred.", "meas/pred", "ops/round"]
    rows = {(row[4], row[5]): row for row in (line.split() for line in lines[2:])}
    assert set(rows) == {("ar", "host"), ("ar", "round"), ("sjd", "host"), ("sjd", "round")}
    for loop in ("host", "round"):
        assert rows["ar", loop][7:10] == ["1.00x", "1.00x", "1.00"]
    for loop in ("host", "round"):
        speedup, predicted, ratio = (float(v.rstrip("x")) for v in rows["sjd", loop][7:10])
        # each printed to 0.005: the quotient of the printed pair is off the printed ratio by at most
        # the two roundings carried through the division, plus the ratio's own
        low = predicted - 0.005
        slack = 0.005 / low + (speedup + 0.005) * 0.005 / low ** 2 + 0.005 + 1e-9
        assert speedup > 0 and predicted > 0 and ratio == pytest.approx(speedup / predicted, abs=slack)
    assert rows["sjd", "round"][8] == rows["sjd", "host"][8]  # the round's prediction is its host twin's
    # a round counts its operations (compute ops on a CPU); sjd's (a window pass and verification) more than ar's
    assert rows["sjd", "host"][10] == "-" and int(rows["sjd", "round"][10]) > int(rows["ar", "round"][10]) > 0


def test_a_drafted_method_without_a_draft_is_one_line():
    done = _run("--methods", "sd", "--device", "cpu")
    assert done.returncode == 2 and "--draft-arch" in done.stderr and done.stderr.count("\n") == 1
