"""The C API as `cmake --install` lays it out runs: the installed example program finds
libspecrt in its prefix (RUNPATH $ORIGIN/../lib) with no LD_LIBRARY_PATH. The C/C++ guide's
(docs/guides/c-cpp.md) two commands, library and example in one project, installed into a temporary prefix."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CAPI = Path(__file__).resolve().parents[2] / "runtime" / "capi"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None
                                 or not sys.platform.startswith("linux"),
                                 reason="needs cmake, a C++ compiler and Linux (ELF RUNPATH)")]


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_installed_example_runs_without_library_path(demo_bundle, tmp_path):
    import pybind11

    build, prefix = tmp_path / "build", tmp_path / "prefix"
    _run(["cmake", "-S", str(CAPI), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
          f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", f"-DPython3_EXECUTABLE={sys.executable}"])
    _run(["cmake", "--build", str(build), "-j", "2"])
    _run(["cmake", "--install", str(build), "--prefix", str(prefix)])
    program = prefix / "bin" / "specrt_generate"
    assert program.is_file() and list(prefix.glob("lib*/libspecrt.so.0"))
    shutil.rmtree(build)  # nothing of the build tree may be needed any more

    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "three.ppm"
    done = subprocess.run([str(program), str(demo_bundle), str(out), "--class", "3"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and out.read_bytes().startswith(b"P6\n")
