"""Garbage znodes written into a real ZooKeeper (as an operator's tool or a typo would) against a
three-broker cluster: the controller skips what it cannot parse and does everything else -- a new
controller starts and stays (its epoch does not spin), new topics get leaders, a controlled
shutdown finishes, and a reassignment request is answered partition by partition."""

from __future__ import annotations

import datetime
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kio.schema.alter_partition_reassignments.v0 import request as reassign0
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta

from cluster_harness import Cluster
from kafka_wire import KafkaWire
from strom.broker.zk import znodes
from strom.records.codec import RecordSpec, encode_batch

pytestmark = pytest.mark.cluster

# Sessions that outlast a short freeze of the controller (the reassignment test).
CLUSTER = {"overrides": {"zookeeper.session.timeout.ms": "8000"}}


def test_garbage_znodes_do_not_stop_the_controller(cluster: Cluster) -> None:
    cluster.create_topic("keep", partitions=2)
    cluster.create_topic("garbled-state", partitions=1)
    zk = cluster.zk
    state_path = znodes.partition_state_path("garbled-state", 0)
    good_state, _ = zk.get(state_path)
    garbage = {
        znodes.topic_path("junk"): b"{not json",
        znodes.topic_path("junk-list"): b"[1,2,3]",
        znodes.topic_config_path("keep"): b"not json at all",
    }
    try:
        for path, data in garbage.items():
            if zk.exists(path) is None:
                zk.create(path, data, makepath=True)
            else:
                zk.set(path, data)
        zk.set(state_path, b'{"leader":"one","isr":7}')

        # A controlled shutdown meets the garbage state (every broker hosts it) and still finishes.
        controller = cluster.wait_for_controller()
        follower = next(n for n in cluster.live_ids() if n != controller)
        started = time.monotonic()
        assert cluster.stop_broker(follower, timeout=60) == 0
        stopped_in = time.monotonic() - started
        assert stopped_in < 30, f"controlled shutdown took {stopped_in:.1f}s"
        cluster.start_broker(follower)
        cluster.wait_for_registered()

        # A new controller starts with the garbage in place and stays.
        epoch_before = cluster.controller_epoch()
        assert epoch_before is not None
        assert cluster.stop_broker(controller, timeout=60) == 0
        cluster.wait_for_controller(exclude={controller})
        zk.create(znodes.topic_path("junk-new"), b"\x00\x01garbage")
        cluster.create_topic("fresh", partitions=3, replication_factor=2)
        time.sleep(3)
        epoch_after = cluster.controller_epoch()
        assert epoch_after is not None
        assert epoch_after[0] - epoch_before[0] <= 2, (
            f"controller epoch spun: {epoch_before} -> {epoch_after}"
        )
        for p in range(2):
            cluster.wait_for_leader("keep", p)
        cluster.start_broker(controller)
        cluster.wait_for_registered()
        # Garbage is left as it is: never taken for a deleted topic.
        for path in [*garbage, znodes.topic_path("junk-new")]:
            assert zk.exists(path) is not None, path
    finally:
        for path in [*garbage, znodes.topic_path("junk-new")]:
            if zk.exists(path) is not None:
                zk.delete(path, recursive=True)
        zk.set(state_path, good_state)


def test_reassignment_is_answered_per_partition(cluster: Cluster) -> None:
    """Two partitions in one AlterPartitionReassignments; the controller (frozen meanwhile) cannot
    parse one topic's znode when it takes the request: that partition gets an error, the other
    starts and says so, and the request does not hang."""
    cluster.create_topic("ra", assignments={0: [1, 2]})
    cluster.create_topic("rb", assignments={0: [1, 2]})
    zk = cluster.zk
    rb_data, _ = zk.get(znodes.topic_path("rb"))
    controller = cluster.wait_for_controller()
    via = next(n for n in cluster.live_ids() if n != controller)
    broker = cluster.brokers[via]

    def reassign() -> Any:
        request = reassign0.AlterPartitionReassignmentsRequest(
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=20)),
            topics=tuple(
                reassign0.ReassignableTopic(
                    name=topic,
                    partitions=(
                        reassign0.ReassignablePartition(partition_index=i32(0), replicas=(i32(2), i32(3))),
                    ),
                )
                for topic in ("ra", "rb")
            ),
        )
        with KafkaWire(broker.host, broker.port, timeout=40) as wire:
            return wire.request(request)

    cluster.pause(controller)
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(reassign)
            cluster.wait_for(lambda: zk.exists(znodes.REASSIGN_PARTITIONS), "the request written", 20)
            zk.set(znodes.topic_path("rb"), b"{garbage")
            cluster.resume(controller)
            response = answer.result(60)
    finally:
        cluster.resume(controller)
        zk.set(znodes.topic_path("rb"), rb_data)
    errors = {t.name: t.partitions[0].error_code for t in response.responses}
    assert errors["ra"] == ErrorCode.none, response
    assert errors["rb"] != ErrorCode.none, response
    cluster.wait_for(lambda: cluster.assignment("ra").get(0) == [2, 3], "ra reassigned", 30)
    assert cluster.assignment("rb").get(0) == [1, 2]


def test_topic_written_without_an_id_gets_one_and_serves(cluster: Cluster) -> None:
    """A topic created as Kafka 2.x's ``kafka-topics.sh --zookeeper`` creates it (no topic_id): the
    controller gives it an id, its partitions get leaders, and it takes writes."""
    zk = cluster.zk
    zk.create(znodes.topic_path("legacy"), b'{"version":1,"partitions":{"0":[1,2,3],"1":[2,3,1]}}')
    for p in (0, 1):
        cluster.wait_for_leader("legacy", p)
    data, _ = zk.get(znodes.topic_path("legacy"))
    znode = znodes.TopicZNode.decode(data)
    assert znode.topic_id is not None and znode.partitions == {0: [1, 2, 3], 1: [2, 3, 1]}
    leader = cluster.wait_for_leader("legacy", 0).leader
    broker = cluster.brokers[leader]
    with KafkaWire(broker.host, broker.port) as wire:
        assert wire.produce_ok("legacy", encode_batch([RecordSpec(key=None, value=b"x")])) == 0
