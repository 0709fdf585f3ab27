"""min.insync.replicas with two of three replicas down: acks=all is refused with
NOT_ENOUGH_REPLICAS before anything is appended, acks=1 is appended, and the high watermark does
not move while the ISR is below min.insync (Kafka 4.x, KIP-966); once the replicas are back the
HW catches up and acks=all works again."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from cluster_harness import Cluster
from kafka_wire import LATEST, KafkaWire, produce_request
from strom.records.codec import RecordSpec, encode_batch

pytestmark = pytest.mark.cluster

TOPIC = "min-insync"


def batch(value: bytes) -> bytes:
    return encode_batch([RecordSpec(key=None, value=value)])


def test_two_replicas_down(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, assignments={0: [1, 2, 3]}, configs={"min.insync.replicas": "2"})
    cluster.wait_for_full_isr(TOPIC, [0])
    leader = cluster.wait_for_leader(TOPIC, 0).leader
    others = [n for n in (1, 2, 3) if n != leader]
    with KafkaWire.connect(cluster.address(leader)) as wire:
        assert wire.produce(TOPIC, batch(b"committed"), acks=-1).error_code == ErrorCode.none
        hw = wire.list_offset(TOPIC, LATEST)
        assert hw == 1
    for n in others:
        cluster.stop_broker(n)
    state = cluster.wait_for_isr(TOPIC, 0, 1)
    assert state.leader == leader and state.isr == (leader,)
    with KafkaWire.connect(cluster.address(leader)) as wire:
        refused = wire.produce(TOPIC, batch(b"refused"), acks=-1)
        assert refused.error_code == ErrorCode.not_enough_replicas
        accepted = wire.produce(TOPIC, batch(b"acks-1"), acks=1)
        assert (
            accepted.error_code == ErrorCode.none and accepted.base_offset == 1
        )  # nothing was appended before
        assert wire.list_offset(TOPIC, LATEST) == hw  # the HW stays: the ISR is below min.insync
        # A consumer reads up to the HW only: the acks=1 record is not visible yet.
        assert wire.fetch(TOPIC, 0, max_wait_ms=0).high_watermark == hw
    for n in others:
        cluster.start_broker(n)
    cluster.wait_for_isr(TOPIC, 0, 3)
    with KafkaWire.connect(cluster.address(leader)) as wire:
        cluster.wait_for(lambda: wire.list_offset(TOPIC, LATEST) == 2, "the HW past the acks=1 record")
        assert wire.produce(TOPIC, batch(b"again"), acks=-1).error_code == ErrorCode.none
        assert wire.list_offset(TOPIC, LATEST) == 3


def test_requests_behind_a_waiting_acks_all_produce_are_served_and_answered_in_order(cluster: Cluster) -> None:
    """An acks=all produce waiting for its followers does not hold back the connection's next
    requests (librdkafka sends one produce request per partition): they are appended meanwhile,
    and the answers still come in request order."""
    topic = "pipelined"
    cluster.create_topic(topic, assignments={0: [1, 2, 3], 1: [1, 2, 3]}, configs={"min.insync.replicas": "2"})
    cluster.wait_for_full_isr(topic, [0, 1])
    assert cluster.wait_for_leader(topic, 0).leader == cluster.wait_for_leader(topic, 1).leader == 1
    with KafkaWire.connect(cluster.address(1)) as wire:
        for n in (2, 3):
            cluster.pause(n)  # briefly: well within replica.lag.time.max.ms and the ZooKeeper session
        try:
            waiting = produce_request(topic, {0: batch(b"waits")}, acks=-1)
            behind = produce_request(topic, {1: batch(b"behind")}, acks=1)
            first, second = wire.send(waiting), wire.send(behind)
            cluster.wait_for(
                lambda: cluster.replica_log(1, topic, 1) == {0: b"behind"},
                "the produce behind the waiting one appended",
                timeout=5,
            )
        finally:
            for n in (2, 3):
                cluster.resume(n)
        answered = wire.receive(type(waiting), first)  # receive checks the correlation id: in order
        assert answered.responses[0].partition_responses[0].error_code == ErrorCode.none
        answered = wire.receive(type(behind), second)
        assert answered.responses[0].partition_responses[0].error_code == ErrorCode.none
