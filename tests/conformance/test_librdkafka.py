"""librdkafka 2.0.2's own test suite against one broker.

Every test number in librdkafka_allowlist.txt runs as its own pytest test: `test-runner -Q -E -L`
with TESTS=<number>, judged by the runner's summary table and exit status (librdkafka_runner.py,
shared with the cluster run in test_librdkafka_cluster.py). The broker is Strom by default;
STROM_CONFORMANCE_BROKER=tansu runs the same tests against Tansu to calibrate them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerproc import BrokerProcess, TansuProcess, tansu_binary
from conformance.librdkafka_runner import (
    BUILD_TIMEOUT,
    HERE,
    REPO,
    RUN_TIMEOUT,
    SUITE_BROKER_CONFIG,
    allowlisted,
    run_test,
)

ALLOWLIST = HERE / "librdkafka_allowlist.txt"

pytestmark = [
    pytest.mark.conformance,
    # pytest-timeout is only the backstop: the build and each runner have their own timeouts.
    pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 60),
]

# Tests that subscribe several consumers of one new group back to back and expect them all in the
# first generation: they rely on Kafka's default delay, which librdkafka's own test clusters keep.
# With no delay the first joiner gets a generation of its own and the next join revokes it, which
# these tests either never poll for (0118: 3 failures in 15 runs) or count as an unexpected
# rebalance (0089, 0102: one failure each in 3 runs). 0132 checks exact assignments right after
# the second consumer's. They run on a second broker with Kafka's default.
KAFKA_DEFAULT_REBALANCE_DELAY = {"0089", "0102", "0118", "0132"}
DELAYED_BROKER_CONFIG = {**SUITE_BROKER_CONFIG, "group.initial.rebalance.delay.ms": "3000"}


def _start_broker(workdir: Path, overrides: dict[str, str]) -> BrokerProcess:
    """Strom with overrides, or Tansu (which takes no broker configs) if STROM_CONFORMANCE_BROKER=tansu."""
    which = os.environ.get("STROM_CONFORMANCE_BROKER", "strom")
    proc: BrokerProcess
    if which == "strom":
        proc = BrokerProcess(workdir, overrides=overrides)
    elif which == "tansu":
        proc = TansuProcess(workdir, tansu_binary(REPO / ".cache" / "tansu"))
    else:
        raise pytest.UsageError(f"STROM_CONFORMANCE_BROKER must be strom or tansu, not {which!r}")
    proc.start()
    return proc


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The broker most tests run against, for the whole module."""
    proc = _start_broker(tmp_path_factory.mktemp("broker"), SUITE_BROKER_CONFIG)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def delayed_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with Kafka's default group.initial.rebalance.delay.ms, started by the first test
    in KAFKA_DEFAULT_REBALANCE_DELAY."""
    proc = _start_broker(tmp_path_factory.mktemp("delayed-broker"), DELAYED_BROKER_CONFIG)
    yield proc
    proc.stop()


@pytest.mark.parametrize("number", allowlisted(ALLOWLIST))
def test_librdkafka(number: str, test_runner: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    fixture = "delayed_broker" if number in KAFKA_DEFAULT_REBALANCE_DELAY else "broker"
    broker: BrokerProcess = request.getfixturevalue(fixture)
    if not broker.running:
        # A broker that died in an earlier test fails that test's successors too, but each
        # gets a fresh broker rather than a cascade of connection errors.
        exit_status = broker.returncode
        tail = broker.log_tail()
        broker.restart()
        pytest.fail(f"broker had exited (status {exit_status}) before test {number}; restarted\n{tail}")

    result = run_test(test_runner, number, broker.bootstrap, tmp_path)
    if result.passed:
        return
    verdict = result.verdict()
    if not broker.running:
        verdict = f"the broker exited (status {broker.returncode}) during the test; {verdict}"
    pytest.fail(
        f"librdkafka test {number} against {broker.bootstrap}: {verdict}\n"
        f"{broker.log_tail(20)}\n{result.failure_excerpt()}",  # the reasons last, as CI logs keep ends
        pytrace=False,
    )
