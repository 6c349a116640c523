"""Fixtures shared across the test packages."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_bundle(tmp_path_factory) -> Path:
    """The embedded demo exported once per test session (read-only for tests)."""
    pytest.importorskip("torch")
    from specrt.bench.models import demo_bundle as export_demo_bundle

    return export_demo_bundle(cache_dir=tmp_path_factory.mktemp("demo-bundle"))
