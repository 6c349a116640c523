"""`specrt serve [BUNDLE]` and `specrt triton-repo BUNDLE --out REPO`: specrt behind Triton.

`serve` maps onto specrt.runtime.serving.pytriton_server.serve (the pipeline of the BUNDLE's
family, or the embedded demo, bound in this process through PyTriton); `triton-repo` onto
specrt.runtime.serving.repository.write_repository (a model repository for the stock
tritonserver container). Both speak specrt.runtime.serving.protocol's tensors, with `tokens`
of the model family's dtype and shape (INT64 codes, FP32 continuous latents).
"""
from __future__ import annotations

from pathlib import Path

import click

from specrt import validation
from specrt.commands.generate import DEMO_HELP, DEMO_NAMES
from specrt.runtime.backends.bundle_backends import BUNDLE_BACKENDS
from specrt.runtime.scheduling.scheduler import DEFAULT_GROUPS, MAX_GROUPS
from specrt.runtime.serving.protocol import INPUTS, OUTPUTS
from specrt.runtime.threads import checked as checked_threads, checked_or_zero

_TENSORS = "\n".join(["\b", "Inputs (one per row, all optional):",
                      *(f"  {s.name:<12} {s.dtype:<6} {s.doc}" for s in INPUTS),
                      "Outputs:", *(f"  {s.name:<12} {s.dtype:<6} {s.doc}" for s in OUTPUTS)])


BATCHING = ("inflight", "dynamic")
MAX_SLOTS = 256  # the scheduler's bound; a bundle's --max-batch bounds it further
# waiting requests hold their inputs only (a class id or a prompt, a few hundred bytes), so the
# bound is about how long the last one waits, not memory
MAX_QUEUE = 4096
MAX_REQUEST_TIMEOUT_S = 3600.0


def _port(name: str, value: int) -> int:
    return validation.integer(name, value, low=1, high=65535)


@click.command(name="serve", epilog=_TENSORS)
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--demo", type=click.Choice(DEMO_NAMES), default=None, help=DEMO_HELP)
@click.option("--backend", type=click.Choice(["torch", *BUNDLE_BACKENDS]),
              help="Default: ort for a BUNDLE, torch for the embedded demo.")
@click.option("--device", help="torch device for the embedded demo (cpu, cuda).")
@click.option("--threads", type=int, callback=checked_threads, help="Intra-op threads (default: one per CPU; the demo: 1).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address HTTP, gRPC and metrics bind to.")
@click.option("--http-port", type=int, default=8000, show_default=True, help="HTTP/REST port (KServe v2).")
@click.option("--grpc-port", type=int, default=8001, show_default=True, help="gRPC port.")
@click.option("--metrics-port", type=int, default=8002, show_default=True, help="Prometheus metrics port.")
@click.option("--model-name", default="specrt", show_default=True, help="Name clients send requests to.")
@click.option("--max-batch", type=int, default=8, show_default=True,
              help="Most images the dynamic batcher merges into one model call (capped by the bundle's --max-batch).")
@click.option("--queue-delay-us", type=int, default=2000, show_default=True,
              help="How long the batcher waits for more requests before starting a call.")
@click.option("--triton-log", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File for Triton's own log (default: specrt-triton-HTTPPORT.log in the temporary folder); "
                   "'-' leaves it on the terminal.")
@click.option("--batching", type=click.Choice(BATCHING), default="inflight", show_default=True,
              help="inflight: requests join the running batch between rounds (a scheduler with --slots); "
                   "dynamic: Triton's dynamic batcher merges requests into whole generate calls.")
@click.option("--slots", type=int, default=None,
              help="inflight: images a batch decodes together, one batch per method and parameters (at most the "
                   "bundle's --max-batch; default 8, or that maximum where it is smaller).")
@click.option("--groups", type=int, default=None,
              help="inflight: batches of different methods or parameters decoding side by side, each "
                   f"with KV buffers of its own (1 to {MAX_GROUPS}; default {DEFAULT_GROUPS}; 1 keeps one batch's memory).")
@click.option("--max-queue", type=int, default=64, show_default=True,
              help=f"Requests that may wait (1 to {MAX_QUEUE}); beyond it a request is refused at once: HTTP 503 / "
                   "gRPC UNAVAILABLE, 'the queue is full'.")
@click.option("--request-timeout", type=float, default=None,
              help="Seconds a request may take (inflight: arrival to answer; dynamic: its wait in the queue); a "
                   "request's own Triton timeout, when sooner, wins. Default: none.")
@click.option("--exit-timeout", type=int, default=10, show_default=True,
              help="On SIGTERM: seconds running images get to finish (inflight; the rest are answered with an error) "
                   "and Triton gets to stop.")
def serve_command(bundle, demo, backend, device, threads, host, http_port, grpc_port, metrics_port, model_name, max_batch,
                  queue_delay_us, triton_log, batching, slots, groups, max_queue, request_timeout, exit_timeout) -> None:
    """Serve a bundle (or the embedded demo) through Triton Inference Server (PyTriton).

    Requests carry a class id (or a prompt), method, seed and parameters; responses carry PNG
    bytes, the tokens (INT64 VQ codes; FP32 [positions, channels] for a continuous bundle, whose
    `image` is empty when it has no decoder) and stats. With --batching inflight (the default) a
    scheduler decodes --slots images together and admits waiting requests between rounds; requests
    of the same method and parameters share rounds, and up to --groups such groups decode side by
    side. With --batching dynamic, Triton's dynamic
    batcher merges requests that arrive together into one generate call. Beyond --max-queue waiting
    requests a request is refused at once (HTTP 503 / gRPC UNAVAILABLE). A bad request gets a
    one-line `error` back. Metrics (Prometheus text) are on the metrics port. The "ready" line comes
    once the model has passed a health check, i.e. when a request would succeed. Stop with Ctrl-C
    or SIGTERM (inflight: admission stops, running images finish within --exit-timeout).
    """
    from specrt.commands.generate import build_pipeline, check_applicable
    from specrt.commands._checkpoint_flags import CheckpointFlags
    from specrt.commands._generate_flags import ModelFlags, RunFlags
    from specrt.runtime.serving.pytriton_server import (ServeConfig, check_ports_free, require_pytriton, serve,
                                                      serve_inflight)

    import tempfile

    from specrt.paths import output_file

    http_port = _port("--http-port", http_port)
    if triton_log is None:
        triton_log = Path(tempfile.gettempdir()) / f"specrt-triton-{http_port}.log"
    log_file = None if str(triton_log) == "-" else str(output_file("--triton-log", triton_log))
    timeout = None if request_timeout is None else validation.number("--request-timeout", request_timeout, low=0.0,
                                                                     high=MAX_REQUEST_TIMEOUT_S, low_open=True)
    config = ServeConfig(host=host, http_port=http_port, grpc_port=_port("--grpc-port", grpc_port),
                         metrics_port=_port("--metrics-port", metrics_port), model_name=model_name,
                         max_batch=validation.count("--max-batch", max_batch),
                         queue_delay_us=validation.integer("--queue-delay-us", queue_delay_us, low=0),
                         max_queue=validation.count("--max-queue", max_queue, high=MAX_QUEUE),
                         request_timeout_s=timeout or 0.0,
                         exit_timeout_s=validation.integer("--exit-timeout", exit_timeout, low=1, high=600),
                         log_file=log_file)
    from specrt.runtime.serving.inflight_repo import InflightConfig

    inflight = InflightConfig(slots=None if slots is None else validation.count("--slots", slots, high=MAX_SLOTS),
                              groups=None if groups is None else validation.count("--groups", groups, high=MAX_GROUPS),
                              max_queue=config.max_queue, request_timeout_s=timeout, max_batch=config.max_batch)
    check_applicable(bundle, demo, None, None, None, CheckpointFlags(), device, backend)  # --device: a torch that has it
    require_pytriton()  # the `serve` extra, before a model loads and before "starting Triton"
    check_ports_free(config)  # before a model loads: a taken port costs a second

    def ready() -> None:
        click.echo(f"specrt serve: ready: model {model_name!r} on http://{host}:{config.http_port} and grpc "
                   f"{host}:{config.grpc_port} ({batching} batching)", err=True)

    if batching == "inflight":
        spec = {"factory": f"{__name__}:served_pipeline", "bundle": None if bundle is None else str(Path(bundle).resolve()),
                "demo": demo, "backend": backend, "device": device, "threads": threads}
        click.echo(f"specrt serve: starting Triton (its log: {log_file or 'the terminal'}) ...", err=True)
        serve_inflight(spec, config, inflight, declared_outputs(bundle, demo), on_ready=ready)
        return
    pipeline = build_pipeline(bundle, ModelFlags(demo=demo),
                              run=RunFlags(backend=backend, device=device, threads=threads))
    click.echo(f"specrt serve: starting Triton (its log: {log_file or 'the terminal'}) ...", err=True)
    serve(pipeline, config, on_ready=ready)


def served_pipeline(spec: dict) -> object:
    """The pipeline `specrt serve`'s flags name (spec: bundle, demo, backend, device, threads), opened
    where the in-flight model runs (Triton's stub process) by the same route as in this one."""
    from specrt.commands._generate_flags import ModelFlags, RunFlags
    from specrt.commands.generate import build_pipeline

    bundle = None if spec.get("bundle") is None else Path(spec["bundle"])
    return build_pipeline(bundle, ModelFlags(demo=spec.get("demo")),
                          run=RunFlags(backend=spec.get("backend"), device=spec.get("device"),
                                       threads=spec.get("threads")))


def declared_outputs(bundle, demo) -> tuple:
    """The model's output tensors without opening a graph: a bundle's from its manifest; an embedded
    demo's from its family (a continuous demo's latents declared [-1, -1])."""
    from specrt.runtime.family_registry import family_for, read_bundle
    from specrt.runtime.serving.protocol import outputs

    if bundle is not None:
        family, manifest = read_bundle(bundle)
        return outputs(family.token_dtype, family.manifest_token_shape(manifest))
    family = family_for(None, demo)
    return outputs(family.token_dtype, (-1,) if family.token_dtype == "int64" else (-1, -1))


@click.command(name="triton-repo")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Repository folder to write.")
@click.option("--model-name", default="specrt", show_default=True, help="The model's name in the repository.")
@click.option("--backend", type=click.Choice(BUNDLE_BACKENDS), default=None,
              help="What each instance runs the bundle on (default: ort-cuda, which needs onnxruntime-gpu in the "
                   "container; trt needs engines built with `specrt build` for that GPU; a continuous bundle: ort).")
@click.option("--instance-kind", type=click.Choice(["gpu", "cpu"]), default=None,
              help="gpu: --instances per GPU (KIND_GPU); cpu: --instances in all, with --backend ort (default: gpu; "
                   "cpu for a continuous bundle, which runs on the CPU).")
@click.option("--instances", type=int, default=1, show_default=True, help="Model instances (per GPU with gpu).")
@click.option("--max-batch", type=int, default=8, show_default=True, help="Triton's max_batch_size.")
@click.option("--queue-delay-us", type=int, default=2000, show_default=True, help="Dynamic batcher queue delay.")
@click.option("--threads", type=int, default=0, show_default=True, callback=checked_or_zero,
              help="onnxruntime intra-op threads per session (0: its default, one per core).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def triton_repo_command(bundle, out, model_name, backend, instance_kind, instances, max_batch, queue_delay_us,
                        threads, force) -> None:
    """Write a Triton model repository serving BUNDLE (any model family) on the stock tritonserver container.

    \b
    REPO/<model>/config.pbtxt   Python backend, dynamic batching, instance_group
    REPO/<model>/1/model.py     specrt's Triton model (specrt must be installed in the container)
    REPO/<model>/1/bundle/      a copy of BUNDLE
    docs/guides/serve-triton.md has the docker command.
    """
    from specrt.bundle_dir import refuse_existing
    from specrt.paths import output_folder
    from specrt.runtime.serving.repository import REPOSITORY, RepoConfig, is_repository, write_repository

    output_folder("--out", out)
    refuse_existing(out, force, is_repository, REPOSITORY)  # before the bundle is read
    config = RepoConfig(model_name=model_name, backend=backend, instance_kind=instance_kind,
                        instances=validation.count("--instances", instances),
                        max_batch=validation.count("--max-batch", max_batch),
                        queue_delay_us=validation.integer("--queue-delay-us", queue_delay_us, low=0),
                        threads=validation.threads("--threads", threads, zero_means_default=True))
    model = write_repository(bundle, out, config, force=force)
    click.echo(f"wrote {model} (config.pbtxt, 1/model.py, 1/bundle); run tritonserver --model-repository={out}")
