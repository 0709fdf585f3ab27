"""Strom's own client across a leader failover, on a real cluster (tests/cluster_harness.py).

An idempotent ``acks=all`` producer and a consumer run while the leader of the partition is
killed: every acknowledged record is consumed once, in order, and leader epochs only grow.
A committed position in an epoch that the new leader's log ends below is a truncation that
a KIP-320 consumer reports (``auto.offset.reset=none``) or resets to the divergent offset.
"""

from __future__ import annotations

import threading
import time

import pytest

from cluster_harness import RECOVERY_TIMEOUT, Cluster
from strom.client import Consumer, OffsetAndMetadata, Producer, TopicPartition
from strom.client.consumer import LogTruncationError

pytestmark = pytest.mark.cluster

CLUSTER = {"brokers": 3}
# Short client timeouts: the leader's death is seen within the session timeout plus a few seconds.
CLIENT = {"retry.backoff.ms": 50, "retry.backoff.max.ms": 500, "reconnect.backoff.max.ms": 500}


def producer(cluster: Cluster, **extra: object) -> Producer:
    return Producer(
        {
            **CLIENT,
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "delivery.timeout.ms": 60_000,
            "request.timeout.ms": 5_000,
            **extra,
        }
    )


def consumer(cluster: Cluster, **extra: object) -> Consumer:
    return Consumer(
        {
            **CLIENT,
            "bootstrap.servers": cluster.bootstrap,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.wait.ms": 100,
            "request.timeout.ms": 5_000,
            **extra,
        }
    )


def test_no_acknowledged_record_is_lost_or_duplicated_when_the_leader_dies(cluster: Cluster) -> None:
    topic = "client-failover"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    cluster.wait_for_full_isr(topic, [0])
    before = cluster.wait_for_leader(topic, 0)
    tp = TopicPartition(topic, 0)

    acked: list[int] = []
    failed: list[BaseException] = []
    stop = threading.Event()
    # Set once the producer has returned: every acknowledgement is in ``acked`` by then.
    produced = threading.Event()

    def produce() -> None:
        try:
            with producer(cluster) as p:
                n = 0
                while not stop.is_set():
                    futures = [(i, p.send(topic, str(i).encode(), partition=0)) for i in range(n, n + 20)]
                    for i, future in futures:
                        try:
                            future.get(60)
                            acked.append(i)
                        except Exception as exc:  # reported below: none may fail
                            failed.append(exc)
                    n += 20
        finally:
            produced.set()

    seen: list[int] = []
    epochs: list[int] = []

    def consume() -> None:
        with consumer(cluster) as c:
            c.assign([tp])
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not (produced.is_set() and len(seen) >= len(acked)):
                for record in c.poll(0.5):
                    seen.append(int(record.value))
                    if record.leader_epoch is not None:
                        epochs.append(record.leader_epoch)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    try:
        cluster.wait_for(lambda: len(acked) >= 200, "records acknowledged before the failover", 30)
        cluster.kill(before.leader)
        after = cluster.wait_for_leader(topic, 0, exclude=[before.leader], min_epoch=before.leader_epoch + 1)
        written = len(acked)
        cluster.wait_for(
            lambda: len(acked) >= written + 200, "records acknowledged by the new leader", RECOVERY_TIMEOUT
        )
        cluster.start_broker(before.leader)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert not failed, failed[:3]
    assert after.leader_epoch > before.leader_epoch
    assert len(seen) == len(set(seen)), "a record was consumed twice"
    assert seen == sorted(seen), "records out of order"
    missing = set(acked) - set(seen)
    assert not missing, f"{len(missing)} acknowledged records were not consumed, e.g. {sorted(missing)[:5]}"
    assert epochs == sorted(epochs), "leader epochs went back"


def test_a_position_beyond_its_epochs_end_is_reported_as_truncation(cluster: Cluster) -> None:
    """A position committed in epoch E at an offset past where the new leader's log ends E is
    what a consumer that read records later truncated away holds: KIP-320 validation finds it."""
    topic = "client-truncation"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    cluster.wait_for_full_isr(topic, [0])
    tp = TopicPartition(topic, 0)
    before = cluster.wait_for_leader(topic, 0)
    with producer(cluster) as p:
        for i in range(50):
            p.send(topic, b"old-%d" % i, partition=0)
        p.flush(30)
        cluster.kill(before.leader)
        cluster.wait_for_leader(topic, 0, exclude=[before.leader], min_epoch=before.leader_epoch + 1)
        for i in range(50):
            p.send(topic, b"new-%d" % i, partition=0)
        p.flush(60)
    cluster.start_broker(before.leader)

    group = "truncation-group"
    with consumer(cluster, **{"group.id": group}) as c:
        c.assign([tp])
        # Offsets 50..69 as if read in the old epoch from a leader that lost them.
        c.commit_sync({tp: OffsetAndMetadata(70, "", before.leader_epoch)})

    with consumer(cluster, **{"group.id": group, "auto.offset.reset": "none"}) as c:
        c.assign([tp])
        with pytest.raises(LogTruncationError) as raised:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                c.poll(0.5)
        assert raised.value.divergent_offsets[tp].offset == 50
        assert raised.value.divergent_offsets[tp].leader_epoch == before.leader_epoch

    with consumer(cluster, **{"group.id": group, "auto.offset.reset": "earliest"}) as c:
        c.assign([tp])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 50 and time.monotonic() < deadline:
            values += [r.value for r in c.poll(0.5)]
        # Reset to the diverging offset: the new leader's records from there on.
        assert values[:1] == [b"new-0"]
