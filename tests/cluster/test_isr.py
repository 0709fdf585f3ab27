"""ISR shrink and expand: a follower frozen (SIGSTOP) past replica.lag.time.max.ms leaves the ISR
through its leader; acks=all goes on with the two left (min.insync.replicas 2); thawed (SIGCONT),
it catches up and rejoins; nothing acknowledged is lost.

The ZooKeeper session here outlasts the freeze, so the follower stays registered and it is the
leader's lag check that shrinks the ISR, not the controller reacting to a dead broker.
"""

from __future__ import annotations

import time

import pytest

from cluster_harness import Cluster
from cluster_workload import KeyedProducer, TailingConsumer, check_delivery

pytestmark = pytest.mark.cluster

SESSION_TIMEOUT_MS = 8000
LAG_MS = 1500
CLUSTER = {
    "overrides": {
        "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
        "replica.lag.time.max.ms": str(LAG_MS),
    }
}


def test_frozen_follower_leaves_the_isr_and_rejoins(cluster: Cluster) -> None:
    topic = "isr-shrink"
    cluster.create_topic(topic, assignments={0: [1, 2, 3]}, configs={"min.insync.replicas": "2"})
    cluster.wait_for_full_isr(topic, [0])
    leader = cluster.wait_for_leader(topic, 0).leader
    controller = cluster.controller_id()
    # A follower that is not the controller: freezing the controller would test something else.
    follower = next(n for n in (3, 2, 1) if n not in (leader, controller))
    with TailingConsumer(cluster.bootstrap, topic, partitions=1) as consumer:
        with KeyedProducer("confluent", cluster.bootstrap, topic, partitions=1, keys=3) as producer:
            producer.wait_for_progress(cluster, records=20, timeout=30)
            before = cluster.partition_state(topic, 0)
            assert before is not None
            cluster.pause(follower)
            frozen_at = time.monotonic()
            shrunk = cluster.wait_for_isr(topic, 0, 2, timeout=LAG_MS / 1000 * 2 + 3)
            # The lag check (every lag/2) removes it between lag and 1.5 x lag after its last fetch.
            assert time.monotonic() - frozen_at >= LAG_MS / 1000 * 0.9
            assert follower not in shrunk.isr and shrunk.leader == leader
            assert shrunk.partition_epoch > before.partition_epoch  # a conditional write by the leader
            assert follower in cluster.registered_brokers()  # still alive as far as ZooKeeper knows
            producer.wait_for_progress(cluster, records=20)  # acks=all with ISR 2 = min.insync 2
            cluster.resume(follower)
            grown = cluster.wait_for_isr(topic, 0, 3)
            assert follower in grown.isr and grown.leader == leader
            assert grown.leader_epoch == before.leader_epoch  # ISR changes keep the leader epoch
            producer.wait_for_progress(cluster, records=20)
        consumer.wait_for(cluster, producer.acked)
    assert producer.failed == []
    check_delivery(producer.acked, consumer.records)
    metadata = cluster.metadata(topic, via=leader).partition(topic, 0)
    assert sorted(metadata.isr) == [1, 2, 3]
