"""The C API end to end: configure and build the library and the example host program with
CMake, install the CMake package, build the example against it with find_package(specrt),
run it on the demo bundle and compare its pixels with the Python API's, byte for byte; then
the error cases, with their codes and messages.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specrt.runtime.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[2]
CAPI = REPO / "runtime" / "capi"

# specrt_status codes (runtime/include/specrt.h)
INVALID_ARGUMENT, NOT_FOUND, BUFFER_TOO_SMALL = 1, 2, 3

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                                reason="needs cmake and a C++ compiler")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """Build + install the library, then build the example as a separate find_package consumer."""
    import pybind11

    work = tmp_path_factory.mktemp("capi")
    prefix = work / "prefix"
    jobs = ["-j", "2"]
    _run(["cmake", "-S", str(CAPI), "-B", str(work / "lib"), "-DCMAKE_BUILD_TYPE=Release",
          "-DSPECRT_BUILD_EXAMPLES=OFF", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
          f"-DPython3_EXECUTABLE={sys.executable}"])
    _run(["cmake", "--build", str(work / "lib"), *jobs])
    _run(["cmake", "--install", str(work / "lib"), "--prefix", str(prefix)])
    assert (prefix / "include" / "specrt.h").is_file()
    assert list(prefix.glob("lib*/cmake/specrt/specrtConfig.cmake"))
    _run(["cmake", "-S", str(CAPI / "examples"), "-B", str(work / "example"), "-DCMAKE_BUILD_TYPE=Release",
          f"-DCMAKE_PREFIX_PATH={prefix}"])
    _run(["cmake", "--build", str(work / "example"), *jobs])
    binary = work / "example" / "specrt_generate"
    assert binary.is_file()
    return binary


def _read_ppm(path: Path) -> tuple[int, int, bytes]:
    data = path.read_bytes()
    magic, dims, maxval, pixels = data.split(b"\n", 3)
    assert magic == b"P6" and maxval == b"255"
    width, height = map(int, dims.split())
    return width, height, pixels


def _generate(example: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    return subprocess.run([str(example), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("method, params", [("ar", "{}"), ("sd", '{"draft_len": 3}')])
def test_example_matches_python_api_byte_for_byte(example, demo_bundle, tmp_path, method, params):
    out = tmp_path / "out.ppm"
    done = _generate(example, str(demo_bundle), str(out), "--class", "1", "--class", "7",
                     "--method", method, "--params", params, "--seed", "5")
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout
    width, height, pixels = _read_ppm(out)

    import json
    result = Pipeline.from_bundle(demo_bundle).generate([1, 7], method=method, seed=5, **json.loads(params))
    expected = np.ascontiguousarray(result.images)  # [2, H, W, 3]
    assert (height, width) == (2 * expected.shape[1], expected.shape[2])
    assert pixels == expected.tobytes()


@pytest.mark.parametrize("args, code, message", [
    (["--method", "no-such-method"], INVALID_ARGUMENT, "no-such-method"),
    (["--params", "{not json"], INVALID_ARGUMENT, "not valid JSON"),
    (["--params", "[1, 2]"], INVALID_ARGUMENT, "JSON object"),
    (["--buffer-bytes", "10"], BUFFER_TOO_SMALL, "10 bytes"),
    (["--class", "99999"], INVALID_ARGUMENT, "out of range"),
    (["--class", "-1"], INVALID_ARGUMENT, "out of range"),
    # every value through specrt.validation: JSON numbers that are not meaningful are refused
    (["--method", "sd", "--params", '{"draft_len": 2.5}'], INVALID_ARGUMENT, "sd draft_len (L) must be an integer"),
    (["--params", '{"temperature": NaN}'], INVALID_ARGUMENT, "temperature must be a finite number"),
    (["--params", '{"top_p": 0}'], INVALID_ARGUMENT, "top_p must be a finite number in (0, 1]"),
    (["--method", "sjd", "--params", '{"adaptive_continuation": 1}'], INVALID_ARGUMENT, "must be true or false"),
])
def test_errors_cross_as_codes_and_messages(example, demo_bundle, tmp_path, args, code, message):
    done = _generate(example, str(demo_bundle), str(tmp_path / "x.ppm"), *args)
    assert done.returncode == code, (done.returncode, done.stderr)
    line = done.stderr.strip()
    assert line.startswith(f"specrt error {code}: ") and message in line
    assert "\n" not in line and "Traceback" not in line
    assert not (tmp_path / "x.ppm").exists()


def test_missing_bundle_is_not_found(example, tmp_path):
    done = _generate(example, str(tmp_path / "nowhere"), str(tmp_path / "x.ppm"))
    assert done.returncode == NOT_FOUND
    assert "no specrt bundle" in done.stderr and "Traceback" not in done.stderr


def test_many_threads_on_one_pipeline_get_their_solo_results(example, demo_bundle, tmp_path):
    """tests/runtime/capi_threads.c: six threads generate at once on one pipeline (one with a bad
    parameter); each result must equal its solo run and the bad one fail alone, with its own
    message. Compiled against the library the `example` fixture installed (one small C file)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    prefix = example.parent.parent / "prefix"
    libdir = next(prefix.glob("lib*/libspecrt.so*")).parent
    binary = tmp_path / "capi_threads"
    _run([compiler, "-O1", str(Path(__file__).with_name("capi_threads.c")), f"-I{prefix / 'include'}", f"-L{libdir}",
          "-lspecrt", "-lpthread", f"-Wl,-rpath,{libdir}", "-o", str(binary)])
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([str(binary), str(demo_bundle)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "ok: 6 threads" in done.stdout


def test_prompts_cross_the_c_api_to_a_t2i_bundle(example, tmp_path):
    """specrt_generate_prompts: UTF-8 prompts through the bundle's own text encoder graph."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parents[1] / "export"))
    from tiny_t2i import t2i_bundle

    manifest, _ = t2i_bundle()
    prompts = ["a thick seven", "The small slanted two"]
    out = tmp_path / "t2i.ppm"
    done = _generate(example, str(manifest.root), str(out), "--prompt", prompts[0], "--prompt", prompts[1],
                     "--method", "sd", "--seed", "3")
    assert done.returncode == 0, done.stderr
    _, _, pixels = _read_ppm(out)
    expected = Pipeline.from_bundle(manifest.root).generate(prompts=prompts, method="sd", seed=3).images
    assert pixels == np.ascontiguousarray(expected).tobytes()
    done = _generate(example, str(manifest.root), str(tmp_path / "x.ppm"), "--class", "1")
    assert done.returncode == INVALID_ARGUMENT and "text-to-image" in done.stderr
