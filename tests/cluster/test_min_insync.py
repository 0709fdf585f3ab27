"""min.insync.replicas with two of three replicas down: acks=all is refused with
NOT_ENOUGH_REPLICAS before anything is appended, acks=1 is appended, and the high watermark does
not move while the ISR is below min.insync (Kafka 4.x, KIP-966); once the replicas are back the
HW catches up and acks=all works again."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from cluster_harness import Cluster
from kafka_wire import LATEST, KafkaWire
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
