"""The group coordinator on the wire: every group API at every version, and Kafka's error for each wrong call.

Each member of a group is driven through its own connection (JoinGroup and SyncGroup wait in
the broker until the rebalance step completes). The expected errors are those of Kafka 4.1's
classic group coordinator (group-coordinator's GroupMetadataManager, ClassicGroup and
OffsetMetadataManager); the comment at each check names the rule.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from kafka_wire import GroupWire

BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "group.max.session.timeout.ms": "60000",
    "group.max.size": "3",
}
TOPIC = "group-protocol"
OTHER_TOPIC = "group-protocol-other"
SESSION_MS = 10000


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topic names, null user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


RANGE = [("range", subscription(TOPIC))]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


Connect = Callable[..., GroupWire]
Protocols = Sequence[tuple[str, bytes]]


@pytest.fixture(scope="module")
def connect(bootstrap: str) -> Iterator[Connect]:
    """A factory of connections to the module's broker; every one is closed at the end."""
    opened: list[GroupWire] = []

    def factory(client_id: str = "strom-tests") -> GroupWire:
        host, port = bootstrap.split(":")
        wire = GroupWire(host, int(port), client_id=client_id)
        opened.append(wire)
        return wire

    first = factory()
    assert first.create_topic(TOPIC, partitions=3) == ErrorCode.none
    assert first.create_topic(OTHER_TOPIC, partitions=1) == ErrorCode.none
    yield factory
    for wire in opened:
        wire.close()


@pytest.fixture()
def wire(connect: Connect) -> GroupWire:
    return connect()


def new_member_id(wire: GroupWire, group: str, protocols: Protocols = RANGE, **kw: Any) -> str:
    """JoinGroup v4+ without a member id: Kafka answers MEMBER_ID_REQUIRED with the id to use (KIP-394)."""
    response = wire.join_group(group, "", protocols, **kw)
    assert response.error_code == ErrorCode.member_id_required, response
    assert response.member_id.startswith(wire.client_id + "-")
    return str(response.member_id)


def single_member_group(
    wire: GroupWire, group: str, protocols: Protocols = RANGE, **kw: Any
) -> tuple[str, int]:
    """A Stable group of one member; (member id, generation)."""
    member = new_member_id(wire, group, protocols, **kw)
    joined = wire.join_group(group, member, protocols, **kw)
    assert joined.error_code == ErrorCode.none, joined
    synced = wire.request(
        wire.sync_group_request(group, joined.generation_id, member, {member: b"assignment"})
    )
    assert synced.error_code == ErrorCode.none, synced
    return member, joined.generation_id


def described(wire: GroupWire, group: str) -> Any:
    (result,) = wire.describe_groups(group).groups
    return result


def wait_for_members(wire: GroupWire, group: str, count: int) -> None:
    """Until ``count`` members are in the group: a JoinGroup sent on another connection has arrived."""
    deadline = time.monotonic() + 10
    while len(described(wire, group).members) < count:
        assert time.monotonic() < deadline, f"{group} never had {count} members"
        time.sleep(0.02)


# --- FindCoordinator ---------------------------------------------------------------------


def test_find_coordinator_every_version_names_this_broker(wire: GroupWire, bootstrap: str) -> None:
    host, port = bootstrap.split(":")
    (broker,) = wire.metadata().brokers
    assert (broker.host, broker.port) == (host, int(port))
    for version in range(4):
        response = wire.find_coordinator("some-group", version=version)
        assert response.error_code == ErrorCode.none
        assert (response.node_id, response.host, response.port) == (broker.node_id, host, int(port))
    for version in (4, 5, 6):
        response = wire.find_coordinator("group-a", "group-b", version=version)
        assert [c.key for c in response.coordinators] == ["group-a", "group-b"]
        for c in response.coordinators:
            assert c.error_code == ErrorCode.none
            assert (c.node_id, c.host, c.port) == (broker.node_id, host, int(port))


# --- JoinGroup errors --------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 3, 4, 9])
def test_join_with_a_member_id_on_an_unknown_group_is_unknown_member_id(
    wire: GroupWire, version: int
) -> None:
    group = unique("ghost-group")
    response = wire.join_group(group, "ghost-member", RANGE, version=version)
    assert response.error_code == ErrorCode.unknown_member_id
    # The group is not created by a rejected join.
    assert described(wire, group).error_code == ErrorCode.group_id_not_found


@pytest.mark.parametrize("version", [4, 5, 6, 7, 8, 9])
def test_join_v4_plus_requires_a_member_id_first(wire: GroupWire, version: int) -> None:
    group = unique(f"mid-v{version}")
    first = wire.join_group(group, "", RANGE, version=version)
    assert first.error_code == ErrorCode.member_id_required
    assert first.generation_id == -1
    member = first.member_id
    assert member.startswith("strom-tests-")
    joined = wire.join_group(group, member, RANGE, version=version)
    assert joined.error_code == ErrorCode.none
    assert (joined.member_id, joined.leader, joined.generation_id) == (member, member, 1)
    assert joined.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in joined.members] == [(member, RANGE[0][1])]
    if version >= 7:
        assert joined.protocol_type == "consumer"
    assert wire.leave_group(group, (member, None)).members[0].error_code == ErrorCode.none


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_join_before_v4_gets_its_member_id_at_once(wire: GroupWire, version: int) -> None:
    group = unique(f"old-join-v{version}")
    joined = wire.join_group(group, "", RANGE, version=version)
    assert joined.error_code == ErrorCode.none
    assert joined.member_id.startswith("strom-tests-")
    assert (joined.leader, joined.generation_id) == (joined.member_id, 1)
    assert wire.leave_group(group, (joined.member_id, None), version=0).error_code == ErrorCode.none


def test_session_timeout_outside_the_broker_bounds_is_invalid(wire: GroupWire) -> None:
    group = unique("session")
    for timeout in (999, 60001):
        response = wire.join_group(group, "", RANGE, session_timeout_ms=timeout)
        assert response.error_code == ErrorCode.invalid_session_timeout, timeout
    # The bounds themselves are valid.
    member = new_member_id(wire, group, session_timeout_ms=1000)
    assert wire.join_group(group, member, RANGE, session_timeout_ms=60000).error_code == ErrorCode.none
    # A known member asking for a bad timeout is refused too, before anything else.
    response = wire.join_group(group, member, RANGE, session_timeout_ms=500)
    assert response.error_code == ErrorCode.invalid_session_timeout
    wire.leave_group(group, (member, None))


def test_mismatched_protocol_type_or_protocols_is_inconsistent(wire: GroupWire) -> None:
    group = unique("inconsistent")
    member, generation = single_member_group(wire, group)
    other = [("roundrobin", subscription(TOPIC))]
    assert wire.join_group(group, "", RANGE, protocol_type="connect").error_code == (
        ErrorCode.inconsistent_group_protocol
    )
    assert wire.join_group(group, "", other).error_code == ErrorCode.inconsistent_group_protocol
    # A member of the group is held to the group's protocol type as well.
    assert wire.join_group(group, member, RANGE, protocol_type="connect").error_code == (
        ErrorCode.inconsistent_group_protocol
    )
    # An empty protocol list can never join, even a new group.
    assert wire.join_group(unique("no-protocols"), "", []).error_code == ErrorCode.inconsistent_group_protocol
    # SyncGroup v5 checks the protocol type and name it is told against the group's.
    wrong: list[dict[str, Any]] = [{"protocol_type": "connect"}, {"protocol_name": "roundrobin"}]
    for kwargs in wrong:
        response = wire.request(wire.sync_group_request(group, generation, member, **kwargs))
        assert response.error_code == ErrorCode.inconsistent_group_protocol, kwargs
    response = wire.request(
        wire.sync_group_request(group, generation, member, protocol_type="consumer", protocol_name="range")
    )
    assert response.error_code == ErrorCode.none
    assert (response.protocol_type, response.protocol_name, response.assignment) == (
        "consumer",
        "range",
        b"assignment",
    )
    wire.leave_group(group, (member, None))


def test_session_timeout_removes_a_silent_member(wire: GroupWire) -> None:
    group = unique("expiry")
    member, generation = single_member_group(wire, group, session_timeout_ms=1000)
    assert wire.heartbeat(group, generation, member) == ErrorCode.none
    time.sleep(1.6)
    assert wire.heartbeat(group, generation, member) == ErrorCode.unknown_member_id
    group_state = described(wire, group)
    assert (group_state.group_state, group_state.members) == ("Empty", ())


# --- a whole rebalance -------------------------------------------------------------------


def test_two_members_join_sync_heartbeat_and_leave(connect: Connect) -> None:
    group = unique("flow")
    a, b = connect("client-a"), connect("client-b")
    # A prefers z, which B lacks; among the common protocols both vote for y, so y wins over A's x.
    a_protocols = [("z", b"a-z"), ("y", b"a-y"), ("x", b"a-x")]
    b_protocols = [("y", b"b-y"), ("x", b"b-x")]

    a_id, gen1 = single_member_group(a, group, a_protocols)
    assert gen1 == 1
    assert described(a, group).protocol_data == "z"  # alone, A's first choice

    b_id = new_member_id(b, group, b_protocols)
    b_join = b.start(b.join_group_request(group, b_id, b_protocols))
    wait_for_members(a, group, 2)  # B waits in the broker: the group is preparing a rebalance for it
    assert described(a, group).group_state == "PreparingRebalance"
    assert a.heartbeat(group, gen1, a_id) == ErrorCode.rebalance_in_progress
    assert a.heartbeat(group, gen1 + 1, a_id) == ErrorCode.illegal_generation
    # SyncGroup of the old generation during the rebalance: the generation is still 1, the state is not.
    assert a.request(a.sync_group_request(group, gen1, a_id)).error_code == ErrorCode.rebalance_in_progress

    a_join = a.join_group(group, a_id, a_protocols)  # A rejoins: every member has joined, generation 2
    b_joined = b_join()
    for response in (a_join, b_joined):
        assert response.error_code == ErrorCode.none
        assert (response.generation_id, response.protocol_name, response.leader) == (2, "y", a_id)
    # Only the leader learns the members, with each one's metadata for the chosen protocol.
    assert sorted((m.member_id, m.metadata) for m in a_join.members) == sorted(
        [(a_id, b"a-y"), (b_id, b"b-y")]
    )
    assert b_joined.members == ()
    assert described(a, group).group_state == "CompletingRebalance"

    # Wrong generations are refused in SyncGroup and Heartbeat.
    assert b.request(b.sync_group_request(group, 1, b_id)).error_code == ErrorCode.illegal_generation
    assert b.heartbeat(group, 3, b_id) == ErrorCode.illegal_generation
    # An offset commit of a member of the new generation before the assignment: REBALANCE_IN_PROGRESS.
    commit = a.offset_commit(group, {(TOPIC, 0): (1, None)}, generation_id=2, member_id=a_id)
    assert commit == {(TOPIC, 0): ErrorCode.rebalance_in_progress}

    b_sync = b.start(b.sync_group_request(group, 2, b_id))  # a follower waits for the leader's assignment
    a_sync = a.request(a.sync_group_request(group, 2, a_id, {a_id: b"for-a", b_id: b"for-b"}))
    assert (a_sync.error_code, a_sync.assignment, a_sync.protocol_name) == (ErrorCode.none, b"for-a", "y")
    b_synced = b_sync()
    assert (b_synced.error_code, b_synced.assignment) == (ErrorCode.none, b"for-b")

    state = described(a, group)
    assert (state.group_state, state.protocol_type, state.protocol_data) == ("Stable", "consumer", "y")
    assert {(m.member_id, m.client_id, m.member_metadata, m.member_assignment) for m in state.members} == {
        (a_id, "client-a", b"a-y", b"for-a"),
        (b_id, "client-b", b"b-y", b"for-b"),
    }
    assert a.heartbeat(group, 2, a_id) == ErrorCode.none
    assert b.heartbeat(group, 2, b_id) == ErrorCode.none
    commit = a.offset_commit(group, {(TOPIC, 0): (7, "by-a")}, generation_id=2, member_id=a_id)
    assert commit == {(TOPIC, 0): ErrorCode.none}

    # The leader leaves: B learns of the rebalance from its heartbeat and becomes the leader of generation 3.
    assert a.leave_group(group, (a_id, None)).members[0].error_code == ErrorCode.none
    assert b.heartbeat(group, 2, b_id) == ErrorCode.rebalance_in_progress
    b_rejoined = b.join_group(group, b_id, b_protocols)
    assert (b_rejoined.error_code, b_rejoined.generation_id, b_rejoined.leader) == (ErrorCode.none, 3, b_id)
    assert b_rejoined.protocol_name == "y"  # B's first choice, now that it is alone
    assert [m.member_id for m in b_rejoined.members] == [b_id]
    assert a.heartbeat(group, 3, a_id) == ErrorCode.unknown_member_id
    assert b.request(b.sync_group_request(group, 3, b_id, {b_id: b"all"})).assignment == b"all"

    assert b.leave_group(group, (b_id, None)).members[0].error_code == ErrorCode.none
    state = described(a, group)
    assert (state.group_state, state.members) == ("Empty", ())
    # The offsets outlive the members.
    fetched = a.offset_fetch({group: {TOPIC: [0]}}).groups[0].topics[0].partitions[0]
    assert (fetched.committed_offset, fetched.metadata) == (7, "by-a")


def test_most_voted_common_protocol_wins_and_the_group_has_a_maximum_size(connect: Connect) -> None:
    group = unique("vote")
    a, b, c, d = connect("a"), connect("b"), connect("c"), connect("d")
    leader_protocols = [("x", b"1"), ("y", b"1")]
    others = [("y", b"2"), ("x", b"2")]
    a_id, _ = single_member_group(a, group, leader_protocols)
    b_id = new_member_id(b, group, others)
    c_id = new_member_id(c, group, others)
    b_join = b.start(b.join_group_request(group, b_id, others))
    c_join = c.start(c.join_group_request(group, c_id, others))
    wait_for_members(a, group, 3)
    a_join = a.join_group(group, a_id, leader_protocols)
    for response in (a_join, b_join(), c_join()):
        assert response.error_code == ErrorCode.none
        # Two votes for y against the leader's one for x.
        assert (response.generation_id, response.protocol_name, response.leader) == (2, "y", a_id)
    # Three members, group.max.size=3: a fourth is refused before it gets a member id.
    response = d.join_group(group, "", others)
    assert (response.error_code, response.member_id) == (ErrorCode.group_max_size_reached, "")
    assert len(a_join.members) == 3
    a.leave_group(group, (a_id, None), (b_id, None), (c_id, None))
    assert described(a, group).group_state == "Empty"


def test_a_new_member_whose_join_connection_closes_leaves_the_rebalance_at_once(connect: Connect) -> None:
    """A member stopped while its first JoinGroup waits (Ctrl-C during a join) must not hold the
    rebalance open for its rebalance timeout: the other members' rejoin completes at once."""
    group = unique("abandoned-join")
    a, b = connect("client-a"), connect("client-b")
    a_id, gen1 = single_member_group(a, group, rebalance_timeout_ms=60000)
    b_id = new_member_id(b, group, rebalance_timeout_ms=60000)
    b.start(b.join_group_request(group, b_id, RANGE, rebalance_timeout_ms=60000))
    wait_for_members(a, group, 2)
    b.close()
    deadline = time.monotonic() + 5
    while len(described(a, group).members) != 1:
        assert time.monotonic() < deadline, "the abandoned member stayed in the group"
        time.sleep(0.02)
    started = time.monotonic()
    rejoined = a.join_group(group, a_id, RANGE, rebalance_timeout_ms=60000)
    assert time.monotonic() - started < 2
    assert (rejoined.error_code, rejoined.generation_id, rejoined.leader) == (ErrorCode.none, gen1 + 1, a_id)
    assert [m.member_id for m in rejoined.members] == [a_id]
    a.leave_group(group, (a_id, None))


def test_an_existing_member_whose_rejoin_connection_closes_expires_by_its_session(connect: Connect) -> None:
    """An existing member that abandons its rejoin is no longer waiting, so its session timeout
    applies again (it must not count as joined, nor hold the rebalance for the rebalance timeout)."""
    group = unique("abandoned-rejoin")
    a, b, observer = connect("client-a"), connect("client-b"), connect("observer")
    a_id, _ = single_member_group(a, group, rebalance_timeout_ms=60000, session_timeout_ms=1500)
    b_id = new_member_id(b, group, rebalance_timeout_ms=60000, session_timeout_ms=1500)
    b_join = b.start(
        b.join_group_request(group, b_id, RANGE, rebalance_timeout_ms=60000, session_timeout_ms=1500)
    )
    wait_for_members(a, group, 2)
    a_join = a.join_group(group, a_id, RANGE, rebalance_timeout_ms=60000, session_timeout_ms=1500)
    assert b_join().error_code == ErrorCode.none
    generation = a_join.generation_id
    a.request(a.sync_group_request(group, generation, a_id, {a_id: b"a", b_id: b"b"}))
    assert b.request(b.sync_group_request(group, generation, b_id)).error_code == ErrorCode.none
    # The leader rejoins (the group prepares a rebalance), and its connection closes mid-join.
    a.start(a.join_group_request(group, a_id, RANGE, rebalance_timeout_ms=60000, session_timeout_ms=1500))
    deadline = time.monotonic() + 5
    while described(observer, group).group_state != "PreparingRebalance":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    a.close()
    assert b.heartbeat(group, generation, b_id) == ErrorCode.rebalance_in_progress
    started = time.monotonic()
    # Answered once A's session (1.5 s) expires, not after the 60 s rebalance timeout.
    rejoined = b.join_group(group, b_id, RANGE, rebalance_timeout_ms=60000, session_timeout_ms=1500)
    assert time.monotonic() - started < 5
    assert (rejoined.error_code, rejoined.leader) == (ErrorCode.none, b_id)
    assert [m.member_id for m in rejoined.members] == [b_id]
    b.leave_group(group, (b_id, None))


# --- static membership -------------------------------------------------------------------


def test_a_new_instance_with_the_same_group_instance_id_fences_the_old_one(connect: Connect) -> None:
    group = unique("static")
    old, new = connect("old"), connect("new")
    # Static members get their id at once: no MEMBER_ID_REQUIRED round trip.
    joined = old.join_group(group, "", RANGE, group_instance_id="instance-1")
    assert joined.error_code == ErrorCode.none
    old_id, generation = joined.member_id, joined.generation_id
    assert old_id.startswith("instance-1-")
    synced = old.request(
        old.sync_group_request(group, generation, old_id, {old_id: b"mine"}, group_instance_id="instance-1")
    )
    assert synced.assignment == b"mine"

    # The instance restarts: same group.instance.id, no member id. Same protocols: no rebalance,
    # the same generation, and the leader is told to skip the assignment it already made.
    rejoined = new.join_group(group, "", RANGE, group_instance_id="instance-1")
    assert rejoined.error_code == ErrorCode.none
    new_id = rejoined.member_id
    assert new_id != old_id and new_id.startswith("instance-1-")
    assert (rejoined.generation_id, rejoined.leader, rejoined.skip_assignment) == (generation, new_id, True)
    assert described(new, group).group_state == "Stable"

    assert (
        old.heartbeat(group, generation, old_id, group_instance_id="instance-1")
        == ErrorCode.fenced_instance_id
    )
    sync = old.request(old.sync_group_request(group, generation, old_id, group_instance_id="instance-1"))
    assert sync.error_code == ErrorCode.fenced_instance_id
    fenced_commit = old.offset_commit(
        group,
        {(TOPIC, 1): (3, None)},
        generation_id=generation,
        member_id=old_id,
        group_instance_id="instance-1",
    )
    assert fenced_commit == {(TOPIC, 1): ErrorCode.fenced_instance_id}
    assert old.join_group(group, old_id, RANGE, group_instance_id="instance-1").error_code == (
        ErrorCode.fenced_instance_id
    )
    # Without the instance id, the old member id is simply unknown.
    assert old.heartbeat(group, generation, old_id) == ErrorCode.unknown_member_id
    assert new.heartbeat(group, generation, new_id, group_instance_id="instance-1") == ErrorCode.none
    # The new instance keeps the assignment the old one was given.
    sync = new.request(new.sync_group_request(group, generation, new_id, group_instance_id="instance-1"))
    assert (sync.error_code, sync.assignment) == (ErrorCode.none, b"mine")
    new.leave_group(group, ("", "instance-1"))


def test_leave_group_v3_plus_answers_each_member(connect: Connect) -> None:
    group = unique("leave")
    a, b = connect(), connect()
    a_id = a.join_group(group, "", RANGE, group_instance_id="i-a").member_id
    b_join = b.start(b.join_group_request(group, "", RANGE, group_instance_id="i-b"))
    wait_for_members(a, group, 2)
    a.join_group(group, a_id, RANGE, group_instance_id="i-a")
    b_id = b_join().member_id
    for version in (3, 4, 5):
        response = a.leave_group(
            group,
            ("wrong-member-id", "i-a"),  # the instance belongs to another member id
            ("", "i-unknown"),  # no such instance
            ("nobody", None),  # no such dynamic member
            version=version,
        )
        assert response.error_code == ErrorCode.none
        assert [(m.member_id, m.group_instance_id, m.error_code) for m in response.members] == [
            ("wrong-member-id", "i-a", ErrorCode.fenced_instance_id),
            ("", "i-unknown", ErrorCode.unknown_member_id),
            ("nobody", None, ErrorCode.unknown_member_id),
        ]
    # A batch that removes both members, one by instance id alone (an admin's removal) and one by both ids.
    response = a.leave_group(group, ("", "i-a"), (b_id, "i-b"))
    assert [m.error_code for m in response.members] == [ErrorCode.none, ErrorCode.none]
    assert described(a, group).group_state == "Empty"
    # An unknown group: every member is unknown, the request itself is fine.
    response = a.leave_group(unique("no-group"), ("m", None), ("", "i"))
    assert response.error_code == ErrorCode.none
    assert [m.error_code for m in response.members] == [ErrorCode.unknown_member_id] * 2


@pytest.mark.parametrize("version", [0, 1, 2])
def test_leave_group_before_v3_reports_the_member_error_at_the_top(wire: GroupWire, version: int) -> None:
    assert wire.leave_group(unique("leave-old"), ("ghost", None), version=version).error_code == (
        ErrorCode.unknown_member_id
    )


# --- offsets -----------------------------------------------------------------------------


@pytest.mark.parametrize("commit_version", range(2, 10))
def test_offset_commit_every_version_reads_back_with_every_offset_fetch_version(
    wire: GroupWire, commit_version: int
) -> None:
    group = unique(f"commit-v{commit_version}")
    # A null metadata string is stored as "" (Kafka's OffsetAndMetadata.NO_METADATA).
    offsets = {(TOPIC, 0): (10 + commit_version, f"meta-{commit_version}"), (TOPIC, 2): (5, None)}
    errors = wire.offset_commit(group, offsets, version=commit_version, leader_epoch=4)
    assert errors == {(TOPIC, 0): ErrorCode.none, (TOPIC, 2): ErrorCode.none}
    # committed_leader_epoch exists in OffsetCommit v6+ and OffsetFetch v5+.
    expected_epoch = 4 if commit_version >= 6 else -1
    for fetch_version in range(1, 10):
        response = wire.offset_fetch({group: {TOPIC: [0, 1, 2]}}, version=fetch_version)
        if fetch_version >= 8:
            (group_result,) = response.groups
            assert (group_result.group_id, group_result.error_code) == (group, ErrorCode.none)
            topics = group_result.topics
        else:
            if fetch_version >= 2:
                assert response.error_code == ErrorCode.none
            topics = response.topics
        (topic,) = topics
        assert topic.name == TOPIC
        got = {p.partition_index: (p.committed_offset, p.metadata, p.error_code) for p in topic.partitions}
        assert got == {
            0: (10 + commit_version, f"meta-{commit_version}", ErrorCode.none),
            1: (-1, "", ErrorCode.none),  # never committed
            2: (5, "", ErrorCode.none),
        }, fetch_version
        if fetch_version >= 5:
            epochs = {p.partition_index: p.committed_leader_epoch for p in topic.partitions}
            assert epochs == {0: expected_epoch, 1: -1, 2: expected_epoch}


@pytest.mark.parametrize("version", range(2, 10))
def test_offset_commit_with_a_generation_to_an_unknown_group(wire: GroupWire, version: int) -> None:
    # OffsetMetadataManager.validateOffsetCommit: v9+ GROUP_ID_NOT_FOUND, older ILLEGAL_GENERATION.
    expected = ErrorCode.group_id_not_found if version >= 9 else ErrorCode.illegal_generation
    errors = wire.offset_commit(
        unique("gone"), {(TOPIC, 0): (1, None)}, version=version, generation_id=1, member_id="m"
    )
    assert errors == {(TOPIC, 0): expected}


def test_offset_commit_errors_for_a_group_with_members(wire: GroupWire) -> None:
    group = unique("commit-checks")
    member, generation = single_member_group(wire, group)
    one: dict[tuple[str, int], tuple[int, str | None]] = {(TOPIC, 0): (1, None)}

    def commit(
        offsets: dict[tuple[str, int], tuple[int, str | None]] = one, **kw: Any
    ) -> dict[tuple[str, int], int]:
        return wire.offset_commit(group, offsets, **kw)

    assert commit(generation_id=generation, member_id=member) == {(TOPIC, 0): ErrorCode.none}
    assert commit(generation_id=generation + 1, member_id=member) == {
        (TOPIC, 0): ErrorCode.illegal_generation
    }
    assert commit(generation_id=generation, member_id="ghost") == {(TOPIC, 0): ErrorCode.unknown_member_id}
    # A standalone commit (no generation, no member) is refused while the group has members.
    assert commit() == {(TOPIC, 0): ErrorCode.unknown_member_id}
    assert commit(version=2) == {(TOPIC, 0): ErrorCode.unknown_member_id}
    # Per-partition errors: an unknown topic or partition, and metadata over offset.metadata.max.bytes.
    mixed = {
        (TOPIC, 0): (2, "ok"),
        (TOPIC, 9): (2, None),
        ("no-such-topic", 0): (2, None),
        (TOPIC, 1): (2, "m" * 4097),
    }
    assert commit(mixed, generation_id=generation, member_id=member) == {
        (TOPIC, 0): ErrorCode.none,
        (TOPIC, 9): ErrorCode.unknown_topic_or_partition,
        ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition,
        (TOPIC, 1): ErrorCode.offset_metadata_too_large,
    }
    wire.leave_group(group, (member, None))
    # Once the group is empty, a standalone commit is accepted.
    assert commit() == {(TOPIC, 0): ErrorCode.none}


def test_offset_fetch_v8_plus_fetches_several_groups_at_once(wire: GroupWire) -> None:
    g1, g2, unknown = unique("multi-1"), unique("multi-2"), unique("multi-none")
    wire.offset_commit(g1, {(TOPIC, 0): (100, "g1-p0"), (TOPIC, 1): (101, "g1-p1")})
    wire.offset_commit(g2, {(TOPIC, 2): (200, "g2-p2"), (OTHER_TOPIC, 0): (300, "g2-other")})
    for version in (8, 9):
        for require_stable in (False, True):  # no transactions, so nothing is ever unstable
            response = wire.offset_fetch(
                {g1: {TOPIC: [0, 2]}, g2: None, unknown: {TOPIC: [0]}},
                version=version,
                require_stable=require_stable,
            )
            by_group = {
                g.group_id: (
                    g.error_code,
                    {
                        (t.name, p.partition_index): (p.committed_offset, p.metadata, p.error_code)
                        for t in g.topics
                        for p in t.partitions
                    },
                )
                for g in response.groups
            }
            assert by_group == {
                g1: (ErrorCode.none, {(TOPIC, 0): (100, "g1-p0", 0), (TOPIC, 2): (-1, "", 0)}),
                g2: (ErrorCode.none, {(TOPIC, 2): (200, "g2-p2", 0), (OTHER_TOPIC, 0): (300, "g2-other", 0)}),
                unknown: (ErrorCode.none, {(TOPIC, 0): (-1, "", 0)}),
            }
    # All partitions of an unknown group: none, and no error.
    (result,) = wire.offset_fetch({unknown: None}).groups
    assert (result.error_code, result.topics) == (ErrorCode.none, ())
    # v2-v7: a null topic list also means every committed partition.
    for version in range(2, 8):
        topics = wire.offset_fetch({g2: None}, version=version).topics
        assert {(t.name, p.partition_index) for t in topics for p in t.partitions} == {
            (TOPIC, 2),
            (OTHER_TOPIC, 0),
        }


def test_deleting_a_topic_deletes_its_committed_offsets(wire: GroupWire, bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient

    doomed, group = unique("doomed-topic"), unique("doomed-offsets")
    assert wire.create_topic(doomed, partitions=2) == ErrorCode.none
    assert set(
        wire.offset_commit(
            group, {(doomed, 0): (5, "a"), (doomed, 1): (6, "b"), (TOPIC, 0): (7, "c")}
        ).values()
    ) == {0}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([doomed])[doomed].result(10)
    (answer,) = wire.offset_fetch({group: None}).groups
    assert {(t.name, p.partition_index): p.committed_offset for t in answer.topics for p in t.partitions} == {
        (TOPIC, 0): 7
    }


def test_offset_delete(connect: Connect) -> None:
    wire = connect()
    empty, active, unknown = unique("del-empty"), unique("del-active"), unique("del-unknown")
    wire.offset_commit(empty, {(TOPIC, 0): (1, None), (TOPIC, 1): (2, None)})
    response = wire.offset_delete(empty, {TOPIC: [0, 2]})  # partition 2 has no offset: still no error
    assert response.error_code == ErrorCode.none
    assert [(p.partition_index, p.error_code) for p in response.topics[0].partitions] == [
        (0, ErrorCode.none),
        (2, ErrorCode.none),
    ]
    fetched = wire.offset_fetch({empty: None}).groups[0].topics
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in fetched] == [(TOPIC, [1])]

    assert wire.offset_delete(unknown, {TOPIC: [0]}).error_code == ErrorCode.group_id_not_found

    # A consumer group with members: offsets of the topics it subscribes to stay; others may go.
    member, generation = single_member_group(wire, active)
    wire.offset_commit(
        active,
        {(TOPIC, 0): (5, None), (OTHER_TOPIC, 0): (6, None)},
        generation_id=generation,
        member_id=member,
    )
    response = wire.offset_delete(active, {TOPIC: [0], OTHER_TOPIC: [0]})
    assert response.error_code == ErrorCode.none
    assert {(t.name, p.error_code) for t in response.topics for p in t.partitions} == {
        (TOPIC, ErrorCode.group_subscribed_to_topic),
        (OTHER_TOPIC, ErrorCode.none),
    }
    remaining = wire.offset_fetch({active: None}).groups[0].topics
    assert [t.name for t in remaining] == [TOPIC]
    wire.leave_group(active, (member, None))

    # A group of another protocol type with members: the broker cannot tell what it uses.
    other = unique("del-connect")
    member, generation = single_member_group(wire, other, [("v1", b"")], protocol_type="connect")
    wire.offset_commit(other, {(TOPIC, 0): (5, None)}, generation_id=generation, member_id=member)
    assert wire.offset_delete(other, {TOPIC: [0]}).error_code == ErrorCode.non_empty_group
    wire.leave_group(other, (member, None))


# --- admin APIs --------------------------------------------------------------------------


def test_describe_groups_every_version(connect: Connect) -> None:
    wire = connect("describer")
    group, missing = unique("describe"), unique("describe-missing")
    joined = wire.join_group(group, "", RANGE, group_instance_id="desc-1")
    member = joined.member_id
    wire.request(wire.sync_group_request(group, joined.generation_id, member, {member: b"asg"}))
    for version in range(7):
        found, absent = wire.describe_groups(group, missing, version=version).groups
        assert (found.error_code, found.group_id, found.group_state) == (ErrorCode.none, group, "Stable")
        assert (found.protocol_type, found.protocol_data) == ("consumer", "range")
        (m,) = found.members
        assert (m.member_id, m.client_id, m.client_host) == (member, "describer", "/127.0.0.1")
        assert (m.member_metadata, m.member_assignment) == (RANGE[0][1], b"asg")
        if version >= 4:
            assert m.group_instance_id == "desc-1"
        # An unknown group is described as Dead; v6 also says it was not found.
        assert (absent.group_id, absent.group_state, absent.members) == (missing, "Dead", ())
        expected = ErrorCode.group_id_not_found if version >= 6 else ErrorCode.none
        assert absent.error_code == expected
    wire.leave_group(group, ("", "desc-1"))


def test_describe_a_group_between_generations_shows_no_protocol(wire: GroupWire) -> None:
    # GroupMetadataManager.describeGroups: outside Stable, protocol_data is "" and members carry
    # neither metadata nor assignment.
    group = unique("describe-rebalancing")
    member = new_member_id(wire, group)
    assert wire.join_group(group, member, RANGE).error_code == ErrorCode.none  # not synced yet
    state = described(wire, group)
    assert state.group_state == "CompletingRebalance"
    assert state.protocol_type == "consumer"
    assert [(m.member_id, m.member_metadata, m.member_assignment) for m in state.members] == [
        (member, b"", b"")
    ]
    assert state.protocol_data == ""
    wire.leave_group(group, (member, None))


def test_list_groups_every_version_with_state_and_type_filters(connect: Connect) -> None:
    wire = connect()
    stable, empty = unique("list-stable"), unique("list-empty")
    member, _ = single_member_group(wire, stable)
    wire.offset_commit(empty, {(TOPIC, 0): (1, None)})  # a standalone group: Empty, no protocol type
    mine = {stable, empty}

    def listed(**kw: Any) -> dict[str, tuple[str, ...]]:
        response = wire.list_groups(**kw)
        assert response.error_code == ErrorCode.none
        return {
            g.group_id: tuple(
                getattr(g, f) for f in ("protocol_type", "group_state", "group_type") if hasattr(g, f)
            )
            for g in response.groups
            if g.group_id in mine
        }

    for version in range(6):
        expected = {stable: ("consumer", "Stable", "classic"), empty: ("", "Empty", "classic")}
        fields = 1 if version < 4 else 2 if version == 4 else 3
        assert listed(version=version) == {g: v[:fields] for g, v in expected.items()}
    for version in (4, 5):
        assert set(listed(version=version, states=["Stable"])) == {stable}
        assert set(listed(version=version, states=["empty"])) == {empty}  # case does not matter
        assert set(listed(version=version, states=["Stable", "Empty"])) == mine
        assert listed(version=version, states=["Dead"]) == {}
    assert set(listed(types=["classic"])) == mine
    assert set(listed(types=["Classic"], states=["STABLE"])) == {stable}
    assert listed(types=["consumer"]) == {}  # KIP-848 groups: none here
    wire.leave_group(stable, (member, None))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_delete_groups_every_version(wire: GroupWire, version: int) -> None:
    active, empty, missing = unique("dg-active"), unique("dg-empty"), unique("dg-missing")
    member, _ = single_member_group(wire, active)
    wire.offset_commit(empty, {(TOPIC, 0): (42, "gone soon")})
    assert wire.delete_groups(active, empty, missing, "", version=version) == {
        active: ErrorCode.non_empty_group,
        empty: ErrorCode.none,
        missing: ErrorCode.group_id_not_found,
        "": ErrorCode.invalid_group_id,
    }
    assert described(wire, empty).error_code == ErrorCode.group_id_not_found
    partition = wire.offset_fetch({empty: {TOPIC: [0]}}).groups[0].topics[0].partitions[0]
    assert partition.committed_offset == -1
    # Once its members leave, the group can be deleted; a second delete finds nothing.
    wire.leave_group(active, (member, None))
    assert wire.delete_groups(active, version=version) == {active: ErrorCode.none}
    assert wire.delete_groups(active, version=version) == {active: ErrorCode.group_id_not_found}
