"""`specrt serve`: a pipeline behind Triton Inference Server, in this process, through PyTriton.

PyTriton starts the tritonserver binary its wheel bundles and binds our RequestHandler as a
Python model with Triton's dynamic batcher in front, so requests that arrive while a call runs
are merged into the next. Triton speaks HTTP/REST and gRPC (KServe v2); the ports and the
address are flags, 127.0.0.1 by default. Any family's pipeline (runtime/families) is served the
same way; the declared `tokens` output is its family's (RequestHandler.outputs).

The venv quirk: the wheel's Python-backend stub links the system libpython3.11, so the
interpreter running this must be that same build (a venv made with /usr/bin/python3.11 on
Debian). Another 3.11 build (pyenv's, conda's) fails at model load with "'_thread.RLock'
object has no attribute '_recursion_count'"; `model_load_hint` says so when loading fails.

Ready means ready: `running` yields only once Triton reports the model ready to a health check
over HTTP (`wait_until_ready`), so `specrt serve` prints its "ready" line when a request would
succeed. Triton's own log (~65 lines at start, CUDA/NVML complaints on a CPU machine among
them) goes to `ServeConfig.log_file` instead of the terminal; GPU metrics are off where there
is no NVIDIA driver.

Two ways to batch (`specrt serve --batching`): `running` binds the RequestHandler through PyTriton
behind Triton's dynamic batcher (requests that arrive during a call wait for it to end);
`running_inflight` starts the same Triton on a temporary repository holding specrt's in-flight
model (inflight_model.py: a Scheduler admits requests between rounds, a full queue answers HTTP
503 / gRPC UNAVAILABLE, metrics on the metrics port). Leaving `running_inflight` drains the model
first: no new request is admitted, running images get `exit_timeout_s` to finish, the rest are
answered with an error, and only then is Triton stopped.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.runtime.serving.handler import RequestHandler
from specrt.runtime.serving.inflight_repo import InflightConfig, write_inflight_repository
from specrt.runtime.serving.protocol import INPUTS, NUMPY_DTYPES, OUTPUTS, TensorSpec

FEATURE = "specrt serve"
INSTALL = "pip install 'specrt[serve]' in a venv made with the system python3.11 (docs/guides/serve-triton.md)"


@dataclass(frozen=True)
class ServeConfig:
    """Where and how Triton listens and batches (the `specrt serve` flags)."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_name: str = "specrt"
    max_batch: int = 8
    queue_delay_us: int = 2000
    # the dynamic batcher's queue policy: Triton refuses a request beyond max_queue waiting ones with
    # UNAVAILABLE (HTTP 503) and one that waited request_timeout_s (0: no bound, no timeout)
    max_queue: int = 0
    request_timeout_s: float = 0.0
    # how long Triton waits at shutdown for in-flight requests, open connections and the model's
    # unloading (~3 s here); when it runs out Triton exits at once and leaves the model's stub
    # process behind, so keep it well above the unload time
    exit_timeout_s: int = 10
    log_verbose: int = 0
    # Triton's own log: a file (None: Triton's default, the terminal)
    log_file: Optional[str] = None
    # how long to wait for the model to answer a health check once Triton has started
    ready_timeout_s: float = 60.0


def _pytriton() -> Any:
    try:
        triton = require("pytriton.triton", FEATURE)
    except SpecrtError:
        raise SpecrtError(f"{FEATURE} needs nvidia-pytriton, which is not installed: {INSTALL}") from None
    from pytriton import model_config

    return triton, model_config


def model_load_hint() -> str:
    """Why a model may fail to load under PyTriton on this interpreter ('' when nothing is known)."""
    if sys.platform.startswith("linux") and sys.version_info[:2] == (3, 11) and not sys.base_prefix.startswith("/usr"):
        return (f" — this interpreter ({sys.base_prefix}) is not the system python3.11 that PyTriton's stub links; "
                "make the venv with /usr/bin/python3.11")
    return ""


def _tensors(model_config: Any, specs: tuple, optional: bool) -> list:
    dtypes = {**NUMPY_DTYPES, "BYTES": np.bytes_}
    return [model_config.Tensor(name=s.name, dtype=dtypes[s.dtype], shape=s.shape, **({"optional": True} if optional
                                                                                       else {}))
            for s in specs]


def require_pytriton() -> None:
    """SpecrtError naming the install when the `serve` extra is missing: checked before the model
    loads and before anything says Triton is starting."""
    _pytriton()
    require("tritonclient.http", FEATURE)


def check_ports_free(config: ServeConfig) -> None:
    """SpecrtError naming the flag when a port is taken, or named for two of HTTP, gRPC and metrics
    (tritonserver would exit, and PyTriton would wait two minutes for it before saying so)."""
    ports = (("--http-port", config.http_port), ("--grpc-port", config.grpc_port),
             ("--metrics-port", config.metrics_port))
    for i, (flag, port) in enumerate(ports):
        same = [other for other, taken in ports[:i] if taken == port]
        if same:
            raise SpecrtError(f"{same[0]} and {flag} are both {port}: HTTP, gRPC and metrics each need a port of "
                              "their own")
    for flag, port in ports:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((config.host, port))
            except OSError as exc:
                raise SpecrtError(f"{config.host}:{port} cannot be used ({exc.strerror}); pick another {flag}") from None


def has_nvidia_driver() -> bool:
    """Whether this machine has an NVIDIA driver (else Triton's GPU metrics only log errors)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)


def wait_until_ready(config: ServeConfig) -> None:
    """Return once Triton says over HTTP that config.model_name is ready (a health check, the
    one a load balancer would make); SpecrtError after config.ready_timeout_s."""
    http = require("tritonclient.http", FEATURE)
    url = f"{_client_host(config.host)}:{config.http_port}"
    deadline = time.monotonic() + config.ready_timeout_s
    last = "no answer"
    with http.InferenceServerClient(url, connection_timeout=5.0, network_timeout=5.0) as client:
        while True:
            try:
                if client.is_server_ready() and client.is_model_ready(config.model_name):
                    return
                last = f"model {config.model_name!r} not ready yet"
            except Exception as exc:  # connection refused, reset, timed out: the server is still coming up
                last = _one_line(exc)
            if time.monotonic() >= deadline:
                raise SpecrtError(f"Triton started but model {config.model_name!r} did not pass a health check in "
                                  f"{config.ready_timeout_s:.0f} s ({last}){_log_hint(config)}")
            time.sleep(0.1)


def _no_echo(triton: Any) -> None:
    """PyTriton echoes whatever tritonserver and its stubs print to our stdout (its TritonServer's
    verbose=True, with no public switch); with the log in a file what is left is shutdown chatter
    ("Signal (2) received."). Private attributes, guarded: a PyTriton without them keeps echoing."""
    try:
        if triton._triton_server is None:
            triton._initialize_server()  # creates the server object; __enter__ then only starts it
        triton._triton_server._verbose = False
    except AttributeError:
        pass


def _log_hint(config: ServeConfig) -> str:
    return f"; Triton's log: {config.log_file}" if config.log_file else ""


def _one_line(exc: BaseException) -> str:
    """A Triton error as one line: its first line, and the exception a traceback inside it ends in."""
    lines = [line.strip() for line in str(exc).replace("\\n", "\n").splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    causes = [line for line in lines[1:] if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return f"{lines[0].removesuffix('Traceback (most recent call last):').strip()} {causes[-1]}" if causes else lines[0]


def _triton_config(triton_mod: Any, config: ServeConfig, repository: Optional[Path] = None) -> Any:
    return triton_mod.TritonConfig(
        http_address=config.host, http_port=config.http_port, grpc_address=config.host, grpc_port=config.grpc_port,
        metrics_address=config.host, metrics_port=config.metrics_port, exit_timeout_secs=config.exit_timeout_s,
        log_verbose=config.log_verbose, log_file=config.log_file, allow_gpu_metrics=has_nvidia_driver(),
        model_repository=repository)


@contextmanager
def _started(triton_mod: Any, config: ServeConfig, repository: Optional[Path] = None,
             bind: Optional[Any] = None) -> Iterator[Any]:
    """Triton started (with `bind(triton)` run before it goes live) and the model passed its health check."""
    with ExitStack() as stack:
        try:  # starting the server, loading the model (in Triton's Python-backend stub), going live
            with _load_failures_end_the_wait(triton_mod, config):
                triton = triton_mod.Triton(config=_triton_config(triton_mod, config, repository))
                if config.log_file:
                    _no_echo(triton)
                triton = stack.enter_context(triton)
                if bind is not None:
                    bind(triton)
                triton.run()
        except Exception as exc:  # PyTriton's and Triton's own errors, as one line
            raise SpecrtError(f"Triton did not start: {_one_line(exc)}{_model_failure(config)}{model_load_hint()}"
                              f"{_log_hint(config)}") from exc
        wait_until_ready(config)
        yield triton


LOAD_POLL_S = 1.0  # how often the wait for Triton looks in its log for the model's failure to load


@contextmanager
def _load_failures_end_the_wait(triton_mod: Any, config: ServeConfig) -> Iterator[None]:
    """While Triton starts, PyTriton waits up to 120 s for it to be ready; a model that failed to
    load (the in-flight model opens its pipeline then) leaves it never ready, so that wait ran out
    before anyone heard why. Here the wait is cut into LOAD_POLL_S pieces, and between them Triton's
    log is read: a line saying the model failed to load ends the wait at once, with that line."""
    from pytriton.client.exceptions import PyTritonClientTimeoutError
    from pytriton.client.warnings import NotSupportedTimeoutWarning

    waited = triton_mod.wait_for_server_ready

    def wait(client: Any, timeout_s: Optional[float] = None, headers: Optional[dict] = None) -> None:
        end = time.monotonic() + (120.0 if timeout_s is None else timeout_s)
        while True:
            try:
                with warnings.catch_warnings():  # a piece shorter than the client's timeouts is what we want
                    warnings.simplefilter("ignore", NotSupportedTimeoutWarning)
                    return waited(client, timeout_s=max(min(LOAD_POLL_S, end - time.monotonic()), 0.0),
                                  headers=headers)
            except PyTritonClientTimeoutError:
                if _model_load_failed(config):
                    raise SpecrtError(f"model {config.model_name!r} failed to load") from None
                if time.monotonic() >= end:
                    raise

    triton_mod.wait_for_server_ready = wait
    try:
        yield
    finally:
        triton_mod.wait_for_server_ready = waited


def _model_load_failed(config: ServeConfig) -> bool:
    """Triton's log says config.model_name failed to load."""
    if not config.log_file or not os.path.isfile(config.log_file):
        return False
    with open(config.log_file, errors="replace") as log:
        return any(f"failed to load '{config.model_name}'" in line for line in log)


def _model_failure(config: ServeConfig) -> str:
    """Why the model did not load, as Triton's log says it (the in-flight model opens its pipeline
    there): the error of its "failed to load" line, else the last line naming a SpecrtError."""
    if not config.log_file or not os.path.isfile(config.log_file):
        return ""
    with open(config.log_file, errors="replace") as log:
        lines = log.readlines()
    marker = f"failed to load '{config.model_name}' version"
    for line in reversed(lines):
        if marker in line:  # ... failed to load 'specrt' version 1: Internal: SpecrtError: ...\n\nAt: ...
            reason = line.split(marker, 1)[1].partition(": ")[2].split("\\n")[0].strip().strip('"')
            return f" ({reason.removeprefix('Internal: ')[:300]})"
    reasons = [line for line in lines if "SpecrtError" in line or "failed to load" in line]
    return f" ({' '.join(reasons[-1].split())[-300:]})" if reasons else ""


@contextmanager
def running(pipeline: Any, config: ServeConfig = ServeConfig()) -> Iterator[Any]:
    """Triton up with `pipeline` (any family's) bound as config.model_name behind Triton's dynamic
    batcher; stopped (cleanly) when the block ends."""
    triton_mod, model_config = _pytriton()
    check_ports_free(config)
    handler = RequestHandler(pipeline)
    # images one generate pass decodes (a family's pipeline without that limit has none)
    max_batch = min(getattr(pipeline, "max_images", None) or config.max_batch, config.max_batch)

    def bind(triton: Any) -> None:
        triton.bind(model_name=config.model_name, infer_func=handler,
                    inputs=_tensors(model_config, INPUTS, optional=True),
                    outputs=_tensors(model_config, handler.outputs, optional=False),
                    config=model_config.ModelConfig(max_batch_size=max_batch, batcher=model_config.DynamicBatcher(
                        max_queue_delay_microseconds=config.queue_delay_us,
                        default_queue_policy=model_config.QueuePolicy(
                            max_queue_size=config.max_queue, allow_timeout_override=True,
                            default_timeout_microseconds=int(config.request_timeout_s * 1e6)))),
                    strict=False)

    with _started(triton_mod, config, bind=bind) as triton:
        yield triton


DRAIN_MARGIN_S = 5.0  # beyond the exit timeout: answering what the drain ended and saying so


@contextmanager
def running_inflight(pipeline_spec: dict[str, Any], config: ServeConfig = ServeConfig(),
                     inflight: InflightConfig = InflightConfig(),
                     outputs: tuple[TensorSpec, ...] = OUTPUTS) -> Iterator[Any]:
    """Triton up with specrt's in-flight model as config.model_name, its pipeline opened in Triton's
    stub process from `pipeline_spec` (inflight_repo.open_pipeline); `outputs`: the model's tensors
    (protocol.outputs of its family). Leaving the block drains the model (module docstring), then
    stops Triton."""
    triton_mod, _ = _pytriton()
    check_ports_free(config)
    with tempfile.TemporaryDirectory(prefix="specrt-inflight-") as folder:
        repository = Path(folder) / "models"
        repository.mkdir()
        drain_file = write_inflight_repository(repository, config.model_name, inflight, pipeline_spec,
                                               drain_s=config.exit_timeout_s, outputs=outputs)
        with _started(triton_mod, config, repository) as triton:
            try:
                yield triton
            finally:
                drain(drain_file, config.exit_timeout_s + DRAIN_MARGIN_S)


def drain(drain_file: Path, timeout_s: float) -> bool:
    """Ask the in-flight model to drain and wait (up to `timeout_s`) until it says it has; False if it did not."""
    drain_file.touch()
    done = Path(f"{drain_file}.done")
    end = time.monotonic() + timeout_s
    while not done.exists():
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
    return True


WATCH_PERIOD_S = 0.5  # how often serve() checks that Triton and its model are still alive


def serve(pipeline: Any, config: ServeConfig = ServeConfig(), on_ready: Optional[Any] = None) -> None:
    """Serve behind the dynamic batcher until interrupted (Ctrl-C / SIGTERM); `on_ready()` runs once
    the model has passed its health check, i.e. when a request would succeed."""
    with running(pipeline, config) as triton:
        _watch(triton, config, on_ready)


def serve_inflight(pipeline_spec: dict[str, Any], config: ServeConfig = ServeConfig(),
                   inflight: InflightConfig = InflightConfig(), outputs: tuple[TensorSpec, ...] = OUTPUTS,
                   on_ready: Optional[Any] = None) -> None:
    """Serve with in-flight batching until interrupted; SIGTERM drains the model before Triton stops."""
    with running_inflight(pipeline_spec, config, inflight, outputs) as triton:
        _watch(triton, config, on_ready)


def _watch(triton: Any, config: ServeConfig, on_ready: Optional[Any]) -> None:
    if on_ready is not None:
        on_ready()
    # our own watch instead of triton.serve(): PyTriton's swallows the KeyboardInterrupt that
    # Ctrl-C and SIGTERM (specrt.cli: Terminated) raise, and the process would exit 0 on a kill;
    # here they unwind through the caller's block (the server stops) and the CLI exits 130 / 143
    while triton.is_alive():
        time.sleep(WATCH_PERIOD_S)
    raise SpecrtError(f"Triton stopped serving{_log_hint(config)}")
