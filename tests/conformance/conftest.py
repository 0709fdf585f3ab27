"""Fixtures shared by the librdkafka runs: the suite's test-runner, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.librdkafka_runner import build_test_runner


@pytest.fixture(scope="session")
def test_runner() -> Path:
    """librdkafka's test-runner, built (or found in the cache) by build_librdkafka.sh."""
    return build_test_runner()
