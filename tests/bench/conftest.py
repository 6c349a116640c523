"""Fixtures the bench tests share."""
from __future__ import annotations

import pytest

from tiny_demo import write_tiny_demo


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """Random tiny demo models in `specrt demo train`'s format, once per test module."""
    return write_tiny_demo(tmp_path_factory.mktemp("tiny_demo"))
