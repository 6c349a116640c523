"""The C API's build as the C/C++ guide gives it: `pip install -e '.[capi]'` brings pybind11, and
CMake finds it through the Python it is given (no -Dpybind11_DIR), or stops saying what to install."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAPI = REPO / "runtime" / "capi"
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                                 reason="needs cmake and a C++ compiler")


def _configure(build: Path, python: str) -> subprocess.CompletedProcess:
    return subprocess.run(["cmake", "-S", str(CAPI), "-B", str(build), "-DSPECRT_BUILD_EXAMPLES=OFF",
                           f"-DPython3_EXECUTABLE={python}"], capture_output=True, text=True, timeout=120)


def test_the_capi_extra_installs_pybind11():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("pybind11") for r in extras["capi"])


@needs_cmake
def test_cmake_finds_pybind11_through_the_given_python(tmp_path):
    pytest.importorskip("pybind11")
    done = _configure(tmp_path / "build", sys.executable)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@needs_cmake
def test_cmake_without_pybind11_names_the_extra(tmp_path):
    # a Python with the embedding headers but without pybind11: this one, with pybind11 hidden
    shim = tmp_path / "python"
    shim.write_text(f"#!/bin/sh\nif [ \"$1\" = -m ] && [ \"$2\" = pybind11 ]; then exit 1; fi\nexec {sys.executable} \"$@\"\n")
    shim.chmod(0o755)
    done = _configure(tmp_path / "build", str(shim))
    assert done.returncode != 0 and "pip install 'specrt[capi]'" in " ".join(done.stderr.split())
