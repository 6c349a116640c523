"""A tiny random-weight Pipeline on PyTorch for the serving tests: LlamaGen-layout GPT target
and draft and a VQ with a 4x4 token grid (tests/export/tiny_export.py), so one image costs
milliseconds and a load test of 64 requests stays within seconds."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "export"))

from tiny_export import tiny_models  # noqa: E402

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


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 right now (held together while picked)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
