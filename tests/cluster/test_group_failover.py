"""Consumer groups across a coordinator failover: the broker leading the group's
__consumer_offsets partition is killed (SIGKILL) while a 3-member group consumes and commits.
The coordinator moves to the partition's new leader, which loads the group's offsets; no
committed offset ever goes backwards, and every record is consumed (nothing skipped; a record
may be consumed twice, as at-least-once allows)."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, KafkaException
from kio.schema.errors import ErrorCode

from cluster_harness import RECOVERY_TIMEOUT, Cluster
from cluster_workload import KeyedProducer
from kafka_wire import GroupWire
from strom.broker.coordinator.group_metadata_manager import partition_for

pytestmark = pytest.mark.cluster

TOPIC = "group-failover"
GROUP = "failover-group"
OFFSETS_PARTITIONS = 5  # offsets.topic.num.partitions of the test cluster
RECORDS = 1500


class Member(threading.Thread):
    """A group member that consumes slowly and commits after every batch."""

    def __init__(self, bootstrap: str, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.consumed: list[tuple[int, int]] = []
        self.commit_errors = 0
        self.halt = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe([TOPIC])
        while not self.halt.is_set():
            msgs = [m for m in self.consumer.consume(10, 0.5) if m.error() is None]
            self.consumed += [(m.partition(), m.offset()) for m in msgs]
            if msgs:
                try:
                    self.consumer.commit(asynchronous=False)
                except KafkaException:
                    self.commit_errors += 1  # the coordinator is moving; the next commit covers it
            self.halt.wait(0.2)
        self.consumer.close()


def committed_offsets(cluster: Cluster) -> dict[int, int] | None:
    """The group's committed offsets, from its coordinator; None while the coordinator moves.

    Asked over the wire: librdkafka 2.16's AdminClient crashes the process (a null consumer-group
    handle in rd_kafka_handle_OffsetFetch) when ListConsumerGroupOffsets meets NOT_COORDINATOR,
    which a coordinator move answers, from Kafka as from Strom."""
    try:
        node = coordinator(cluster, via=cluster.live_ids()[0])
        if node is None:
            return None
        with GroupWire.connect(cluster.address(node)) as wire:
            group = wire.offset_fetch({GROUP: None}).groups[0]
    except OSError:
        return None
    if group.error_code != ErrorCode.none:
        return None
    return {
        p.partition_index: p.committed_offset
        for topic in group.topics
        if topic.name == TOPIC
        for p in topic.partitions
        if p.error_code == ErrorCode.none and p.committed_offset >= 0
    }


def coordinator(cluster: Cluster, via: int) -> int | None:
    with GroupWire.connect(cluster.address(via)) as wire:
        found = wire.find_coordinator(GROUP).coordinators[0]
    return found.node_id if found.error_code == ErrorCode.none else None


def test_group_survives_the_loss_of_its_coordinator(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, partitions=3, replication_factor=3)
    with KeyedProducer("confluent", cluster.bootstrap, TOPIC, rate=5000) as producer:
        cluster.wait_for(lambda: producer.count() >= RECORDS, f"{RECORDS} records produced", 60)
    assert producer.failed == []
    produced = {(r.partition, r.offset) for r in producer.acked}

    members = [Member(cluster.bootstrap, f"member-{i}") for i in range(3)]
    history: list[dict[int, int]] = []
    try:
        for member in members:
            member.start()
        offsets_partition = partition_for(GROUP, OFFSETS_PARTITIONS)

        def sample() -> dict[int, int]:
            """The group's committed offsets now, kept in ``history`` (none while the coordinator
            moves; that sample is skipped)."""
            offsets = committed_offsets(cluster)
            if offsets is None:
                return {}
            history.append(offsets)
            return offsets

        cluster.wait_for(lambda: sum(sample().values()) >= 200, "the group committed 200 records", 60)
        victim = cluster.wait_for_leader("__consumer_offsets", offsets_partition).leader
        assert coordinator(cluster, via=victim) == victim  # FindCoordinator names the partition's leader
        cluster.kill(victim)
        survivor = next(n for n in cluster.live_ids() if n != victim)
        moved = cluster.wait_for(
            lambda: (c := coordinator(cluster, via=survivor)) not in (None, victim) and c,
            "the coordinator moved",
            RECOVERY_TIMEOUT,
        )
        assert (
            moved == cluster.wait_for_leader("__consumer_offsets", offsets_partition, exclude={victim}).leader
        )

        ends: dict[int, int] = {}
        for p, o in produced:
            ends[p] = max(ends.get(p, 0), o + 1)
        cluster.wait_for(lambda: sample() == ends, "every record committed by the group", 60)
    finally:
        for member in members:
            member.halt.set()
        for member in members:
            member.join(30)
    consumed = {record for member in members for record in member.consumed}
    assert produced <= consumed, f"skipped: {sorted(produced - consumed)[:10]}"
    last: dict[int, int] = {}
    for snapshot in history:
        for p, offset in snapshot.items():
            assert offset >= last.get(p, 0), (
                f"partition {p}: committed offset went from {last[p]} to {offset}"
            )
            last[p] = offset
