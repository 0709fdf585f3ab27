"""One cluster per test module (tests/cluster_harness.py): ZooKeeper and three brokers on 127.0.0.11-13.

A module shapes its cluster with ``CLUSTER = {...}`` (keyword arguments of ``Cluster``, e.g.
``{"brokers": 3, "overrides": {...}, "zookeeper_proxies": True}``). Tests take ``cluster``, which
first undoes what an earlier test left (paused or stopped brokers, cut links) and waits until
every broker is registered and a controller is elected, so one failed test does not fail the
rest of its module. A failed test's report carries the cluster's state and every log's tail.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from cluster_harness import Cluster
from strom.cli.local_cluster import java_available


@pytest.fixture(scope="module")
def cluster_module(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    if not java_available():
        pytest.skip("ZooKeeper needs java and Debian's zookeeper package (make system-deps)")
    options = dict(getattr(request.module, "CLUSTER", {}))
    with Cluster(tmp_path_factory.mktemp("cluster"), **options) as cluster:
        yield cluster


@pytest.fixture()
def cluster(cluster_module: Cluster) -> Cluster:
    cluster_module.ensure_all_running()
    cluster_module.wait_for_registered()
    cluster_module.wait_for_controller()
    return cluster_module


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    found = getattr(item, "funcargs", {}).get("cluster_module")
    if report.failed and isinstance(found, Cluster):
        try:
            report.sections.append(("cluster state and logs", found.describe()))
        except Exception as exc:  # the report must not fail because the cluster is gone
            report.sections.append(("cluster state and logs", f"unavailable: {exc!r}"))
