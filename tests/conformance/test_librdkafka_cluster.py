"""librdkafka 2.0.2's own test suite against a 3-broker Strom cluster on ZooKeeper.

The same runner as test_librdkafka.py (librdkafka_runner.py), with bootstrap.servers listing all
three brokers (tests/cluster_harness.py: 127.0.0.11-13) and the suite's broker configs on top of the
cluster's replication settings: topics are created with replication factor 3 and
min.insync.replicas 2, as on librdkafka's own trivup clusters (tests/scenarios/*.json). Each number
in librdkafka_cluster_allowlist.txt is its own pytest test; left out, with reasons: FINDINGS.md.

Tests of the "noautocreate" scenario (0107, 0111) run with ``-s noautocreate`` on a second
cluster with auto.create.topics.enable=false, started only when the first of them runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster_harness import Cluster, ClusterError
from conformance.librdkafka_runner import (
    BUILD_TIMEOUT,
    HERE,
    RUN_TIMEOUT,
    SUITE_BROKER_CONFIG,
    allowlisted,
    run_test,
)
from strom.cli.local_cluster import java_available

ALLOWLIST = HERE / "librdkafka_cluster_allowlist.txt"

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.cluster,
    pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 120),
]

# The suite's configs over tests/cluster_harness.py's (which already sets short replica and ZooKeeper
# timeouts); the replication ones are restated because the tests count on them.
CLUSTER_SUITE_CONFIG = {
    **SUITE_BROKER_CONFIG,
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
}
NOAUTOCREATE_CONFIG = {**CLUSTER_SUITE_CONFIG, "auto.create.topics.enable": "false"}
# Tests declared with .scenario = "noautocreate" in the suite's test.c: the runner skips them in
# the default scenario, and they create and delete their topics with the Admin API.
NOAUTOCREATE = {"0107", "0111"}


def _cluster(folder: Path, overrides: dict[str, str]) -> Cluster:
    if not java_available():
        pytest.skip("ZooKeeper needs java and Debian's zookeeper package (make system-deps)")
    cluster = Cluster(folder, brokers=3, overrides=overrides).start()
    try:
        cluster.wait_for_registered()
        cluster.wait_for_controller()
    except ClusterError:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def default_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster of the suite's default scenario (auto-creation on), for the whole module."""
    cluster = _cluster(tmp_path_factory.mktemp("cluster"), CLUSTER_SUITE_CONFIG)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def noautocreate_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The "noautocreate" scenario's cluster, started by the first test in NOAUTOCREATE."""
    cluster = _cluster(tmp_path_factory.mktemp("cluster-noautocreate"), NOAUTOCREATE_CONFIG)
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("number", allowlisted(ALLOWLIST))
def test_librdkafka_cluster(
    number: str, test_runner: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    scenario = "noautocreate" if number in NOAUTOCREATE else "default"
    cluster: Cluster = request.getfixturevalue(f"{scenario}_cluster")
    down = [n for n, broker in cluster.brokers.items() if not broker.running]
    if down:
        # A broker that died in an earlier test would fail every later one; each gets the whole
        # cluster back instead of a cascade of timeouts.
        tails = "\n".join(cluster.brokers[n].log_tail() for n in down)
        cluster.ensure_all_running()
        cluster.wait_for_registered()
        pytest.fail(f"broker(s) {down} had exited before test {number}; restarted\n{tails}", pytrace=False)

    result = run_test(test_runner, number, cluster.bootstrap, tmp_path, scenario=scenario)
    if result.passed:
        return
    verdict = result.verdict()
    exited = {n: b.returncode for n, b in cluster.brokers.items() if not b.running}
    if exited:
        verdict = f"broker(s) exited during the test (id: status {exited}); {verdict}"
    # The runner's reasons last: a CI log that keeps only the end of the output still shows them.
    pytest.fail(
        f"librdkafka test {number} against the cluster {cluster.bootstrap}: {verdict}\n"
        f"{cluster.describe(lines=15)}\n{result.failure_excerpt()}\n"
        f"librdkafka test {number}: {verdict}",
        pytrace=False,
    )
