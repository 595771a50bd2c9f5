"""Shared test fixtures: the shared benchmark folder (../shared). Plain helpers (the CLI
runners, REPO, ...) live in tests/support/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.helpers import REPO

pytest_plugins = ["tests.support.cpu_time"]  # pytest --cpu-durations=N

SHARED = Path(os.environ.get("GSPO_SHARED", REPO.parent / "shared"))


@pytest.fixture
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"../shared not found at {SHARED}")
    return SHARED


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow first (in their order, then the rest in theirs): with xdist, a long
    test started last would leave the other workers idle while it runs."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
