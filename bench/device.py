"""Name the machine a number was measured on: every figure specrt reports says its device.

The naming is the runtime's (runtime/machine.py: `--method auto` keys its cached choice by it too)."""
from __future__ import annotations

from specrt.runtime.machine import cpu_name, device_name

__all__ = ["cpu_name", "device_name"]
