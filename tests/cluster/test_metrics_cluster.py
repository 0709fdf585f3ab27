"""Under-replication on the leader's /metrics: a follower stopped shows as an under-replicated
partition and an ISR shrink; started again, it rejoins (an ISR expansion) and the count goes back
to 0. Three brokers, each with metrics.listener set, scraped over HTTP."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from brokerproc import free_port
from cluster_harness import Cluster, broker_host
from metrics_scrape import Metrics, Scrape

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


def test_followers_fetches_count_as_fetch_follower_and_replication_bytes(cluster: Cluster) -> None:
    """Kafka splits Fetch by who asks: on a leader, its followers' fetches count under
    FetchFollower (and Fetch), and the record bytes they copy as replication bytes out, not as a
    topic's bytes out to consumers."""
    topic = "metrics-follower-fetch"
    cluster.create_topic(topic, assignments={0: [1, 2, 3]})
    cluster.wait_for_full_isr(topic, [0])
    leader = cluster.wait_for_leader(topic, 0).leader
    metrics = METRICS[leader]
    before = metrics.scrape()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(20):
        producer.produce(topic, value=b"x" * 100, key=str(i).encode(), partition=0)
    assert producer.flush(30) == 0  # acks=all: both followers fetched every record
    requests = "kafka_network_requestmetrics_requests_total"

    def fetches(scrape: Scrape, request: str) -> float:
        """Requests of every version."""
        return sum(
            value
            for (name, labels), value in scrape.samples.items()
            if name == requests and ("request", request) in labels
        )

    after = metrics.until(
        lambda s: s.get_or_zero("kafka_server_brokertopicmetrics_replicationbytesout_total")
        > before.get_or_zero("kafka_server_brokertopicmetrics_replicationbytesout_total"),
        "replication bytes out",
        show="replicationbytesout",
    )
    followed = fetches(after, "FetchFollower") - fetches(before, "FetchFollower")
    assert followed > 0
    assert fetches(after, "Fetch") - fetches(before, "Fetch") >= followed
    assert after.get_or_zero("kafka_server_brokertopicmetrics_bytesout_total", topic=topic) == 0
