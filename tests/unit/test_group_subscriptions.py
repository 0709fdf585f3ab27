"""ClassicGroup.subscribed_topics (OffsetDelete and offset expiry ask it) with members whose
protocols changed under the group's chosen one."""

from __future__ import annotations

import struct

from strom.broker.coordinator.group import ClassicGroup, GroupState, MemberMetadata


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topic names, null user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


def member(member_id: str, protocols: list[tuple[str, bytes]]) -> MemberMetadata:
    return MemberMetadata(member_id, None, "client", "/127.0.0.1", 1000, 6000, "consumer", protocols)


def test_subscriptions_of_the_chosen_protocol() -> None:
    group = ClassicGroup("g", 0, GroupState.STABLE)
    group.add_member(member("a", [("range", subscription("t1")), ("other", subscription("x"))]))
    group.add_member(member("b", [("range", subscription("t2"))]))
    group.protocol_name = "range"
    assert group.subscribed_topics() == {"t1", "t2"}


def test_a_member_without_the_chosen_protocol_makes_them_unknown() -> None:
    # Found by the cluster wire fuzz: a static member rejoined with other protocols while the
    # group still had the old choice, and OffsetDelete's handler died on a KeyError.
    group = ClassicGroup("g", 0, GroupState.STABLE)
    group.add_member(member("a", [("range", subscription("t1"))]))
    group.add_member(member("b", [("other", subscription("t2"))]))
    group.protocol_name = "range"
    assert group.subscribed_topics() is None
