"""Serving a continuous (MAR-style) bundle: the same handler, wire format and client as a
LlamaGen bundle, with the family (runtime/families) saying what changes — FP32 tokens
[seq_len, C] instead of INT64 codes, images only where the bundle has a decoder, methods ar and
cspd. Per-row errors as for any bundle. `specrt serve` runs as a subprocess on 127.0.0.1; every
wait is bounded (reader thread with a deadline, client timeouts, communicate timeouts).
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from serving_fixtures import continuous_demo_bundle, free_ports, served, tiny_continuous_bundle  # noqa: E402

from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.family_registry import open_bundle  # noqa: E402
from specrt.runtime.serving.handler import RequestHandler  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_continuous_bundle(tmp_path_factory.mktemp("continuous") / "bundle")


def rows(**columns) -> dict[str, np.ndarray]:
    """A request: each keyword a column of per-row values ([rows, 1] arrays, strings as bytes)."""
    out = {}
    for name, values in columns.items():
        if isinstance(values[0], str):
            out[name] = np.array([[v.encode()] for v in values], dtype=object)
        else:
            out[name] = np.array([[v] for v in values], dtype=np.uint64 if name == "seed" else None)
    return out


def test_the_handler_serves_float_tokens_and_fails_bad_rows_alone(tiny):
    pipe = open_bundle(tiny)
    handler = RequestHandler(pipe)
    assert handler.family.name == "continuous" and handler.token_shape == (4, 3)
    assert [(t.name, t.dtype, t.shape) for t in handler.outputs if t.name == "tokens"] == [("tokens", "FP32", (-1, 3))]
    first = rows(class_id=[0, 7, 2, 1, 1], method=["cspd", "cspd", "ar", "sjd", "ar"], seed=[4, 5, 6, 7, 8],
                 params=['{"draft_len": 2}', '{"draft_len": 2}', "", "", '{"temperature": 0}'])
    second = rows(class_id=[1], method=["cspd"], seed=[9], params=['{"draft_len": 2}'])
    out = handler([first, second])
    got = [bytes(e).decode() for e in out[0]["error"][:, 0]]
    assert got[0] == got[2] == "" and "class id 7 out of range" in got[1]
    assert "unknown method 'sjd' for a continuous model" in got[3] and "temperature" in got[4]
    tokens = out[0]["tokens"]
    assert tokens.dtype == np.float32 and tokens.shape == (5, 4, 3)
    assert np.isnan(tokens[[1, 3, 4]]).all()
    for outputs, row, (class_id, method, seed, params) in [
            (out[0], 0, (0, "cspd", 4, {"draft_len": 2})), (out[0], 2, (2, "ar", 6, {})),
            (out[1], 0, (1, "cspd", 9, {"draft_len": 2}))]:
        expected = pipe.generate([class_id], method=method, seed=seed, decode=False, **params)
        np.testing.assert_allclose(outputs["tokens"][row], expected.tokens[0], rtol=0, atol=1e-5)
        assert bytes(outputs["image"][row, 0]) == b""  # no decoder in this bundle: tokens only
        stats = json.loads(outputs["stats"][row, 0])
        assert stats["method"] == method and stats["target_passes"] >= 1 and stats["accepted_length"] >= 1.0
    # the cspd rows of both requests ran in one generate call
    assert json.loads(out[1]["stats"][0, 0])["images_in_call"] == 2


def forwards_by_accepted(metrics_port: int, until, timeout_s: float = 15.0) -> float:
    """The sum of specrt_forwards_by_accepted_total over its labels on the metrics port, read until
    `until(sum)` holds or `timeout_s` passes (the model copies its counters there once a second)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        total = sum(float(line.split()[-1]) for line in text.splitlines()
                    if line.startswith("specrt_forwards_by_accepted_total{"))
        if until(total) or time.monotonic() > deadline:
            return total
        time.sleep(0.2)


def test_specrt_serve_serves_the_continuous_demo_bundle_to_the_client(tmp_path):
    """`specrt serve BUNDLE` on the continuous demo bundle: one cspd request through the Client
    gets the PNG and float tokens a single generate gives; a bad class id is one line; the requests
    ran in flight (the scheduler's slots), as the metrics port shows."""
    pytest.importorskip("pytriton.triton", reason="nvidia-pytriton is not installed (pip install 'specrt[serve]' in "
                                                  "a venv made with /usr/bin/python3.11; docs/guides/serve-triton.md)")
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install 'specrt[serve]')")
    from PIL import Image

    from specrt.runtime.serving.client import Client

    bundle = continuous_demo_bundle(tmp_path / "mar")
    ports = free_ports(3)
    with served(bundle, tmp_path, ports=ports) as (http, grpc):
        reference = open_bundle(bundle)
        expected = reference.generate([3], method="cspd", seed=1, draft_len=2)
        with Client(f"127.0.0.1:{grpc}", protocol="grpc", timeout_s=60.0) as client:
            image = client.generate(class_id=3, method="cspd", seed=1, draft_len=2)
            assert image.tokens.dtype == np.float32 and image.tokens.shape == (64, 4)
            np.testing.assert_allclose(image.tokens, expected.tokens[0], rtol=0, atol=1e-5)
            pixels = np.asarray(Image.open(io.BytesIO(image.png)).convert("RGB"))
            assert pixels.shape == (32, 32, 3)
            assert np.abs(pixels.astype(int) - expected.images[0]).max() <= 1
            assert image.stats["method"] == "cspd" and image.stats["target_passes"] < 64
            with pytest.raises(SpecrtError, match="class id 12 out of range") as caught:
                client.generate(class_id=12)
            assert "\n" not in str(caught.value)
        with Client(f"127.0.0.1:{http}", protocol="http", timeout_s=60.0) as client:
            tokens_only = client.generate(class_id=5, seed=2, tokens_only=True)
            assert tokens_only.png == b"" and tokens_only.tokens.shape == (64, 4)
            np.testing.assert_allclose(tokens_only.tokens, reference.generate([5], seed=2, decode=False).tokens[0],
                                       rtol=0, atol=1e-5)
        # in flight (the default): the scheduler's rounds count every target forward by the tokens it
        # decided, 64 for the ar image and the cspd image's own; whole calls of a continuous model count none
        forwards = 64 + image.stats["target_forwards"]
        assert forwards_by_accepted(ports[2], until=lambda total: total == forwards) == forwards
