"""A tiny random-weight Pipeline on PyTorch for the serving tests: LlamaGen-layout GPT target
and draft and a VQ with a 4x4 token grid (tests/export/tiny_export.py), so one image costs
milliseconds and a load test of 64 requests stays within seconds."""
from __future__ import annotations

import contextlib
import queue
import threading
import time

import sys
from pathlib import Path
from typing import Iterator, Optional

sys.path.insert(0, str(Path(__file__).parents[1] / "export"))

from tiny_export import tiny_models  # noqa: E402

from specrt.bench.serve_bench import free_ports  # noqa: E402,F401 (the serving tests' ports, as the load bench picks them)
from specrt.runtime.pipeline import Pipeline  # noqa: E402

# every method, with parameters where a method has them, so the batcher sees mixed groups
REQUEST_KINDS = [("ar", {}), ("sd", {"draft_len": 3}), ("cool-sd", {"relaxation_budget": 2.0}),
                 ("lantern", {"neighbours_k": 4}), ("sjd", {"window": 8}), ("sjd-pac", {"window": 16}),
                 ("sd", {}), ("ar", {"temperature": 0.0})]


def tiny_pipeline() -> Pipeline:
    import torch

    torch.set_num_threads(1)
    models = tiny_models()
    return Pipeline.from_torch(models.target, models.draft, models.vq, max_window=20)


def tiny_continuous_bundle(out: Path) -> Path:
    """A random-weight continuous bundle at `out` (4 tokens of 3 channels, 3 classes), target and
    draft, no decoder: a server gives its tokens only (the families, serving and C API tests)."""
    from specrt.export.mar.export import export_bundle
    from specrt.models.mar.model import MARConfig, random_mar

    shared = dict(token_dim=3, seq_len=4, n_head=2, diffusion_steps=4, num_classes=3)
    target = random_mar(MARConfig(dim=32, n_layer=2, **shared), seed=0)
    draft = random_mar(MARConfig(dim=16, n_layer=1, head_width=16, head_depth=1, **shared), seed=1)
    return export_bundle(target, draft, out)


def continuous_demo_bundle(out: Path) -> Path:
    """The continuous demo as a bundle at `out` (`specrt export --demo mar`: 8x8 tokens of 4
    channels, 10 classes, the tokenizer decoder: 32 px images); a few seconds."""
    from specrt.export.mar.hooks import export_bundle

    return export_bundle(out)


def wait_until_ready(proc, timeout_s: float) -> list[str]:
    """The stderr lines of `specrt serve` (a Popen with text stderr) up to and including its
    "ready:" line; fails the test if the server exits first or says nothing in `timeout_s`.
    A reader thread keeps draining stderr afterwards, so the server never blocks on it."""
    lines: queue.Queue = queue.Queue()

    def read(stream) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, args=(proc.stderr,), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any("ready:" in line for line in seen):
        assert time.monotonic() < deadline, f"no 'ready' line in {timeout_s:.0f} s: {seen}"
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            continue
        assert line is not None, f"specrt serve exited: {seen}"
        seen.append(line)
    return seen


@contextlib.contextmanager
def served(bundle: Path, log_dir: Path, timeout_s: float = 180.0,
           ports: Optional[list[int]] = None) -> Iterator[tuple[int, int]]:
    """`specrt serve BUNDLE` as a subprocess on 127.0.0.1 until the block ends: yields its (http, grpc)
    ports once it says ready; then SIGTERM, a bounded wait, and the exit code a terminated server
    owes (143). Triton's own log goes to log_dir/triton.log. `ports`: its (http, grpc, metrics)
    ports (free_ports(3)), where the caller reads the metrics; default picked here."""
    import signal
    import subprocess

    http, grpc, metrics = ports or free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "specrt.cli", "serve", str(bundle), "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                             "--triton-log", str(log_dir / "triton.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_ready(proc, timeout_s)
        yield http, grpc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 143  # SIGTERM: the server stopped, the CLI says how it ended
