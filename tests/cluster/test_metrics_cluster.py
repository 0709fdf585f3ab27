"""Under-replication on the leader's /metrics: a follower stopped shows as an under-replicated
partition and an ISR shrink; started again, it rejoins (an ISR expansion) and the count goes back
to 0. Three brokers, each with metrics.listener set, scraped over HTTP."""

from __future__ import annotations

import pytest

from brokerproc import free_port
from cluster_harness import Cluster, broker_host
from metrics_scrape import Metrics

pytestmark = pytest.mark.cluster

METRICS_PORTS = {n: free_port(broker_host(n)) for n in (1, 2, 3)}
CLUSTER = {
    "broker_overrides": {
        n: {"metrics.listener": f"http://{broker_host(n)}:{port}"} for n, port in METRICS_PORTS.items()
    }
}
METRICS = {n: Metrics(f"http://{broker_host(n)}:{port}/metrics") for n, port in METRICS_PORTS.items()}

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
    metrics = METRICS[leader]
    before = metrics.until(lambda s: s.get(URP) == 0, "a full ISR everywhere", show="replicamanager")
    assert before.get_or_zero("kafka_server_replicamanager_leadercount") >= 1
    assert cluster.stop_broker(follower) == 0
    shrunk = metrics.until(
        lambda s: s.get_or_zero(URP) >= 1 and s.get_or_zero(SHRINKS) > before.get_or_zero(SHRINKS),
        "URP and a shrink",
        show="replicamanager",
    )
    assert follower not in (cluster.partition_state(topic, 0) or pytest.fail("no state")).isr
    cluster.start_broker(follower)
    cluster.wait_for_full_isr(topic, [0])
    metrics.until(
        lambda s: s.get(URP) == 0 and s.get_or_zero(EXPANDS) > shrunk.get_or_zero(EXPANDS),
        "URP 0 and an expansion",
        show="replicamanager",
    )
