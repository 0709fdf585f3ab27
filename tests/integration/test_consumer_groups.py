"""Consumer groups with real clients: confluent-kafka, kafka-python, aiokafka and Strom's own consumer,
each member in its own process (tests/integration/group_member.py), against one broker.

- A member killed with SIGKILL loses its partitions to the others within its session timeout,
  and with commits after processing no record is skipped.
- The range, roundrobin and cooperative-sticky assignors split the partitions completely and
  disjointly; cooperative-sticky moves only what it must when a member joins.
- A static member (group.instance.id) that restarts within its session timeout gets its
  partitions back, and nobody else rebalances.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from integration.clients_util import PYTHON_CLIENTS, create_topic
from integration.group_member import HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS, GroupWatch, Member

BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}

PARTITIONS = 6
ALL_PARTITIONS = frozenset(range(PARTITIONS))
SESSION_TIMEOUT = SESSION_TIMEOUT_MS / 1000
HEARTBEAT_INTERVAL = HEARTBEAT_INTERVAL_MS / 1000
# After the session expires, survivors hear of the rebalance at their next heartbeat, then
# JoinGroup and SyncGroup: well under a few heartbeat intervals on loopback.
REBALANCE_MARGIN = 3.0
# Processing time of each batch, between the report of its records and their commit: a window
# in which to kill a member that has processed records without committing them.
PROCESSING_MS = 300
# The member that is killed processes longer, so that the kill lands between its report of records
# and their commit however late a busy machine lets the test see that report.
VICTIM_PROCESSING_MS = 2000
# Start-up, joins and several rebalances of freshly started processes, on a busy machine.
SETTLE_TIMEOUT = 30.0
# How long a member must stay quiet to show that no rebalance happened: a rebalance reaches
# every member at its next heartbeat, so four heartbeat intervals leave room to spare.
QUIET_WINDOW = 4 * HEARTBEAT_INTERVAL

# The shapes range and roundrobin give 3 members of one 6-partition topic.
EXPECTED_SPLIT = {
    "range": {frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5})},
    "roundrobin": {frozenset({0, 3}), frozenset({1, 4}), frozenset({2, 5})},
}
# The third-party clients and Strom's consumer.
GROUP_CLIENTS = (*PYTHON_CLIENTS, "strom")
ASSIGNOR_CASES = [
    *(
        (client, assignor)
        for client in ("confluent", "kafka-python", "strom")
        for assignor in ("range", "roundrobin")
    ),
    ("confluent", "cooperative-sticky"),
    ("kafka-python", "cooperative-sticky"),
    ("strom", "cooperative-sticky"),
    # aiokafka has no cooperative assignor.
    ("aiokafka", "range"),
    ("aiokafka", "roundrobin"),
]


@pytest.fixture
def topic(bootstrap: str) -> str:
    name = f"groups-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, name, PARTITIONS)
    return name


@pytest.fixture
def group() -> str:
    return f"group-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def watch() -> Iterator[GroupWatch]:
    watch = GroupWatch()
    yield watch
    watch.close()


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def balanced(members: list[Member]) -> bool:
    """Every partition owned by exactly one member, and each member owns its even share."""
    owned = [m.owned for m in members]
    disjoint = sum(len(o) for o in owned) == PARTITIONS
    even = all(len(o) == PARTITIONS // len(members) for o in owned)
    return disjoint and even and frozenset().union(*owned) == ALL_PARTITIONS


def describe(admin: AdminClient, group: str) -> Any:
    description: Any = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return description


def broker_assignment(description: Any) -> dict[str, frozenset[int]]:
    """Each member's assignment as the broker stored it, by client id."""
    return {
        m.client_id: frozenset(tp.partition for tp in m.assignment.topic_partitions)
        for m in description.members
    }


def poll_until(probe: Callable[[], Any], condition: Callable[[Any], bool], timeout: float, what: str) -> Any:
    """Call probe until condition holds on its result; for state only a request can observe."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if condition(result):
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s; last: {result!r}"
        time.sleep(0.1)


class SequenceProducer:
    """Writes records whose values are their sequence numbers, round-robin over the partitions,
    from a thread, until stopped: a steady stream that a kill falls into the middle of."""

    def __init__(self, bootstrap: str, topic: str, interval: float = 0.01) -> None:
        self.delivered: dict[tuple[int, int], str] = {}
        self.errors: list[str] = []
        self._bootstrap = bootstrap
        self._topic = topic
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self._bootstrap, "linger.ms": 0})

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                self.delivered[(msg.partition(), msg.offset())] = msg.value().decode()
            else:
                self.errors.append(str(err))

        seq = 0
        while not self._stop.is_set():
            producer.produce(self._topic, value=str(seq), partition=seq % PARTITIONS, on_delivery=report)
            producer.poll(0)
            seq += 1
            self._stop.wait(self._interval)
        producer.flush(15)

    def stop(self) -> dict[tuple[int, int], str]:
        self._stop.set()
        self._thread.join(timeout=20)
        assert not self._thread.is_alive() and not self.errors, self.errors
        return self.delivered


def processing(member: Member) -> bool:
    """The member reported records and has not committed them yet."""
    outcomes = member.of("records", "committed", "commit-failed")
    return bool(outcomes) and outcomes[-1]["event"] == "records"


def offsets_by_partition(member: Member) -> dict[int, list[int]]:
    offsets: dict[int, list[int]] = {}
    for p, o, _ in member.records():
        offsets.setdefault(p, []).append(o)
    return offsets


def start_members(
    watch: GroupWatch,
    tmp_path: Path,
    bootstrap: str,
    topic: str,
    group: str,
    client: str,
    names: list[str],
    **kw: Any,
) -> list[Member]:
    return [
        Member(watch, tmp_path, client=client, bootstrap=bootstrap, topic=topic, group=group, name=name, **kw)
        for name in names
    ]


# ---------------------------------------------------------------- a member dies


@pytest.mark.parametrize("client", GROUP_CLIENTS)
def test_killed_member_partitions_move_and_no_record_is_skipped(
    client: str, admin: AdminClient, bootstrap: str, topic: str, group: str, watch: GroupWatch, tmp_path: Path
) -> None:
    names = [f"{client}-{i}" for i in range(3)]
    members = start_members(
        watch, tmp_path, bootstrap, topic, group, client, names[:1], commit_delay_ms=VICTIM_PROCESSING_MS
    ) + start_members(
        watch, tmp_path, bootstrap, topic, group, client, names[1:], commit_delay_ms=PROCESSING_MS
    )
    watch.wait_until(lambda: balanced(members), SETTLE_TIMEOUT, "3 members share 6 partitions")
    victim, survivors = members[0], members[1:]
    lost = victim.owned
    generation = max(m.generation or 0 for m in members)

    producer = SequenceProducer(bootstrap, topic)
    try:
        # Every member has committed on every partition it owns, and the victim dies while it
        # processes records it has not committed yet.
        watch.wait_until(
            lambda: all(m.owned <= m.committed().keys() for m in members) and processing(victim),
            20,
            "every member commits, and the victim is processing",
        )
        killed_at = victim.kill()
        watch.wait_until(
            lambda: balanced(survivors), SESSION_TIMEOUT + REBALANCE_MARGIN + 10, "survivors take over"
        )
        after_kill = [e for m in survivors for e in m.rebalances() if e["time"] > killed_at]
        detected = min(e["time"] for e in after_kill) - killed_at
        moved = max(e["time"] for e in after_kill) - killed_at
        print(
            f"\n{client}: killed member detected after {detected:.2f}s, partitions moved after {moved:.2f}s"
        )
        # Only the session timeout tells the broker that a member died: its last heartbeat was at
        # most one interval before the kill.
        assert SESSION_TIMEOUT - HEARTBEAT_INTERVAL <= detected <= moved <= SESSION_TIMEOUT + REBALANCE_MARGIN
        assert all((m.generation or 0) > generation for m in survivors), watch.describe()
        poll_until(
            lambda: broker_assignment(describe(admin, group)),
            lambda stored: stored == {m.name: m.owned for m in survivors},
            10,
            "the broker stores the survivors' assignment",
        )
        # The dead member's partitions get records written after the move, read by their new owners.
        watch.wait_until(
            lambda: lost <= {p for m in survivors for p, _, _ in m.records()},
            20,
            "survivors read the moved partitions",
        )
    finally:
        produced = producer.stop()

    # What the dead member processed but had no confirmed commit for must be read again; what it
    # committed is done. Everything else is the survivors' to read.
    committed = victim.committed()
    done = {(p, o): v for p, o, v in victim.records() if o < committed.get(p, 0)}

    def consumed() -> dict[tuple[int, int], str]:
        return done | {(p, o): v for m in survivors for p, o, v in m.records()}

    def missing() -> str:
        gone = sorted(produced.keys() - consumed().keys())
        reads = {m.name: [(p, min(o), max(o)) for p, o in offsets_by_partition(m).items()] for m in members}
        return f"every produced record is consumed; {len(gone)} missing: {gone[:30]}; read {reads}; dead member committed {committed}"

    watch.wait_until(lambda: produced.keys() <= consumed().keys(), 20, missing)
    got = consumed()
    assert {k: got[k] for k in produced} == produced
    # The new owners start at the committed offset: not before it (the commit was lost) and not past
    # what the dead member processed (the broker kept a commit nobody confirmed).
    processed = {p: o for p, o, _ in sorted(victim.records())}
    for p in lost:
        first = min(o for m in survivors for q, o, _ in m.records() if q == p)
        assert committed[p] <= first <= processed[p] + 1, (p, committed[p], first, processed[p])
    reread = sum(1 for p, o, _ in victim.records() if o >= committed.get(p, 0))
    print(f"{client}: {len(produced)} records, {reread} processed by the killed member without a commit")
    assert reread > 0


# ---------------------------------------------------------------- assignors


@pytest.mark.parametrize(("client", "assignor"), ASSIGNOR_CASES)
def test_assignor_splits_partitions(
    client: str,
    assignor: str,
    admin: AdminClient,
    bootstrap: str,
    topic: str,
    group: str,
    watch: GroupWatch,
    tmp_path: Path,
) -> None:
    names = [f"{client}-{assignor}-{i}" for i in range(3)]
    if assignor == "cooperative-sticky":
        members = assert_incremental_join(watch, tmp_path, bootstrap, topic, group, client, names)
    else:
        members = start_members(watch, tmp_path, bootstrap, topic, group, client, names, assignor=assignor)
        watch.wait_until(lambda: balanced(members), SETTLE_TIMEOUT, "3 members share 6 partitions")
        assert {m.owned for m in members} == EXPECTED_SPLIT[assignor]
    # The broker chose the members' common protocol and stored the leader's assignment for each.
    own_view = {m.name: m.owned for m in members}
    description = poll_until(
        lambda: describe(admin, group),
        lambda d: d.state == ConsumerGroupState.STABLE and broker_assignment(d) == own_view,
        10,
        "the broker describes the assignment the members hold",
    )
    assert description.partition_assignor == assignor


def assert_incremental_join(
    watch: GroupWatch, tmp_path: Path, bootstrap: str, topic: str, group: str, client: str, names: list[str]
) -> list[Member]:
    """Two members share 6 partitions; a third joins. Each old member gives up one partition and
    keeps two; a partition it keeps is never revoked, not even for a moment."""
    old = start_members(
        watch, tmp_path, bootstrap, topic, group, client, names[:2], assignor="cooperative-sticky"
    )
    watch.wait_until(lambda: balanced(old), SETTLE_TIMEOUT, "2 members share 6 partitions")
    before = {m.name: m.owned for m in old}
    seen = {m.name: len(m.rebalances()) for m in old}
    (new,) = start_members(
        watch, tmp_path, bootstrap, topic, group, client, names[2:], assignor="cooperative-sticky"
    )
    members = [*old, new]
    watch.wait_until(lambda: balanced(members), SETTLE_TIMEOUT, "3 members share 6 partitions")
    for m in old:
        kept = m.owned
        assert kept < before[m.name] and len(kept) == 2, m.describe()
        for callback in m.rebalances()[seen[m.name] :]:
            assert callback["event"] != "lost", m.describe()
            if callback["event"] == "revoked":
                assert set(callback["partitions"]) <= new.owned, m.describe()
            else:
                assert not set(callback["partitions"]), m.describe()
    assert new.owned == frozenset().union(*before.values()) - frozenset().union(*(m.owned for m in old))
    return members


# ---------------------------------------------------------------- static membership


@pytest.mark.parametrize("client", GROUP_CLIENTS)
def test_static_member_restart_gets_its_partitions_back_without_rebalance(
    client: str, admin: AdminClient, bootstrap: str, topic: str, group: str, watch: GroupWatch, tmp_path: Path
) -> None:
    instance_ids = [f"{group}-instance-{i}" for i in range(3)]
    names = [f"{client}-static-{i}" for i in range(3)]

    def start(i: int, name: str) -> Member:
        (member,) = start_members(
            watch, tmp_path, bootstrap, topic, group, client, [name], instance_id=instance_ids[i]
        )
        return member

    # The first member leads the group: a restart of the leader and of a follower are both covered.
    leader = start(0, names[0])
    watch.wait_until(
        lambda: leader.owned == ALL_PARTITIONS, SETTLE_TIMEOUT, "the first member owns everything"
    )
    members = [leader, start(1, names[1]), start(2, names[2])]
    watch.wait_until(lambda: balanced(members), SETTLE_TIMEOUT, "3 static members share 6 partitions")
    watch.wait_until(lambda: len({m.generation for m in members}) == 1, 10, "one generation")
    generation = leader.generation
    assert generation is not None and generation > 0
    before = {i: m.owned for i, m in enumerate(members)}
    old_member_ids = {m.rebalances()[-1]["member_id"] for m in members}
    bystander = members[1]
    callbacks = len(bystander.rebalances())

    # A static member sends no LeaveGroup when it closes; a killed one sends nothing at all.
    members[2].kill()
    leader.close()
    restarted_at = time.monotonic()
    back = {0: start(0, f"{names[0]}-restarted"), 2: start(2, f"{names[2]}-restarted")}
    watch.wait_until(lambda: all(m.owned for m in back.values()), SESSION_TIMEOUT, "restarted members rejoin")
    took = max(m.rebalances()[-1]["time"] for m in back.values()) - restarted_at
    print(f"\n{client}: static members back with their partitions {took:.2f}s after the restart")
    for i, m in back.items():
        assert m.owned == before[i], m.describe()
        assert m.generation == generation, m.describe()

    time.sleep(QUIET_WINDOW)  # the bystander would hear of a rebalance at its next heartbeat
    assert len(bystander.rebalances()) == callbacks, bystander.describe()
    assert bystander.generation == generation
    # Nobody computes an assignment for a rejoining static member: the broker hands back the stored
    # one. (librdkafka's assignors cannot be watched; the python clients' and Strom's can.)
    assigned_at = [(m.name, e["time"]) for m in members + list(back.values()) for e in m.of("assignor-ran")]
    assert all(t < restarted_at for _, t in assigned_at), assigned_at

    description = describe(admin, group)
    assert description.state == ConsumerGroupState.STABLE
    assert {m.group_instance_id for m in description.members} == set(instance_ids)
    assert broker_assignment(description) == {m.name: m.owned for m in (bystander, *back.values())}
    new_member_ids = {m.rebalances()[-1]["member_id"] for m in back.values()}
    assert not new_member_ids & old_member_ids
    assert {m.member_id for m in description.members} == new_member_ids | {
        bystander.rebalances()[-1]["member_id"]
    }
