"""Fixtures of the model tests: specrt's Triton kernels run under Triton's interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

INTERPRETED_RUN = Path(__file__).with_name("interpreted_kernels.py")


@pytest.fixture(scope="session")
def interpreted() -> dict:
    """What the kernels computed under TRITON_INTERPRET=1, from a process of its own
    (interpreted_kernels.py: Triton reads the variable when it is first imported)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(INTERPRETED_RUN)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
