"""Shared fixtures: a real Strom broker process per test module, on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerproc import BrokerProcess

# Short intervals so that retention, flushes and checkpoints happen within a test's time.
FAST_BROKER_CONFIG = {
    "log.retention.check.interval.ms": "300",
    "log.flush.offset.checkpoint.interval.ms": "1000",
    "log.flush.scheduler.interval.ms": "1000",
    "num.partitions": "1",
}


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[BrokerProcess]:
    """One broker for the whole module; a module may set BROKER_CONFIG to add overrides."""
    overrides = dict(FAST_BROKER_CONFIG)
    overrides.update(getattr(request.module, "BROKER_CONFIG", {}))
    workdir: Path = tmp_path_factory.mktemp("broker")
    with BrokerProcess(workdir, overrides=overrides) as proc:
        yield proc


@pytest.fixture(scope="module")
def bootstrap(broker: BrokerProcess) -> str:
    return broker.bootstrap


@pytest.fixture()
def running_broker(broker: BrokerProcess) -> BrokerProcess:
    """For modules that kill and restart their broker: a test that failed between the kill and
    the start must not take the rest of the module with it."""
    if not broker.running:
        broker.start()
    return broker
