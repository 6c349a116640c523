"""`python -m specrt.bench.step_kernels` times CUDA kernels: without CUDA, or with rows its kernels do
not take, it says so in one line and exits 2 (the timings themselves run on a GPU: bench/device-run.sh
kernels)."""
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specrt.bench.step_kernels", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_is_one_line_and_exit_2():
    done = _run("--arch", "GPT-B")
    assert done.returncode == 2
    assert done.stderr.strip() == ("specrt.bench.step_kernels: error: specrt.bench.step_kernels times CUDA kernels; "
                                   "no CUDA device here")


def test_an_unknown_arch_is_refused_by_the_option():
    done = _run("--arch", "GPT-Z")
    assert done.returncode == 2 and "GPT-Z" in done.stderr and "Traceback" not in done.stderr
