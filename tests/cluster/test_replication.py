"""Kafka's replication_test, ported: 3 brokers, RF 3, min.insync.replicas 2, 3 partitions.

An idempotent acks=all producer and a consumer run throughout while the leader of partition 0
is killed (SIGKILL), stopped (SIGTERM) and bounced, then the same for the controller. Pass:
every acknowledged record is consumed, none is in the log twice, each key's order is kept,
leader epochs only increase, and each outage heals (a new leader or controller, and the producer
acknowledging on every partition again) within the ZooKeeper session timeout plus 10 s.

Five bounces per target, as Kafka; the module takes about two minutes for its three
producers on two cores.
"""

from __future__ import annotations

import pytest

from cluster_harness import RECOVERY_TIMEOUT, Cluster
from cluster_workload import (
    PRODUCER_CLIENTS,
    EpochWatcher,
    KeyedProducer,
    ProducerClient,
    TailingConsumer,
    check_delivery,
)

pytestmark = pytest.mark.cluster

BOUNCES = 5
FAULTS = ("kill", "stop", *["bounce"] * BOUNCES)


def victim(cluster: Cluster, target: str, topic: str) -> int:
    if target == "leader":
        return cluster.wait_for_leader(topic, 0).leader
    return cluster.wait_for_controller()


def inject(
    cluster: Cluster, target: str, fault: str, broker: int, topic: str, producer: KeyedProducer
) -> None:
    """One outage of ``broker`` and its recovery, each step within the recovery timeout."""
    if fault == "bounce":
        cluster.restart(broker)  # SIGTERM, then start at once
    elif fault == "kill":
        cluster.kill(broker)
    else:
        assert cluster.stop_broker(broker) == 0, cluster.broker(broker).log_tail()
    if fault != "bounce":
        # While it is down: someone else takes over and the producer goes on.
        if target == "leader":
            cluster.wait_for_leader(topic, 0, exclude={broker}, timeout=RECOVERY_TIMEOUT)
        else:
            cluster.wait_for_controller(exclude={broker}, timeout=RECOVERY_TIMEOUT)
        producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
        cluster.start_broker(broker)
    cluster.wait_for_registered([broker])
    producer.wait_for_progress(cluster, timeout=RECOVERY_TIMEOUT)
    # The next fault starts from a whole cluster: every replica back in sync.
    cluster.wait_for_full_isr(topic, range(3), timeout=RECOVERY_TIMEOUT)


@pytest.mark.parametrize("client", PRODUCER_CLIENTS)
def test_replication_under_leader_and_controller_failures(cluster: Cluster, client: ProducerClient) -> None:
    topic = f"replication-{client}"
    cluster.create_topic(topic, partitions=3, replication_factor=3, configs={"min.insync.replicas": "2"})
    cluster.wait_for_full_isr(topic, range(3))
    with EpochWatcher(cluster, topic) as epochs, TailingConsumer(cluster.bootstrap, topic) as consumer:
        with KeyedProducer(client, cluster.bootstrap, topic) as producer:
            producer.wait_for_progress(cluster, records=20, timeout=30)
            for target in ("leader", "controller"):
                for fault in FAULTS:
                    inject(cluster, target, fault, victim(cluster, target, topic), topic, producer)
        # The consumer that ran throughout gets everything that was acknowledged.
        consumer.wait_for(cluster, producer.acked)
    assert producer.failed == [], producer.failed[:5]
    assert len(producer.acked) > 100
    check_delivery(producer.acked, consumer.records)
    epochs.check()
