"""The C API end to end: configure and build the library and the example host program with
CMake, install the CMake package, build the example against it with find_package(specrt),
run it on the demo bundles (LlamaGen's and the continuous one, and a continuous bundle without
a decoder) and compare its pixels and tokens with the Python API's, byte for byte; then the
error cases, with their codes and messages, and the output object's calls (capi_output.c).
"""
from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def continuous_demo_bundle(tmp_path_factory) -> Path:
    """`specrt export --demo mar`: the continuous demo, with its tokenizer decoder."""
    pytest.importorskip("torch")
    from specrt.cli import main

    out = tmp_path_factory.mktemp("mar") / "mar"
    try:
        main(["export", "--demo", "mar", "--out", str(out)])
    except SystemExit as exc:
        assert not exc.code, f"specrt export --demo mar exited {exc.code}"
    return out


@pytest.fixture(scope="module")
def decoderless_bundle(tmp_path_factory) -> Path:
    """A continuous bundle exported without a decoder: it generates float tokens only."""
    pytest.importorskip("torch")
    from specrt.export.mar.export import export_bundle
    from specrt.models.mar.model import MARConfig, random_mar

    shared = dict(token_dim=3, seq_len=4, n_head=2, diffusion_steps=4, num_classes=3)
    target = random_mar(MARConfig(dim=32, n_layer=2, **shared), seed=0)
    draft = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **shared), seed=1)
    return export_bundle(target, draft, tmp_path_factory.mktemp("nodecoder") / "bundle")


def _expect_example_output(example: Path, bundle: Path, tmp_path: Path, method: str, params: str,
                           route: str) -> None:
    """The example's PPM (and --save-tokens .npy) equal the Python API's images and tokens for
    class ids 1 and 7, seed 5. route "output": specrt_generate_output; "buffer": specrt_generate
    into a caller buffer of exactly the images' size (--buffer-bytes)."""
    result = Pipeline.from_bundle(bundle).generate([1, 7], method=method, seed=5, **json.loads(params))
    expected = np.ascontiguousarray(result.images)  # [2, H, W, 3]
    out, tokens = tmp_path / "out.ppm", tmp_path / "tokens.npy"
    args = ["--buffer-bytes", str(expected.nbytes)] if route == "buffer" else ["--save-tokens", str(tokens)]
    done = _generate(example, str(bundle), str(out), "--class", "1", "--class", "7",
                     "--method", method, "--params", params, "--seed", "5", *args)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 2 image(s)" in done.stdout
    width, height, pixels = _read_ppm(out)
    assert (height, width) == (2 * expected.shape[1], expected.shape[2])
    assert pixels == expected.tobytes()
    if route == "output":
        saved = np.load(tokens)
        assert saved.dtype == result.tokens.dtype and saved.shape == result.tokens.shape
        np.testing.assert_array_equal(saved, result.tokens)


@pytest.mark.parametrize("route", ["output", "buffer"])
@pytest.mark.parametrize("method, params", [("ar", "{}"), ("sd", '{"draft_len": 3}')])
def test_example_matches_python_api_byte_for_byte(example, demo_bundle, tmp_path, method, params, route):
    _expect_example_output(example, demo_bundle, tmp_path, method, params, route)


@pytest.mark.parametrize("route", ["output", "buffer"])
@pytest.mark.parametrize("method, params", [("ar", "{}"), ("cspd", '{"draft_len": 3}')])
def test_example_on_the_continuous_demo_bundle_matches_python_api(example, continuous_demo_bundle, tmp_path,
                                                                  method, params, route):
    """A continuous bundle through the same calls: class ids in, the decoder's images out (and
    its float32 latents with --save-tokens), byte for byte the Python API's."""
    _expect_example_output(example, continuous_demo_bundle, tmp_path, method, params, route)


@pytest.mark.parametrize("bundle_name", ["demo_bundle", "continuous_demo_bundle"])
def test_example_tokens_only_writes_the_familys_tokens(example, request, tmp_path, bundle_name):
    """--tokens-only (decode 0): OUT is the tokens as .npy, int64 from LlamaGen, float32 latents
    from a continuous bundle, equal to the Python API's."""
    bundle = request.getfixturevalue(bundle_name)
    out = tmp_path / "tokens.npy"
    done = _generate(example, str(bundle), str(out), "--class", "3", "--seed", "2", "--tokens-only")
    assert done.returncode == 0, done.stderr
    expected = Pipeline.from_bundle(bundle).generate([3], method="ar", seed=2, decode=False).tokens
    dtype = "float32" if bundle_name == "continuous_demo_bundle" else "int64"
    assert f"wrote {out}: {dtype} tokens [{', '.join(map(str, expected.shape))}]" in done.stdout
    saved = np.load(out)
    assert saved.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(saved, expected)


def test_example_on_a_bundle_without_decoder_writes_float_tokens(example, decoderless_bundle, tmp_path):
    out = tmp_path / "tokens.npy"
    done = _generate(example, str(decoderless_bundle), str(out), "--class", "0", "--class", "2",
                     "--method", "cspd", "--params", '{"draft_len": 2}', "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert "float32 tokens [2, 4, 3] (the bundle has no decoder)" in done.stdout
    expected = Pipeline.from_bundle(decoderless_bundle).generate([0, 2], method="cspd", seed=3, decode=False,
                                                                 draft_len=2).tokens
    saved = np.load(out)
    assert saved.dtype == np.float32 and saved.shape == (2, 4, 3)
    assert saved.tobytes() == np.ascontiguousarray(expected, dtype=np.float32).tobytes()
    # specrt_generate wants pixels: one line naming the call that gives tokens
    done = _generate(example, str(decoderless_bundle), str(tmp_path / "x.ppm"), "--class", "0", "--buffer-bytes", "64")
    assert done.returncode == INVALID_ARGUMENT
    assert "no decoder" in done.stderr and "specrt_generate_output" in done.stderr
    assert not (tmp_path / "x.ppm").exists()


@pytest.mark.parametrize("bundle_name, dtype, decoder", [("demo_bundle", "int64", 1),
                                                          ("continuous_demo_bundle", "float32", 1),
                                                          ("decoderless_bundle", "float32", 0)])
def test_output_object_calls(example, request, tmp_path, bundle_name, dtype, decoder):
    """tests/runtime/capi_output.c against the installed library: the family queries, the token
    dtype and shape, the accessor of each dtype (the other refused), images, statistics, errors."""
    bundle = request.getfixturevalue(bundle_name)
    binary = _compile(example, "capi_output.c", tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    done = subprocess.run([str(binary), str(bundle), dtype, str(decoder)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {dtype} tokens")


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


def _compile(example: Path, source: str, tmp_path: Path) -> Path:
    """One small C file of tests/runtime, built against the library the `example` fixture installed."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler")
    prefix = example.parent.parent / "prefix"
    libdir = next(prefix.glob("lib*/libspecrt.so*")).parent
    binary = tmp_path / Path(source).stem
    _run([compiler, "-O1", str(Path(__file__).with_name(source)), f"-I{prefix / 'include'}", f"-L{libdir}",
          "-lspecrt", "-lpthread", f"-Wl,-rpath,{libdir}", "-o", str(binary)])
    return binary


def test_many_threads_on_one_pipeline_get_their_solo_results(example, demo_bundle, tmp_path):
    """tests/runtime/capi_threads.c: six threads generate at once on one pipeline (one with a bad
    parameter); each result must equal its solo run and the bad one fail alone, with its own
    message. Compiled against the library the `example` fixture installed (one small C file)."""
    binary = _compile(example, "capi_threads.c", tmp_path)
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
