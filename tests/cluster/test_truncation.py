"""Truncation (KIP-101, KIP-279, KIP-320): an acks=1 leader appends records its followers never
fetched and is cut off until the controller replaces it; the new leader takes other records at
the same offsets; when the old leader comes back it truncates its unreplicated suffix and copies
the new leader's log, so no offset holds two values on any replica. A consumer whose position
came from the old leader's log (offset and leader epoch) is told of the truncation.

Two ways to cut the leader off: frozen (SIGSTOP), or partitioned from ZooKeeper (its proxy
blackholed) while it keeps running and clients still reach it. Partitioned, it goes on believing
it leads, as a Kafka leader cut off ZooKeeper does: it takes acks=1 writes the followers (gone
to the new leader) never fetch, and an acks=all write there can never succeed, for its ISR
shrink cannot be written. Healed, it finds its session expired, registers again, and follows.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as CKPartition
from kio.schema.errors import ErrorCode

from cluster_harness import RECOVERY_TIMEOUT, Cluster
from kafka_wire import LATEST, KafkaWire
from strom.client import Consumer as StromConsumer
from strom.client import OffsetAndMetadata, TopicPartition
from strom.client.consumer import LogTruncationError
from strom.records.codec import RecordSpec, encode_batch

pytestmark = pytest.mark.cluster

TOPIC = "truncation"
# The followers' freeze must not cost them the ISR (the new leader comes from it). Each broker
# reaches ZooKeeper through a proxy, to be cut off it.
CLUSTER = {"zookeeper_proxies": True, "overrides": {"replica.lag.time.max.ms": "5000"}}
# Longer than replica.fetch.wait.max.ms: a fetch a follower sent before its freeze is answered
# (empty) before the orphans arrive, so no copy of them sits in a frozen follower's socket.
FETCH_DRAIN_S = 0.5


def batch(*values: bytes) -> bytes:
    return encode_batch([RecordSpec(key=None, value=v) for v in values])


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
            lambda n=n: cluster.replica_log(n, TOPIC) == expected, f"broker {n}'s log equal to the leader's"
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


def test_leader_partitioned_from_zookeeper_truncates_its_acks1_writes(cluster: Cluster) -> None:
    topic = "truncation-net"
    controller = cluster.controller_id()
    # Not the controller: its partition from ZooKeeper must only cost the partition its leader.
    leader = next(n for n in (1, 2, 3) if n != controller)
    followers = [n for n in (1, 2, 3) if n != leader]
    cluster.create_topic(topic, assignments={0: [leader, *followers]}, configs={"min.insync.replicas": "2"})
    cluster.wait_for_full_isr(topic, [0])
    assert cluster.wait_for_leader(topic, 0).leader == leader
    committed = [f"committed-{i}".encode() for i in range(5)]
    with KafkaWire.connect(cluster.address(leader)) as wire:
        assert wire.produce(topic, batch(*committed), acks=-1).error_code == ErrorCode.none
    old_epoch = cluster.partition_state(topic, 0).leader_epoch  # type: ignore[union-attr]
    old_broker_epoch = cluster.broker_epoch(leader)

    cluster.cut_zookeeper(leader)
    try:
        # Its session expires; the controller moves the leadership to a follower.
        new = cluster.wait_for_leader(topic, 0, exclude={leader}, min_epoch=old_epoch + 1)
        assert new.leader in followers
        # Both followers follow the new leader before the old one takes writes, so they never
        # fetch those (a follower still fetching from it would truncate them later just the same).
        for n in followers:
            cluster.wait_for(
                lambda n=n: (
                    cluster.metadata(topic, via=n).partition(topic, 0).leader_epoch >= new.leader_epoch
                ),
                f"broker {n} following the new leader",
            )
        with KafkaWire.connect(cluster.address(leader)) as wire:
            # It still believes it leads in the old epoch: acks=1 is appended and acknowledged...
            assert cluster.metadata(topic, via=leader).partition(topic, 0).leader == leader
            orphan = wire.produce(topic, batch(b"orphan-0", b"orphan-1", b"orphan-2"), acks=1)
            assert orphan.error_code == ErrorCode.none and orphan.base_offset == 5
            # ... but acks=all never succeeds: the followers are gone, its ISR cannot shrink.
            stuck = wire.produce(topic, batch(b"never-acknowledged"), acks=-1)
            assert stuck.error_code != ErrorCode.none, stuck
        fresh = [f"fresh-{i}".encode() for i in range(4)]
        with KafkaWire.connect(cluster.address(new.leader)) as wire:
            written = wire.produce(topic, batch(*fresh), acks=-1)
            assert written.error_code == ErrorCode.none
            assert written.base_offset == 5  # the orphans were never committed: their offsets are reused
    finally:
        cluster.heal_zookeeper(leader)

    # Healed: a new session and registration, then it follows, truncates and rejoins the ISR.
    cluster.wait_for_registered([leader], timeout=RECOVERY_TIMEOUT)
    assert cluster.broker_epoch(leader) != old_broker_epoch
    cluster.wait_for_isr(topic, 0, 3)
    assert cluster.broker(leader).running
    expected = dict(enumerate([*committed, *fresh]))
    for n in (1, 2, 3):
        cluster.wait_for(
            lambda n=n: cluster.replica_log(n, topic) == expected, f"broker {n}'s log equal to the leader's"
        )

    # KIP-320 with Strom's own client: a position in the old epoch past where that epoch ends on
    # the new leader -- what a consumer holds after reading the old leader's records at 5..8 --
    # is reported as a truncation at offset 5 (auto.offset.reset=none), not silently skipped.
    tp = TopicPartition(topic, 0)
    settings = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": "truncation-net-check",
        "enable.auto.commit": False,
        "request.timeout.ms": 5_000,
        "retry.backoff.ms": 50,
    }
    with StromConsumer(settings) as consumer:
        consumer.assign([tp])
        consumer.commit_sync({tp: OffsetAndMetadata(9, "", old_epoch)})
    with StromConsumer({**settings, "auto.offset.reset": "none"}) as consumer:
        consumer.assign([tp])
        with pytest.raises(LogTruncationError) as raised:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                consumer.poll(0.5)
        assert raised.value.divergent_offsets[tp].offset == 5
        assert raised.value.divergent_offsets[tp].leader_epoch == old_epoch
