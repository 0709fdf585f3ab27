"""Truncation (KIP-101, KIP-279, KIP-320): an acks=1 leader appends records its followers never
fetched and is cut off (SIGSTOP) until the controller replaces it; the new leader takes other
records at the same offsets; when the old leader comes back it truncates its unreplicated suffix
and copies the new leader's log, so no offset holds two values on any replica. A consumer whose
position came from the old leader's log (offset and leader epoch) is told of the truncation.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as CKPartition
from kio.schema.errors import ErrorCode

from cluster import Cluster
from kafka_wire import LATEST, KafkaWire
from strom.records.batch import InvalidBatchError
from strom.records.codec import RecordSpec, decode_batches, encode_batch

pytestmark = pytest.mark.cluster

TOPIC = "truncation"
# The followers' freeze must not cost them the ISR (the new leader comes from it).
CLUSTER = {"overrides": {"replica.lag.time.max.ms": "5000"}}
# Longer than replica.fetch.wait.max.ms: a fetch a follower sent before its freeze is answered
# (empty) before the orphans arrive, so no copy of them sits in a frozen follower's socket.
FETCH_DRAIN_S = 0.5


def batch(*values: bytes) -> bytes:
    return encode_batch([RecordSpec(key=None, value=v) for v in values])


def replica_log(cluster: Cluster, broker_id: int) -> dict[int, bytes | None]:
    """offset -> value in broker ``broker_id``'s copy of the partition, read from its segments."""
    folder = Path(cluster.broker(broker_id).data_dir) / f"{TOPIC}-0"
    records: dict[int, bytes | None] = {}
    for segment in sorted(folder.glob("*.log")):
        try:
            batches = decode_batches(segment.read_bytes())
        except InvalidBatchError:  # a batch half written as we read: look again later
            return {}
        for record_batch in batches:
            for record in record_batch.records:
                records[record.offset] = record.value
    return records


def test_old_leader_truncates_what_it_alone_had(cluster: Cluster) -> None:
    controller = cluster.controller_id()
    # The old leader is not the controller: its freeze must only cost the partition its leader.
    leader = next(n for n in (1, 2, 3) if n != controller)
    followers = [n for n in (1, 2, 3) if n != leader]
    cluster.create_topic(TOPIC, assignments={0: [leader, *followers]}, configs={"min.insync.replicas": "1"})
    cluster.wait_for_full_isr(TOPIC, [0])
    assert cluster.wait_for_leader(TOPIC, 0).leader == leader
    committed = [f"committed-{i}".encode() for i in range(5)]
    with KafkaWire.connect(cluster.address(leader)) as wire:
        assert wire.produce(TOPIC, batch(*committed), acks=-1).error_code == ErrorCode.none
    old_epoch = cluster.partition_state(TOPIC, 0).leader_epoch  # type: ignore[union-attr]

    # Followers frozen for well under replica.lag.time.max.ms: the ISR stays whole, yet they never
    # fetch what the leader takes now (no fetch of theirs is outstanding: FETCH_DRAIN_S).
    for n in followers:
        cluster.pause(n)
    time.sleep(FETCH_DRAIN_S)
    try:
        with KafkaWire.connect(cluster.address(leader)) as wire:
            orphan = wire.produce(TOPIC, batch(b"orphan-0", b"orphan-1", b"orphan-2"), acks=1)
        assert orphan.error_code == ErrorCode.none and orphan.base_offset == 5
        cluster.pause(leader)  # cut off until replaced
    finally:
        for n in followers:
            cluster.resume(n)

    new = cluster.wait_for_leader(TOPIC, 0, exclude={leader}, min_epoch=old_epoch + 1)
    assert new.leader in followers
    fresh = [f"fresh-{i}".encode() for i in range(4)]
    with KafkaWire.connect(cluster.address(new.leader)) as wire:
        written = wire.produce(TOPIC, batch(*fresh), acks=-1)
        assert written.error_code == ErrorCode.none
        assert written.base_offset == 5  # the orphans were never committed: their offsets are reused
    frozen_for = time.monotonic()
    cluster.resume(leader)
    cluster.wait_for_isr(TOPIC, 0, 3)
    assert time.monotonic() - frozen_for < 30

    expected = dict(enumerate([*committed, *fresh]))
    for n in (1, 2, 3):
        cluster.wait_for(
            lambda n=n: replica_log(cluster, n) == expected, f"broker {n}'s log equal to the leader's"
        )
    with KafkaWire.connect(cluster.address(new.leader)) as wire:
        assert wire.list_offset(TOPIC, LATEST) == len(expected)

    # KIP-320: a position taken from the old leader's log (offset 8 in the old epoch) lies past
    # where that epoch ends on the new leader (offset 5): the consumer reports log truncation.
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "truncation-check",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    try:
        consumer.assign([CKPartition(TOPIC, 0, 8, leader_epoch=old_epoch)])
        errors: list[KafkaError] = []
        deadline = time.monotonic() + 15
        while not errors and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is not None:
                errors.append(msg.error())
        assert errors, "no truncation reported"
        assert errors[0].code() in (KafkaError._LOG_TRUNCATION, KafkaError._AUTO_OFFSET_RESET), errors
        assert "truncat" in errors[0].str().lower(), errors
    finally:
        consumer.close()
