"""Name the machine a number was measured on: every figure specrt reports says its device, and
`--method auto` keys the choice it caches by it (a choice made on one CPU is not another's)."""
from __future__ import annotations

import os
import platform

CUDA_BACKENDS = ("torch-cuda", "ort-cuda", "ort-trt", "trt")


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo on Linux) with the number of cores visible."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores)"


def device_name(backend: str) -> str:
    """The device a backend computes on: the GPU name for CUDA backends, else the CPU."""
    if backend in CUDA_BACKENDS:
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
        except ImportError:
            pass
    return cpu_name()
