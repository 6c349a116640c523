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
from specrt.runtime.serving.protocol import INPUTS, OUTPUTS
from specrt.runtime.threads import checked as checked_threads, checked_or_zero

_TENSORS = "\n".join(["\b", "Inputs (one per row, all optional):",
                      *(f"  {s.name:<12} {s.dtype:<6} {s.doc}" for s in INPUTS),
                      "Outputs:", *(f"  {s.name:<12} {s.dtype:<6} {s.doc}" for s in OUTPUTS)])


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
def serve_command(bundle, demo, backend, device, threads, host, http_port, grpc_port, metrics_port, model_name, max_batch,
                  queue_delay_us, triton_log) -> None:
    """Serve a bundle (or the embedded demo) through Triton Inference Server (PyTriton).

    Requests carry a class id (or a prompt), method, seed and parameters; responses carry PNG
    bytes, the tokens (INT64 VQ codes; FP32 [positions, channels] for a continuous bundle, whose
    `image` is empty when it has no decoder) and stats. Triton's dynamic batcher merges requests that arrive
    together; rows with the same method and parameters run in one generate call. A bad
    request gets a one-line `error` back. The "ready" line comes once the model has passed a
    health check, i.e. when a request would succeed. Stop with Ctrl-C or SIGTERM.
    """
    from specrt.commands.generate import build_pipeline, check_applicable
    from specrt.commands._checkpoint_flags import CheckpointFlags
    from specrt.commands._generate_flags import ModelFlags, RunFlags
    from specrt.runtime.serving.pytriton_server import ServeConfig, check_ports_free, serve

    import tempfile

    from specrt.paths import output_file

    http_port = _port("--http-port", http_port)
    if triton_log is None:
        triton_log = Path(tempfile.gettempdir()) / f"specrt-triton-{http_port}.log"
    log_file = None if str(triton_log) == "-" else str(output_file("--triton-log", triton_log))
    config = ServeConfig(host=host, http_port=http_port, grpc_port=_port("--grpc-port", grpc_port),
                         metrics_port=_port("--metrics-port", metrics_port), model_name=model_name,
                         max_batch=validation.count("--max-batch", max_batch),
                         queue_delay_us=validation.integer("--queue-delay-us", queue_delay_us, low=0),
                         log_file=log_file)
    check_applicable(bundle, demo, None, None, None, CheckpointFlags(), device, backend)  # --device: a torch that has it
    check_ports_free(config)  # before a model loads: a taken port costs a second
    pipeline = build_pipeline(bundle, ModelFlags(demo=demo),
                              run=RunFlags(backend=backend, device=device, threads=threads))
    click.echo(f"specrt serve: starting Triton (its log: {log_file or 'the terminal'}) ...", err=True)

    def ready() -> None:
        click.echo(f"specrt serve: ready: model {model_name!r} on http://{host}:{config.http_port} and grpc "
                   f"{host}:{config.grpc_port}", err=True)

    serve(pipeline, config, on_ready=ready)


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
    from specrt.paths import output_folder
    from specrt.runtime.serving.repository import RepoConfig, write_repository

    output_folder("--out", out)
    config = RepoConfig(model_name=model_name, backend=backend, instance_kind=instance_kind,
                        instances=validation.count("--instances", instances),
                        max_batch=validation.count("--max-batch", max_batch),
                        queue_delay_us=validation.integer("--queue-delay-us", queue_delay_us, low=0),
                        threads=validation.threads("--threads", threads, zero_means_default=True))
    model = write_repository(bundle, out, config, force=force)
    click.echo(f"wrote {model} (config.pbtxt, 1/model.py, 1/bundle); run tritonserver --model-repository={out}")
