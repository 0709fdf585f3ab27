"""A topic grown to a few thousand partitions on three brokers (issue 18): a broker told to stop
(SIGTERM) while it applies those leaderships stops, and back it serves every partition and
rejoins every ISR. On main the brokers spent minutes on one DataWatch per partition state
(each event rebuilding the whole topic) and ignored SIGTERM meanwhile. The deadlines here are
generous bounds for a shared machine, not the speed targets (bench/ measures those)."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewPartitions

from cluster_harness import Cluster

TOPIC = "grown"
PARTITIONS = 1500
# Ample for a loaded 2-core machine; main stayed wedged far longer.
DEADLINE_S = 240.0


def led_everywhere(cluster: Cluster, via: int) -> bool:
    try:
        metadata = cluster.metadata(TOPIC, via=via, timeout=10)
    except (ConnectionError, OSError):
        return False
    led = [p for (t, _), p in metadata.partitions.items() if t == TOPIC and p.leader >= 0]
    return len(led) == PARTITIONS


def every_isr_holds(cluster: Cluster, broker_id: int) -> bool:
    states = [cluster.partition_state(TOPIC, p) for p in range(PARTITIONS)]
    return all(s is not None and broker_id in s.isr for s in states)


def test_a_broker_stops_while_applying_thousands_of_leaderships_and_comes_back(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, partitions=1)
    controller = cluster.wait_for_controller()
    leaving = next(n for n in (1, 2, 3) if n != controller)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_partitions([NewPartitions(TOPIC, PARTITIONS)], request_timeout=DEADLINE_S)
    # The controller writes the new states; the leaving broker starts hosting them.
    cluster.wait_for(
        lambda: cluster.partition_state(TOPIC, PARTITIONS - 1), "the last partition's state", DEADLINE_S
    )
    # SIGTERM while it applies them (a stop past the deadline fails with the broker's log).
    assert cluster.stop_broker(leaving, timeout=DEADLINE_S) == 0, cluster.broker(leaving).log_tail()

    cluster.start_broker(leaving)
    cluster.wait_for(lambda: led_everywhere(cluster, leaving), "the restarted broker serves", DEADLINE_S)
    cluster.wait_for(
        lambda: every_isr_holds(cluster, leaving), "it is back in every ISR", DEADLINE_S, interval=1.0
    )
