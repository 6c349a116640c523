"""Fixtures for the engine tests: a tiny two-graph bundle written with onnx.helper."""
from pathlib import Path

import pytest

from tiny_bundle import write_bundle


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "bundle")
