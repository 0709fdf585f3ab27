"""Only a broker's own replica fetcher counts as its follower (issue 17, item 1).

A Fetch names its replica (``replica_id``; from v15 ``replica_state`` with KIP-903's broker
epoch). A leader that believed any client claiming a follower's id would put a dead follower back
into the ISR (acks=all then acknowledged with one real copy), move the HW past what the real
followers hold, hand out uncommitted records and give the claimant a privileged fetch session.
Here raw wire clients pose as followers of a real 3-broker cluster: from another host, from the
follower's own address, with a stale broker epoch, and as a follower whose broker is dead. None of
them is served as a follower (NOT_LEADER_OR_FOLLOWER, no records, no session), the ISR and the HW
stay, acks=all stays refused; the real followers, once back, rejoin the ISR.
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v15 import request as fetch15

from cluster_harness import Cluster
from kafka_wire import LATEST, KafkaWire
from strom.broker.zk import znodes
from strom.cli.local_cluster import broker_host
from strom.records.codec import RecordSpec, encode_batch

pytestmark = pytest.mark.cluster

TOPIC = "replica-identity"
# How long a refused claim is watched for effects (the old leader expanded the ISR within 0.2 s).
WATCH_S = 3.0


def batch(value: bytes) -> bytes:
    return encode_batch([RecordSpec(key=None, value=value)])


def fetch_v12(replica_id: int, offset: int) -> Any:
    """A follower's Fetch v12 of partition 0 asking for a session (epoch 0)."""
    return fetch12.FetchRequest(
        replica_id=replica_id,
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        session_id=0,
        session_epoch=0,
        topics=(
            fetch12.FetchTopic(
                topic=TOPIC,
                partitions=(
                    fetch12.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def fetch_v15(replica_id: int, replica_epoch: int, topic_id: uuid.UUID, offset: int) -> Any:
    """A follower's Fetch v15 (the replica and its broker epoch in replica_state)."""
    return fetch15.FetchRequest(
        replica_state=fetch15.ReplicaState(replica_id=replica_id, replica_epoch=replica_epoch),
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        session_id=0,
        session_epoch=0,
        topics=(
            fetch15.FetchTopic(
                topic_id=topic_id,
                partitions=(
                    fetch15.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def assert_refused(response: Any) -> None:
    """Not served as a follower: no session, and the partition answered without records."""
    assert response.error_code == ErrorCode.none
    assert response.session_id == 0
    (data,) = response.responses[0].partitions
    assert data.error_code == ErrorCode.not_leader_or_follower, data
    assert not data.records


def wire_to(cluster: Cluster, leader: int, *, posing_as: int | None = None) -> KafkaWire:
    """A raw connection to ``leader``, from ``posing_as``'s address if given."""
    host, port = cluster.address(leader).split(":")
    local_host = broker_host(posing_as) if posing_as is not None else None
    return KafkaWire(host, int(port), local_host=local_host)


def topic_id(cluster: Cluster) -> uuid.UUID:
    data, _ = cluster.zk.get(znodes.topic_path(TOPIC))
    found = znodes.TopicZNode.decode(data).topic_id
    assert found is not None
    return found


def assert_stays(cluster: Cluster, leader: int, isr: tuple[int, ...], hw: int) -> None:
    """For WATCH_S: the ISR in ZooKeeper and the leader's HW do not change."""
    deadline = time.monotonic() + WATCH_S
    with KafkaWire.connect(cluster.address(leader)) as wire:
        while time.monotonic() < deadline:
            state = cluster.partition_state(TOPIC, 0)
            assert state is not None and state.isr == isr, state
            assert wire.list_offset(TOPIC, LATEST) == hw
            time.sleep(0.1)


def test_claims_of_a_dead_or_live_followers_id_are_refused(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, assignments={0: [1, 2, 3]}, configs={"min.insync.replicas": "2"})
    cluster.wait_for_full_isr(TOPIC, [0])
    leader = cluster.wait_for_leader(TOPIC, 0).leader
    dead, other = (n for n in (1, 2, 3) if n != leader)
    tid = topic_id(cluster)
    with wire_to(cluster, leader) as wire:
        assert wire.produce(TOPIC, batch(b"committed"), acks=-1).error_code == ErrorCode.none
        assert wire.list_offset(TOPIC, LATEST) == 1
        # A live follower's id, claimed from another host, with v12 and v15: not served.
        assert_refused(wire.request(fetch_v12(other, 0)))
        assert_refused(wire.request(fetch_v15(other, cluster.broker_epoch(other) or -1, tid, 0)))
    # From the follower's own address but with a stale broker epoch: not served either.
    epoch = cluster.broker_epoch(other)
    assert epoch is not None
    with wire_to(cluster, leader, posing_as=other) as wire:
        assert_refused(wire.request(fetch_v15(other, epoch - 1, tid, 0)))

    # One follower dies, the other leaves: the ISR shrinks to the leader, acks=all is refused.
    dead_epoch = cluster.broker_epoch(dead)
    assert dead_epoch is not None
    cluster.kill(dead)
    cluster.stop_broker(other)
    cluster.wait_for_isr(TOPIC, 0, 1)
    cluster.wait_for(lambda: dead not in cluster.registered_brokers(), f"broker {dead}'s registration gone")
    with wire_to(cluster, leader) as wire:
        # The controller's ISR change comes in a new leader epoch, which the leader applies a
        # moment later (NOT_LEADER_OR_FOLLOWER meanwhile); a refused produce appends nothing.
        refused = cluster.wait_for(
            lambda: (
                (error := wire.produce(TOPIC, batch(b"refused"), acks=-1).error_code)
                != ErrorCode.not_leader_or_follower
                and error
            ),
            "the leader in its new epoch",
        )
        assert refused == ErrorCode.not_enough_replicas
        for i in range(5):
            assert wire.produce(TOPIC, batch(b"uncommitted %d" % i), acks=1).error_code == ErrorCode.none
        leo = 6
        # Posing as the dead follower: at the HW (uncommitted records) and at the LEO (caught up).
        for offset in (1, leo):
            assert_refused(wire.request(fetch_v12(dead, offset)))
            assert_refused(wire.request(fetch_v15(dead, dead_epoch, tid, offset)))
            assert_refused(wire.request(fetch_v15(dead, -1, tid, offset)))
    # Even from the dead follower's own address, with its last epoch.
    with wire_to(cluster, leader, posing_as=dead) as wire:
        assert_refused(wire.request(fetch_v12(dead, leo)))
        assert_refused(wire.request(fetch_v15(dead, dead_epoch, tid, leo)))
    assert_stays(cluster, leader, (leader,), hw=1)
    with wire_to(cluster, leader) as wire:
        assert (
            wire.produce(TOPIC, batch(b"still refused"), acks=-1).error_code == ErrorCode.not_enough_replicas
        )

    # The real followers come back (new registrations, new epochs) and rejoin: the checks let
    # a broker's own fetcher through.
    cluster.start_broker(dead)
    cluster.start_broker(other)
    cluster.wait_for_isr(TOPIC, 0, 3)
    with wire_to(cluster, leader) as wire:
        cluster.wait_for(lambda: wire.list_offset(TOPIC, LATEST) == leo, "the HW at the LEO")
        assert wire.produce(TOPIC, batch(b"again"), acks=-1).error_code == ErrorCode.none
    cluster.wait_for_identical_replicas(TOPIC, [0])
