"""DescribeTopicPartitions (75, KIP-966) and ListConfigResources (74, KIP-1142) on a real broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire, kio_request

TOPICS = {"dtp-a": 5, "dtp-b": 3, "dtp-c": 4}


@pytest.fixture(scope="module")
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        for name, partitions in TOPICS.items():
            assert conn.create_topic(name, partitions=partitions) == ErrorCode.none
        yield conn


def describe(wire: KafkaWire, names: list[str], limit: int, cursor: tuple[str, int] | None = None) -> Any:
    m = kio_request("describe_topic_partitions", 0)
    return wire.request(
        m.DescribeTopicPartitionsRequest(
            topics=tuple(m.TopicRequest(name=n) for n in names),
            response_partition_limit=limit,
            cursor=m.Cursor(topic_name=cursor[0], partition_index=cursor[1]) if cursor else None,
        )
    )


def test_pages_through_every_partition_in_topic_order(wire: KafkaWire) -> None:
    seen: list[tuple[str, int]] = []
    cursor: tuple[str, int] | None = None
    pages = 0
    while True:
        response = describe(wire, list(TOPICS), 4, cursor)
        pages += 1
        assert sum(len(t.partitions) for t in response.topics) <= 4
        for topic in response.topics:
            assert topic.error_code == ErrorCode.none and topic.topic_id.int != 0
            for p in topic.partitions:
                assert p.error_code == ErrorCode.none and p.leader_id == p.replica_nodes[0] == p.isr_nodes[0]
                assert p.leader_epoch >= 0 and p.eligible_leader_replicas == () and p.offline_replicas == ()
                seen.append((topic.name, p.partition_index))
        if response.next_cursor is None:
            break
        cursor = (response.next_cursor.topic_name, response.next_cursor.partition_index)
    assert seen == [(name, i) for name in sorted(TOPICS) for i in range(TOPICS[name])]
    assert pages == 3  # 12 partitions, 4 a page


def test_cursor_at_a_topic_boundary_and_unknown_topics(wire: KafkaWire) -> None:
    response = describe(wire, ["dtp-a", "dtp-b", "nope"], 5)
    assert [t.name for t in response.topics] == ["dtp-a"]
    assert (response.next_cursor.topic_name, response.next_cursor.partition_index) == ("dtp-b", 0)
    response = describe(wire, ["dtp-b", "nope"], 100, ("dtp-b", 1))
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("dtp-b", ErrorCode.none),
        ("nope", ErrorCode.unknown_topic_or_partition),
    ]
    assert [p.partition_index for p in response.topics[0].partitions] == [1, 2]
    assert response.next_cursor is None


def test_every_topic_when_none_is_named_and_a_cursor_outside_the_list_is_invalid(wire: KafkaWire) -> None:
    names = [t.name for t in describe(wire, [], 2000).topics]
    assert names == sorted(names) and set(TOPICS) <= set(names)
    response = describe(wire, ["dtp-a"], 10, ("dtp-c", 0))
    assert [(t.name, t.error_code) for t in response.topics] == [("dtp-a", ErrorCode.invalid_request)]


@pytest.mark.parametrize("version", [0, 1])
def test_list_config_resources(wire: KafkaWire, version: int) -> None:
    m = kio_request("list_config_resources", version)
    response = wire.request(m.ListConfigResourcesRequest())
    assert response.error_code == ErrorCode.none
    if version == 0:
        assert response.config_resources == ()  # client-metrics subscriptions: none
        return
    rows = [(r.resource_type, r.resource_name) for r in response.config_resources]
    assert rows[:2] == [(8, "0"), (4, "0")]  # broker logger, broker
    assert [(2, name) for name in sorted(TOPICS)] == [r for r in rows if r[1] in TOPICS]
    topics_only = wire.request(m.ListConfigResourcesRequest(resource_types=(2,)))
    assert {r.resource_type for r in topics_only.config_resources} == {2}
    unsupported = wire.request(m.ListConfigResourcesRequest(resource_types=(2, 64)))
    assert unsupported.error_code == ErrorCode.unsupported_version and unsupported.config_resources == ()
