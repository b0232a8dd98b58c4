"""Shared test settings.

`IRC_TEST_DEVICE=cuda` runs the compiling tests on a GPU (default: cpu, where
Triton's interpreter runs the kernels). Tests marked `gpu` need a GPU and
are collected only then: they are not skipped on a CPU run, they are not part
of it (see docs/testing.md).
"""

from __future__ import annotations

import os

import pytest

DEVICE = os.environ.get("IRC_TEST_DEVICE", "cpu")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (IRC_TEST_DEVICE=cuda)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if DEVICE == "cuda":
        return
    kept = [item for item in items if item.get_closest_marker("gpu") is None]
    dropped = [item for item in items if item.get_closest_marker("gpu") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
