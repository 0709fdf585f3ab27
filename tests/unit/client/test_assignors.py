"""The consumer's partition assignors and the consumer protocol's wire layout (no broker)."""

from __future__ import annotations

import struct
from collections.abc import Mapping

import pytest

from strom.client.cluster import TopicPartition
from strom.client.consumer.assignors import (
    CooperativeStickyAssignor,
    RangeAssignor,
    RebalanceProtocol,
    RoundRobinAssignor,
    assignors_for,
    rebalance_protocol,
)
from strom.client.consumer.protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from strom.client.errors import ConfigException


def tps(topic: str, *partitions: int) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in partitions]


def numbers(assigned: list[TopicPartition]) -> set[int]:
    return {tp.partition for tp in assigned}


def subscribed(*topics: str, owned: list[TopicPartition] | None = None, generation: int = -1) -> Subscription:
    return Subscription(tuple(topics), owned_partitions=tuple(owned or ()), generation_id=generation)


# ---------------------------------------------------------------- range and roundrobin


def test_range_gives_consecutive_ranges_and_the_first_members_the_remainder() -> None:
    members = {m: subscribed("t") for m in ("c", "a", "b")}
    assigned = RangeAssignor().assign({"t": 7}, members)
    assert {m: numbers(p) for m, p in assigned.items()} == {"a": {0, 1, 2}, "b": {3, 4}, "c": {5, 6}}


def test_range_splits_each_topic_on_its_own() -> None:
    members = {"a": subscribed("x", "y"), "b": subscribed("x", "y"), "c": subscribed("y")}
    assigned = RangeAssignor().assign({"x": 3, "y": 3}, members)
    assert assigned == {
        "a": [*tps("x", 0, 1), *tps("y", 0)],
        "b": [*tps("x", 2), *tps("y", 1)],
        "c": tps("y", 2),
    }


def test_range_orders_static_members_by_instance_id_before_dynamic_ones() -> None:
    members = {
        "m-1": Subscription(("t",), group_instance_id="zeta"),
        "m-2": Subscription(("t",), group_instance_id="alpha"),
        "m-0": subscribed("t"),
    }
    assigned = RangeAssignor().assign({"t": 3}, members)
    assert assigned == {"m-2": tps("t", 0), "m-1": tps("t", 1), "m-0": tps("t", 2)}


def test_roundrobin_deals_partitions_in_turn() -> None:
    members = {m: subscribed("t") for m in ("a", "b", "c")}
    assigned = RoundRobinAssignor().assign({"t": 6}, members)
    assert {m: numbers(p) for m, p in assigned.items()} == {"a": {0, 3}, "b": {1, 4}, "c": {2, 5}}


def test_roundrobin_skips_members_not_subscribed_to_a_topic() -> None:
    members = {"a": subscribed("x"), "b": subscribed("x", "y")}
    assigned = RoundRobinAssignor().assign({"x": 2, "y": 2}, members)
    assert assigned == {"a": tps("x", 0), "b": [*tps("x", 1), *tps("y", 0, 1)]}


def test_topics_without_metadata_are_not_assigned() -> None:
    members = {"a": subscribed("known", "missing")}
    for assignor in (RangeAssignor(), RoundRobinAssignor(), CooperativeStickyAssignor()):
        assert assignor.assign({"known": 2}, members) == {"a": tps("known", 0, 1)}


# ---------------------------------------------------------------- cooperative-sticky


def assert_complete_and_disjoint(
    assigned: Mapping[str, list[TopicPartition]], expected: set[TopicPartition]
) -> None:
    flat = [tp for partitions in assigned.values() for tp in partitions]
    assert len(flat) == len(set(flat)) and set(flat) == expected


def test_sticky_first_assignment_is_balanced() -> None:
    members = {m: subscribed("t") for m in ("a", "b", "c")}
    assigned = CooperativeStickyAssignor().assign({"t": 7}, members)
    assert_complete_and_disjoint(assigned, set(tps("t", *range(7))))
    assert sorted(len(p) for p in assigned.values()) == [2, 2, 3]


def test_sticky_joining_member_gets_moved_partitions_only_after_they_are_revoked() -> None:
    assignor = CooperativeStickyAssignor()
    old = {"a": tps("t", 0, 1, 2), "b": tps("t", 3, 4, 5)}
    members = {m: subscribed("t", owned=owned, generation=4) for m, owned in old.items()}
    members["c"] = subscribed("t")
    first = assignor.assign({"t": 6}, members)
    # Each old member keeps two of its own; what moves is held back from the newcomer.
    assert first["c"] == []
    for member, owned in old.items():
        assert len(first[member]) == 2 and set(first[member]) < set(owned)
    moving = set(tps("t", *range(6))) - set(first["a"]) - set(first["b"])
    # The follow-up round: the old members revoked, the newcomer gets exactly what they gave up.
    members = {m: subscribed("t", owned=first[m], generation=5) for m in ("a", "b")}
    members["c"] = subscribed("t", owned=[], generation=5)
    second = assignor.assign({"t": 6}, members)
    assert second["a"] == first["a"] and second["b"] == first["b"]
    assert set(second["c"]) == moving


def test_sticky_partitions_of_a_departed_member_move_at_once() -> None:
    members = {
        "a": subscribed("t", owned=tps("t", 0, 1), generation=3),
        "b": subscribed("t", owned=tps("t", 2, 3), generation=3),
    }
    assigned = CooperativeStickyAssignor().assign({"t": 6}, members)  # c owned 4 and 5, and left
    assert set(tps("t", 0, 1)) < set(assigned["a"]) and set(tps("t", 2, 3)) < set(assigned["b"])
    assert_complete_and_disjoint(assigned, set(tps("t", *range(6))))
    assert len(assigned["a"]) == len(assigned["b"]) == 3


def test_sticky_keeps_a_balanced_assignment_unchanged() -> None:
    owned = {"a": tps("t", 0, 4), "b": tps("t", 1, 3), "c": tps("t", 2, 5)}
    members = {m: subscribed("t", owned=p, generation=7) for m, p in owned.items()}
    assert CooperativeStickyAssignor().assign({"t": 6}, members) == owned


def test_sticky_claims_resolve_by_generation() -> None:
    members = {
        # a's claim on 0 is stale (generation 2); b and c both claim 2 in generation 3: neither keeps it
        # for sure, but it goes to one of them, with nobody made to revoke.
        "a": subscribed("t", owned=tps("t", 0), generation=2),
        "b": subscribed("t", owned=tps("t", 0, 2), generation=3),
        "c": subscribed("t", owned=tps("t", 1, 2), generation=3),
    }
    assigned = CooperativeStickyAssignor().assign({"t": 3}, members)
    assert TopicPartition("t", 0) in assigned["b"] and TopicPartition("t", 1) in assigned["c"]
    assert_complete_and_disjoint(assigned, set(tps("t", 0, 1, 2)))


def test_sticky_reads_the_generation_from_user_data_of_old_subscriptions() -> None:
    old = Subscription(("t",), user_data=struct.pack(">i", 9), owned_partitions=tuple(tps("t", 0, 1)))
    stale = subscribed("t", owned=tps("t", 0, 1), generation=8)
    assigned = CooperativeStickyAssignor().assign({"t": 2}, {"a": old, "b": stale})
    # a's generation 9 wins both partitions; b must not take one that a has not revoked yet.
    assert assigned == {"a": tps("t", 0), "b": []}


def test_sticky_drops_owned_partitions_of_unsubscribed_topics() -> None:
    members = {
        "a": subscribed("y", owned=tps("x", 0, 1), generation=1),  # switched from x to y
        "b": subscribed("x", "y", generation=1),
    }
    assigned = CooperativeStickyAssignor().assign({"x": 2, "y": 2}, members)
    assert set(assigned["b"]) >= set(tps("x", 0, 1))
    assert_complete_and_disjoint(assigned, set(tps("x", 0, 1) + tps("y", 0, 1)))


def test_sticky_balances_members_with_different_subscriptions() -> None:
    members = {"a": subscribed("x"), "b": subscribed("x", "y"), "c": subscribed("x", "y")}
    assigned = CooperativeStickyAssignor().assign({"x": 6, "y": 3}, members)
    assert_complete_and_disjoint(assigned, set(tps("x", *range(6)) + tps("y", 0, 1, 2)))
    assert all(tp.topic == "x" for tp in assigned["a"])
    assert sorted(len(p) for p in assigned.values()) == [3, 3, 3]


def test_sticky_subscription_user_data_carries_the_generation() -> None:
    assignor = CooperativeStickyAssignor()
    assert assignor.subscription_user_data({"t"}) == struct.pack(">i", -1)
    assignor.on_assignment(Assignment(()), 12)
    assert assignor.subscription_user_data({"t"}) == struct.pack(">i", 12)


# ---------------------------------------------------------------- configuration


def test_assignors_by_name_and_java_class_name() -> None:
    named = assignors_for(
        ["org.apache.kafka.clients.consumer.RoundRobinAssignor", "range", "cooperative-sticky", "range"]
    )
    assert [a.name for a in named] == ["roundrobin", "range", "cooperative-sticky"]
    with pytest.raises(ConfigException, match="sticky-ish"):
        assignors_for(["sticky-ish"])
    with pytest.raises(ConfigException):
        assignors_for([])


def test_the_rebalance_protocol_is_cooperative_only_when_every_assignor_supports_it() -> None:
    assert rebalance_protocol(assignors_for(["cooperative-sticky"])) is RebalanceProtocol.COOPERATIVE
    assert rebalance_protocol(assignors_for(["range", "cooperative-sticky"])) is RebalanceProtocol.EAGER


# ---------------------------------------------------------------- the consumer protocol

FULL = Subscription(
    topics=("a", "b"),
    user_data=b"\x00\x01",
    owned_partitions=(TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1)),
    generation_id=42,
    rack_id="rack-1",
)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_round_trips_the_fields_of_each_version(version: int) -> None:
    decoded = decode_subscription(encode_subscription(FULL, version))
    assert decoded.topics == FULL.topics and decoded.user_data == FULL.user_data
    assert decoded.owned_partitions == (FULL.owned_partitions if version >= 1 else ())
    assert decoded.generation_id == (42 if version >= 2 else -1)
    assert decoded.rack_id == ("rack-1" if version >= 3 else None)


def test_subscription_v3_layout() -> None:
    data = encode_subscription(
        Subscription(("t",), None, (TopicPartition("t", 1),), generation_id=5, rack_id=None), 3
    )
    assert data == (
        b"\x00\x03"  # version
        + b"\x00\x00\x00\x01\x00\x01t"  # topics
        + b"\xff\xff\xff\xff"  # null user data
        + b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x01"  # owned: t [1]
        + b"\x00\x00\x00\x05"  # generation
        + b"\xff\xff"  # null rack
    )


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_round_trips(version: int) -> None:
    assignment = Assignment((TopicPartition("a", 3), TopicPartition("a", 1), TopicPartition("b", 0)), b"ud")
    decoded = decode_assignment(encode_assignment(assignment, version))
    assert sorted(decoded.partitions, key=str) == sorted(assignment.partitions, key=str)
    assert decoded.user_data == b"ud"
    assert encode_assignment(assignment, version)[:2] == struct.pack(">h", version)


# What confluent-kafka 2.16 (librdkafka) and kafka-python 3.0 sent a Strom broker, captured from
# DescribeGroups: librdkafka writes v3 subscriptions with empty (not null) user data and rack, and
# v0 assignments; kafka-python writes v1 for cooperative-sticky.
LIBRDKAFKA_SUBSCRIPTION = b"\x00\x03\x00\x00\x00\x02\x00\x05cap-a\x00\x05cap-b\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\x00\x05rack1"
LIBRDKAFKA_ASSIGNMENT = (
    b"\x00\x00\x00\x00\x00\x02\x00\x05cap-a\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01"
    b"\x00\x05cap-b\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"
)
KAFKA_PYTHON_SUBSCRIPTION = (
    b"\x00\x01\x00\x00\x00\x02\x00\x05cap-a\x00\x05cap-b\x00\x00\x00\x00\x00\x00\x00\x00"
)


def test_decodes_what_librdkafka_and_kafka_python_send() -> None:
    assert decode_subscription(LIBRDKAFKA_SUBSCRIPTION) == Subscription(
        ("cap-a", "cap-b"), b"", (), -1, "rack1"
    )
    assert decode_subscription(KAFKA_PYTHON_SUBSCRIPTION) == Subscription(
        ("cap-a", "cap-b"), b"", (), -1, None
    )
    assignment = decode_assignment(LIBRDKAFKA_ASSIGNMENT)
    assert assignment.partitions == (*tps("cap-a", 0, 1), *tps("cap-b", 0, 1)) and assignment.user_data == b""


def test_newer_versions_read_as_the_newest_known_and_short_v0_is_tolerated() -> None:
    v4 = b"\x00\x04" + encode_subscription(FULL, 3)[2:] + b"\x00\x00\x00\x07future-field"
    assert decode_subscription(v4) == FULL
    without_user_data = b"\x00\x00\x00\x00\x00\x01\x00\x01t"
    assert decode_subscription(without_user_data) == Subscription(("t",))
    assert decode_assignment(b"") == Assignment(())


@pytest.mark.parametrize(
    "data",
    [b"\x00", b"\x00\x01\x00\x00\x00\x02\x00\x01t", b"\xff\xff\x00\x00\x00\x00", b"\x00\x00\xff\xff\xff\xfe"],
)
def test_malformed_subscriptions_are_rejected(data: bytes) -> None:
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(data)
