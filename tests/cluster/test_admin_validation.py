"""Admin requests and settings checked before anything reaches ZooKeeper or a disk, in a real
3-broker cluster: manual assignments Kafka refuses, topic names joined into znode paths, the
internal topics, out-of-bounds dynamic configs on the cluster default, and a controlled shutdown
that ends within its bound even when ZooKeeper is out of reach."""

from __future__ import annotations

import time

import pytest
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.delete_topics.v6 import request as delete_topics6
from kio.schema.errors import ErrorCode
from kio.schema.list_partition_reassignments.v0 import request as list_reassignments0

from cluster_harness import Cluster
from kafka_wire import REQUEST_TIMEOUT, ZERO_UUID, GroupWire, KafkaWire, kio_request

CLUSTER = {
    "zookeeper_proxies": True,
    # Two attempts of at most 3 s each, 200 ms apart (CLUSTER_TEST_CONFIG's backoff).
    "overrides": {"controlled.shutdown.max.retries": "2", "controller.socket.timeout.ms": "3000"},
}


def create(cluster: Cluster, name: str, assignment: dict[int, list[int]]) -> tuple[int, str | None]:
    with KafkaWire.connect(cluster.address(1)) as wire:
        response = wire.request(
            create_topics7.CreateTopicsRequest(
                topics=(
                    create_topics7.CreatableTopic(
                        name=name,
                        num_partitions=-1,
                        replication_factor=-1,
                        assignments=tuple(
                            create_topics7.CreatableReplicaAssignment(partition_index=p, broker_ids=tuple(b))
                            for p, b in assignment.items()
                        ),
                        configs=(),
                    ),
                ),
                timeout=REQUEST_TIMEOUT,
            )
        )
    (result,) = response.topics
    return result.error_code, result.error_message


@pytest.mark.parametrize(
    ("assignment", "why"),
    [
        ({0: [1], 5: [2]}, "consecutive"),
        ({-1: [1]}, "consecutive"),
        ({2147483647: [1]}, "consecutive"),
        ({1: [1], 2: [2]}, "consecutive"),
        ({0: [1, 1]}, "more than once"),
        ({0: [1, 42]}, "no such broker"),
        ({0: [1, 2], 1: [3]}, "not consistent"),
        ({0: []}, "empty"),
    ],
    ids=["0-5", "minus-1", "int-max", "1-2", "repeated-broker", "unknown-broker", "counts-differ", "empty"],
)
def test_a_manual_assignment_kafka_refuses_writes_nothing(
    cluster: Cluster, assignment: dict[int, list[int]], why: str
) -> None:
    name = "bad-assignment"
    error, message = create(cluster, name, assignment)
    assert error == ErrorCode.invalid_replica_assignment, message
    assert why in (message or ""), message
    assert cluster.assignment(name) == {}
    for broker in cluster.brokers.values():
        leftovers = [p.name for p in broker.data_dir.iterdir() if p.name.startswith(name)]
        assert leftovers == [], leftovers


def test_duplicate_partition_indexes_are_refused(cluster: Cluster) -> None:
    m = create_topics7
    with KafkaWire.connect(cluster.address(1)) as wire:
        response = wire.request(
            m.CreateTopicsRequest(
                topics=(
                    m.CreatableTopic(
                        name="twice-zero",
                        num_partitions=-1,
                        replication_factor=-1,
                        assignments=(
                            m.CreatableReplicaAssignment(partition_index=0, broker_ids=(1,)),
                            m.CreatableReplicaAssignment(partition_index=0, broker_ids=(2,)),
                        ),
                        configs=(),
                    ),
                ),
                timeout=REQUEST_TIMEOUT,
            )
        )
    assert response.topics[0].error_code == ErrorCode.invalid_replica_assignment
    assert cluster.assignment("twice-zero") == {}


@pytest.mark.parametrize("name", ["..", ".", "a/../..", ""])
def test_list_reassignments_never_joins_an_illegal_name_into_a_znode_path(
    cluster: Cluster, name: str
) -> None:
    with KafkaWire.connect(cluster.address(1)) as wire:
        response = wire.request(
            list_reassignments0.ListPartitionReassignmentsRequest(
                timeout=REQUEST_TIMEOUT,
                topics=(
                    list_reassignments0.ListPartitionReassignmentsTopics(name=name, partition_indexes=(0,)),
                ),
            )
        )
    assert response.error_code == ErrorCode.none, response.error_message
    assert response.topics == ()


def test_the_internal_topics_cannot_be_deleted(cluster: Cluster) -> None:
    cluster.create_topic("before-offsets", partitions=1, replication_factor=3)
    with KafkaWire.connect(cluster.address(1)) as wire:
        with GroupWire.connect(cluster.address(1)) as group:
            deadline = time.monotonic() + 60
            while group.find_coordinator("g").coordinators[0].error_code != ErrorCode.none:
                assert time.monotonic() < deadline, "no coordinator"
                time.sleep(0.5)
        assert cluster.assignment("__consumer_offsets")
        response = wire.request(
            delete_topics6.DeleteTopicsRequest(
                topics=(delete_topics6.DeleteTopicState(name="__consumer_offsets", topic_id=ZERO_UUID),),
                timeout=REQUEST_TIMEOUT,
            )
        )
    (result,) = response.responses
    assert result.error_code == ErrorCode.invalid_request, result.error_message
    time.sleep(1)
    assert cluster.assignment("__consumer_offsets")
    assert cluster.zk.exists("/admin/delete_topics/__consumer_offsets") is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("log.cleaner.io.max.bytes.per.second", "0.001"),
        ("log.cleaner.io.buffer.load.factor", "NaN"),
        ("num.replica.fetchers", "2147483647"),
        ("max.connections", "-1"),
    ],
)
def test_an_out_of_bounds_cluster_default_never_reaches_zookeeper(
    cluster: Cluster, key: str, value: str
) -> None:
    m = kio_request("incremental_alter_configs", 1)
    with KafkaWire.connect(cluster.address(1)) as wire:
        response = wire.request(
            m.IncrementalAlterConfigsRequest(
                resources=(
                    m.AlterConfigsResource(
                        resource_type=4,
                        resource_name="",
                        configs=(m.AlterableConfig(name=key, config_operation=0, value=value),),
                    ),
                ),
                validate_only=False,
            )
        )
    assert response.responses[0].error_code == ErrorCode.invalid_request, response.responses[0].error_message
    stored = cluster.zk.exists("/config/brokers/<default>")
    if stored is not None:
        assert key.encode() not in cluster.zk.get("/config/brokers/<default>")[0]


def test_a_broker_cut_off_zookeeper_stops_within_its_controlled_shutdown_bound(cluster: Cluster) -> None:
    victim = cluster.broker_ids[-1]
    cluster.cut_zookeeper(victim)
    try:
        started = time.monotonic()
        # Bound: fetchers, 2 attempts, the controller and the session, each at most 3 s, plus the
        # logs' own shutdown; without the bound the attempts wait on ZooKeeper for good.
        assert cluster.stop_broker(victim, timeout=60) == 0
        assert time.monotonic() - started < 30
    finally:
        cluster.heal_zookeeper(victim)
