"""Under-replication on the leader's /metrics: a follower stopped shows as an under-replicated
partition and an ISR shrink; started again, it rejoins (an ISR expansion) and the count goes back
to 0. Three brokers, each with metrics.listener set, scraped over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from brokerproc import free_port
from cluster_harness import Cluster, broker_host

pytestmark = pytest.mark.cluster

METRICS_PORTS = {n: free_port(broker_host(n)) for n in (1, 2, 3)}
CLUSTER = {
    "broker_overrides": {
        n: {"metrics.listener": f"http://{broker_host(n)}:{port}"} for n, port in METRICS_PORTS.items()
    }
}
DEADLINE = 30.0


def scrape(broker_id: int) -> dict[str, float]:
    """The broker's unlabelled samples by name."""
    response = httpx.get(f"http://{broker_host(broker_id)}:{METRICS_PORTS[broker_id]}/metrics", timeout=10)
    response.raise_for_status()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if not sample.labels
    }


def until(broker_id: int, check: Callable[[dict[str, float]], bool], what: str) -> dict[str, float]:
    deadline = time.monotonic() + DEADLINE
    while True:
        current = scrape(broker_id)
        if check(current):
            return current
        if time.monotonic() > deadline:
            shown = {name: value for name, value in current.items() if "replicamanager" in name}
            pytest.fail(f"not within {DEADLINE:g} s on broker {broker_id}: {what} ({shown})")
        time.sleep(0.2)


URP = "kafka_server_replicamanager_underreplicatedpartitions"
SHRINKS = "kafka_server_replicamanager_isrshrinks_total"
EXPANDS = "kafka_server_replicamanager_isrexpands_total"


def test_a_stopped_follower_shows_as_under_replication_until_it_rejoins(cluster: Cluster) -> None:
    topic = "metrics-urp"
    cluster.create_topic(topic, assignments={0: [1, 2, 3]})
    cluster.wait_for_full_isr(topic, [0])
    leader = cluster.wait_for_leader(topic, 0).leader
    controller = cluster.controller_id()
    follower = next(n for n in (3, 2, 1) if n not in (leader, controller))
    before = until(leader, lambda s: s[URP] == 0, "a full ISR everywhere")
    assert before["kafka_server_replicamanager_leadercount"] >= 1
    assert cluster.stop_broker(follower) == 0
    shrunk = until(leader, lambda s: s[URP] >= 1 and s[SHRINKS] > before[SHRINKS], "URP and a shrink")
    assert follower not in (cluster.partition_state(topic, 0) or pytest.fail("no state")).isr
    cluster.start_broker(follower)
    cluster.wait_for_full_isr(topic, [0])
    until(leader, lambda s: s[URP] == 0 and s[EXPANDS] > shrunk[EXPANDS], "URP 0 and an expansion")
