"""`specrt serve` says "ready" only when a request would succeed, keeps Triton's own log off the
terminal, and a request that cannot be answered (no server yet, a wrong model name) is one
SpecrtError line through the Client, not a tritonclient exception. Server on 127.0.0.1; every
wait bounded (reader thread with a deadline, client timeouts, communicate timeouts).
"""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("pytriton.triton", reason="nvidia-pytriton is not installed (pip install 'specrt[serve]' in a "
                                              "venv made with /usr/bin/python3.11; docs/guides/serve-triton.md)")
pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install 'specrt[serve]')")

from serving_fixtures import free_ports, wait_until_ready  # noqa: E402

from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.serving.client import Client  # noqa: E402

START_S = 180.0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_with_no_server_is_one_line(protocol):
    [port] = free_ports(1)
    with pytest.raises(SpecrtError, match=f"no Triton server answers at {protocol} 127.0.0.1:{port} .*specrt serve"):
        with Client(f"127.0.0.1:{port}", protocol=protocol, timeout_s=5.0) as client:
            client.generate(class_id=1)


def test_serve_is_ready_when_it_says_so(tmp_path):
    http, grpc, metrics = free_ports(3)
    log = tmp_path / "triton.log"
    proc = subprocess.Popen([sys.executable, "-m", "specrt.cli", "serve", "--http-port", str(http), "--grpc-port",
                             str(grpc), "--metrics-port", str(metrics), "--triton-log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = wait_until_ready(proc, START_S)
        # the very first request after "ready" is served, on both protocols
        for protocol, port in (("http", http), ("grpc", grpc)):
            with Client(f"127.0.0.1:{port}", protocol=protocol, timeout_s=60.0) as client:
                image = client.generate(class_id=3, seed=1)
                assert image.png.startswith(b"\x89PNG") and image.tokens.size == 64
                with pytest.raises(SpecrtError, match="serves no model 'nope'"):
                    Client(f"127.0.0.1:{port}", protocol=protocol, model="nope", timeout_s=10.0).generate(class_id=3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143  # SIGTERM: the server stopped, the CLI says how it ended
    # Triton's own log went to the file, not the terminal
    assert log.is_file() and len(log.read_text().splitlines()) > 10
    triton_lines = [line for line in out.splitlines() + seen if line[:1] in "IWE" and line[1:5].isdigit()]
    assert triton_lines == [], triton_lines
    assert [line for line in seen if line.startswith("specrt serve:")][-1].startswith("specrt serve: ready: model "
                                                                                        "'specrt' on http://127.0.0.1:")


def test_a_model_that_fails_to_load_says_so_at_once(tmp_path):
    """The in-flight model opens its pipeline as Triton starts; when that fails, the start ends with
    the model's own error in one line within seconds, not after PyTriton's 120 s wait for a server
    that never becomes ready."""
    import time

    from specrt.runtime.serving.pytriton_server import ServeConfig, running_inflight

    http, grpc, metrics = free_ports(3)
    config = ServeConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, log_file=str(tmp_path / "triton.log"))
    start = time.monotonic()
    with pytest.raises(SpecrtError, match="model 'specrt' failed to load .*SpecrtError: bundle .*no-bundle does not "
                                          "exist") as caught:
        with running_inflight({"bundle": str(tmp_path / "no-bundle")}, config):
            pass
    assert time.monotonic() - start < 60 and "\n" not in str(caught.value)
