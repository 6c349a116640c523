"""Load test of `specrt serve`: PyTriton on 127.0.0.1, tritonclient over HTTP and gRPC.

8 concurrent clients x 8 requests mixing methods, parameters and seeds. Every response must be
the image a single generate call gives for its condition, method and seed (same tokens, same
PNG pixels), the server must generate each requested image exactly once (none lost, none
duplicated), the dynamic batcher must actually merge requests, bad rows get one-line errors
while the rows batched with them are served, and the server stops cleanly. Every wait is
bounded (client timeouts, future timeouts).
"""
from __future__ import annotations

import io
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pytriton.triton", reason="nvidia-pytriton is not installed (pip install 'specrt[serve]' in a "
                                              "venv made with /usr/bin/python3.11; docs/guides/serve-triton.md)")

from serving_fixtures import REQUEST_KINDS, free_ports, tiny_pipeline  # noqa: E402

from specrt.errors import SpecrtError  # noqa: E402
from specrt.runtime.serving import handler as handler_module  # noqa: E402
from specrt.runtime.serving.client import Client  # noqa: E402
from specrt.runtime.serving.pytriton_server import ServeConfig, running  # noqa: E402

CLIENTS, PER_CLIENT, CLASSES = 8, 8, 5
TIMEOUT_S = 60.0


def stub_processes() -> set[int]:
    """Pids of Triton Python-backend stubs (one per model instance) now running on this machine."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"triton_python_backend_stub" in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
        except OSError:  # the process ended while we looked
            pass
    return pids


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def request_of(client: int, index: int) -> dict:
    # clients 2k and 2k+1 send the same method and parameters at the same time, so merged
    # batches hold rows that can share a generate call (and rows that cannot)
    method, params = REQUEST_KINDS[(index + client // 2) % len(REQUEST_KINDS)]
    return dict(class_id=(client * 3 + index) % CLASSES, method=method, seed=1000 + client * PER_CLIENT + index,
                tokens_only=(client * PER_CLIENT + index) % 11 == 0, **params)


def decode_png(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module")
def served(monkeypatch_module):
    pipe = tiny_pipeline()
    requests = {(c, i): request_of(c, i) for c in range(CLIENTS) for i in range(PER_CLIENT)}
    references = {}
    for key, req in requests.items():
        args = {k: v for k, v in req.items() if k not in ("class_id", "tokens_only")}
        references[key] = pipe.generate([req["class_id"]], decode=not req["tokens_only"], **args)

    generated, batch_sizes, lock = [], [], threading.Lock()
    original_generate, original_call = pipe.generate, handler_module.RequestHandler.__call__

    def counting_generate(*args, **kwargs):
        result = original_generate(*args, **kwargs)
        with lock:
            generated.append(list(zip(np.atleast_1d(kwargs["class_ids"]), np.atleast_1d(kwargs["seed"]))))
        return result

    def counting_call(self, triton_requests):
        with lock:
            batch_sizes.append(len(triton_requests))
        return original_call(self, triton_requests)

    pipe.generate = counting_generate
    monkeypatch_module.setattr(handler_module.RequestHandler, "__call__", counting_call)
    http, grpc, metrics = free_ports(3)
    stubs_before = stub_processes()
    config = ServeConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, queue_delay_us=20000)
    context = running(pipe, config)
    context.__enter__()
    state = dict(requests=requests, references=references, generated=generated, batch_sizes=batch_sizes,
                 config=config, context=context, generate=original_generate,
                 stubs_before=stubs_before)
    yield state
    if state["context"] is not None:  # test_shutdown stops it itself; this covers a failure before it
        state["context"].__exit__(None, None, None)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def client_for(config: ServeConfig, index: int) -> Client:
    if index % 2:
        return Client(f"127.0.0.1:{config.grpc_port}", protocol="grpc", timeout_s=TIMEOUT_S)
    return Client(f"127.0.0.1:{config.http_port}", protocol="http", timeout_s=TIMEOUT_S)


def test_concurrent_clients_get_their_own_images(served, capsys):
    config, requests = served["config"], served["requests"]

    def run_client(client: int) -> list:
        out = []
        with client_for(config, client) as connection:
            for index in range(PER_CLIENT):
                start = time.perf_counter()
                image = connection.generate(**requests[client, index])
                out.append(((client, index), image, time.perf_counter() - start))
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(run_client, c) for c in range(CLIENTS)]
        responses = [item for future in futures for item in future.result(timeout=4 * TIMEOUT_S)]
    wall = time.perf_counter() - start

    assert sorted(key for key, _, _ in responses) == sorted(requests)  # every request answered once
    for key, image, _ in responses:
        reference = served["references"][key]
        np.testing.assert_array_equal(image.tokens, reference.tokens.reshape(-1), err_msg=f"request {key}")
        if requests[key]["tokens_only"]:
            assert image.png == b""
        else:
            np.testing.assert_array_equal(decode_png(image.png), reference.images[0], err_msg=f"request {key}")
        assert image.stats["method"] == requests[key]["method"]
        assert image.stats["accepted_length"] >= 1.0 and image.stats["target_forwards"] > 0
    # the server generated each requested image exactly once: nothing lost, nothing twice
    wanted = sorted((r["class_id"], r["seed"]) for r in requests.values())
    assert sorted((int(c), int(s)) for call in served["generated"] for c, s in call) == wanted
    # Triton's dynamic batcher merged concurrent requests into one model call, and rows of one
    # method and parameters from different requests into one generate call
    assert max(served["batch_sizes"]) > 1, served["batch_sizes"]
    images_per_call = [len(call) for call in served["generated"]]
    assert max(images_per_call) > 1, images_per_call

    latencies = np.array([seconds for _, _, seconds in responses])
    with capsys.disabled():
        print(f"\nspecrt serve load test: {len(responses)} requests from {CLIENTS} clients in {wall:.2f} s = "
              f"{len(responses) / wall:.1f} images/s; latency p50 {np.percentile(latencies, 50) * 1e3:.0f} ms, "
              f"p90 {np.percentile(latencies, 90) * 1e3:.0f} ms; model calls {len(served['batch_sizes'])}, "
              f"requests per call max {max(served['batch_sizes'])}; generate calls {len(images_per_call)}, "
              f"images per generate call max {max(images_per_call)}")


def test_bad_rows_get_one_line_errors(served):
    config = served["config"]
    with client_for(config, 0) as http, client_for(config, 1) as grpc:
        for connection in (http, grpc):
            for request, message in [(dict(class_id=99), "class id 99 out of range"),
                                     (dict(class_id=1, method="beam"), "unknown method 'beam'"),
                                     (dict(class_id=1, method="sd", draft_size=3), "has no parameter draft_size"),
                                     (dict(class_id=1, method="sjd", window=40), "at most 20"),
                                     (dict(class_id=1, prompt="a seven"), "exactly one"),
                                     (dict(prompt="a seven"), "class-conditional")]:
                with pytest.raises(SpecrtError, match=message) as caught:
                    connection.generate(**request)
                assert "\n" not in str(caught.value)
        # and the server still serves
        assert http.generate(class_id=2, method="sjd", seed=7, window=8).tokens.shape == (16,)


def test_a_bad_row_does_not_spoil_its_batch(served):
    import tritonclient.http as httpclient

    config = served["config"]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{config.http_port}", network_timeout=TIMEOUT_S)
    try:
        rows = httpclient.InferInput("class_id", [3, 1], "INT64")
        rows.set_data_from_numpy(np.array([[1], [77], [3]], dtype=np.int64))
        seeds = httpclient.InferInput("seed", [3, 1], "UINT64")
        seeds.set_data_from_numpy(np.array([[5], [5], [6]], dtype=np.uint64))
        result = client.infer("specrt", [rows, seeds])
    finally:
        client.close()
    errors = [bytes(e).decode() for e in result.as_numpy("error")[:, 0]]
    assert errors[0] == errors[2] == "" and "out of range" in errors[1]
    tokens = result.as_numpy("tokens")
    assert (tokens[1] == -1).all()
    for row, (class_id, seed) in ((0, (1, 5)), (2, (3, 6))):
        expected = served["generate"]([class_id], seed=seed).tokens.reshape(-1)
        np.testing.assert_array_equal(tokens[row], expected)


def test_shutdown_is_clean_and_bounded(served):
    config = served["config"]
    assert port_open(config.http_port) and port_open(config.grpc_port)
    start = time.perf_counter()
    context, served["context"] = served["context"], None
    context.__exit__(None, None, None)
    assert time.perf_counter() - start < 30
    assert not port_open(config.http_port) and not port_open(config.grpc_port)
    deadline = time.monotonic() + 15  # the model's stub process ends with the server, not orphaned
    while stub_processes() - served["stubs_before"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not stub_processes() - served["stubs_before"]


def test_a_taken_port_is_one_line_before_any_model_loads(capsys):
    from specrt.cli import main

    http, grpc, metrics = free_ports(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", grpc))
        taken.listen()
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specrt: error: 127.0.0.1:") and "--grpc-port" in err and len(err.splitlines()) == 1
