"""`strom groups` end to end: list, describe (lag as confluent-kafka's AdminClient computes it),
delete, reset-offsets (every --to-* variant, dry run, execute, export and --from-file, refused for
an active group) and delete-offsets. Group state comes from confluent-kafka consumers."""

from __future__ import annotations

import io
import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKPartition
from confluent_kafka.admin import AdminClient as CKAdmin
from confluent_kafka.admin import OffsetSpec as CKOffsetSpec

from strom.cli.main import main
from strom.client.admin import AdminClient, NewTopic
from strom.client.cluster import TopicPartition

BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}
RECORDS = 10  # per partition, timestamps BASE + i s


@dataclass
class Result:
    code: int
    out: str
    err: str


Strom = Callable[..., Result]


@pytest.fixture()
def strom(capsys: pytest.CaptureFixture[str], bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Strom:
    def run(*argv: str, stdin: bytes | None = None) -> Result:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        root = logging.getLogger()
        saved = root.handlers[:], root.level  # main() configures logging for a whole process
        capsys.readouterr()
        try:
            code = main([*argv, "--bootstrap-server", bootstrap])
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            root.handlers[:], level = saved
            root.setLevel(level)
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap}) as client:
        yield client


@dataclass(frozen=True)
class Topic:
    name: str
    base: int  # timestamp of offset 0 in each partition


@pytest.fixture(scope="module")
def topic(admin: AdminClient, bootstrap: str) -> Topic:
    """Two partitions of RECORDS records each, the first 100 s ago, one per second."""
    name = f"groups-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 2, 1)])
    base = int(time.time() * 1000) - 100_000
    producer = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for partition in (0, 1):
        for i in range(RECORDS):
            producer.produce(
                name, f"{partition}-{i}".encode(), partition=partition, timestamp=base + i * 1000
            )
    assert producer.flush(15) == 0
    return Topic(name, base)


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def consumer(bootstrap: str, group: str, client_id: str = "cli-test") -> CKConsumer:
    return CKConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
    )


def join_and_commit(c: CKConsumer, topic: str, count: int) -> None:
    """Subscribe, read ``count`` records from wherever the group is, commit them."""
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 20
    while got < count and time.monotonic() < deadline:
        msg = c.poll(0.1)
        if msg is not None and msg.error() is None:
            got += 1
    assert got == count
    c.commit(asynchronous=False)


def set_committed(admin: AdminClient, group: str, topic: str, offsets: dict[int, int]) -> None:
    admin.alter_consumer_group_offsets(group, {TopicPartition(topic, p): o for p, o in offsets.items()})


def committed(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): o.offset for tp, o in admin.list_consumer_group_offsets(group).items()}


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


def assert_one_line_error(result: Result, *fragments: str, code: int = 1) -> None:
    assert result.code == code, result
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    for fragment in fragments:
        assert fragment in result.err, result.err


# -- list, describe, delete ------------------------------------------------------------------


def test_describe_shows_confluent_kafkas_lag(strom: Strom, topic: Topic, bootstrap: str) -> None:
    group = new_group()
    member = consumer(bootstrap, group, client_id="lag-client")
    try:
        join_and_commit(member, topic.name, 1)
        member.commit(
            offsets=[CKPartition(topic.name, 0, 3), CKPartition(topic.name, 1, 6)], asynchronous=False
        )
        ck = CKAdmin({"bootstrap.servers": bootstrap})
        (listing,) = ck.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
        ck_committed = {tp.partition: tp.offset for tp in listing.result(10).topic_partitions}
        ends = ck.list_offsets({CKPartition(topic.name, p): CKOffsetSpec.latest() for p in (0, 1)})
        ck_end = {tp.partition: future.result(10).offset for tp, future in ends.items()}
        ck_lag = {p: ck_end[p] - ck_committed[p] for p in ck_committed}
        assert ck_lag == {0: RECORDS - 3, 1: RECORDS - 6}

        offsets = strom("groups", "describe", group, "--offsets")
        assert offsets.code == 0, offsets
        lines = offsets.out.splitlines()
        assert lines[0].split() == [
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
        ]
        shown = {int(r[2]): r for r in table(offsets.out)}
        assert {p: int(r[5]) for p, r in shown.items()} == ck_lag
        assert {p: int(r[3]) for p, r in shown.items()} == ck_committed
        assert {p: int(r[4]) for p, r in shown.items()} == ck_end
        assert all(
            r[0] == group and r[1] == topic.name and r[7] == "/127.0.0.1" and r[8] == "lag-client"
            for r in shown.values()
        )
        assert shown[0][6] == shown[1][6] and shown[0][6].startswith("lag-client-")

        state = strom("groups", "describe", group, "--state")
        assert table(state.out) == [[group, f"{bootstrap}", "(0)", "range", "Stable", "1"]]
        members = strom("groups", "describe", group, "--members")
        assert table(members.out) == [
            [group, shown[0][6], "-", "/127.0.0.1", "lag-client", "2", f"{topic.name}(0,1)"]
        ]
        everything = strom("groups", "describe", group)
        assert everything.out == f"{state.out}\n{offsets.out}\n{members.out}"
        # Kafka's spelling of the same.
        assert strom("groups", "describe", "--group", group, "--state").out == state.out

        listed = strom("groups", "list")
        assert group in listed.out.splitlines()
        assert [group, "Stable"] in table(strom("groups", "list", "--state").out)
        assert group not in strom("groups", "list", "--state", "Empty").out

        # The error code comes with what it means here.
        assert_one_line_error(
            strom("groups", "delete", group),
            f"strom groups delete: error: group '{group}': NON_EMPTY_GROUP: the group still has active members",
        )
    finally:
        member.close()

    empty = strom("groups", "describe", group, "--offsets")
    assert empty.out.splitlines()[0] == f"Consumer group '{group}' has no active members."
    assert [r[6:] for r in table(empty.out.split("\n", 1)[1])] == [["-", "-", "-"], ["-", "-", "-"]]
    assert [group, "Empty"] in table(strom("groups", "list", "--state", "Empty").out)
    assert strom("groups", "delete", group).out == f"Deleted consumer group {group}.\n"
    assert_one_line_error(strom("groups", "describe", group), f"consumer group '{group}' does not exist")
    assert_one_line_error(strom("groups", "delete", group), "GROUP_ID_NOT_FOUND")


# -- reset-offsets ---------------------------------------------------------------------------


def test_reset_is_refused_for_an_active_group(
    strom: Strom, topic: Topic, bootstrap: str, admin: AdminClient
) -> None:
    group = new_group()
    member = consumer(bootstrap, group)
    try:
        join_and_commit(member, topic.name, 3)
        before = committed(admin, group)
        for mode in ("--dry-run", "--execute"):
            result = strom("groups", "reset-offsets", group, "--topic", topic.name, "--to-earliest", mode)
            assert_one_line_error(result, f"group '{group}' is Stable with 1 active member(s)")
            assert result.out == ""
        assert committed(admin, group) == before
    finally:
        member.close()


def test_dry_run_changes_nothing(strom: Strom, topic: Topic, admin: AdminClient) -> None:
    group = new_group()
    set_committed(admin, group, topic.name, {0: 4, 1: 6})
    for extra in ((), ("--dry-run",), ("--export",)):
        plan = strom("groups", "reset-offsets", group, "--topic", topic.name, "--to-earliest", *extra)
        assert plan.code == 0, plan
        if extra != ("--export",):
            assert plan.out.splitlines()[0].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
            assert table(plan.out) == [[group, topic.name, "0", "0"], [group, topic.name, "1", "0"]]
        else:
            assert plan.out == f"{topic.name},0,0\n{topic.name},1,0\n"  # the notice stays off stdout
        assert plan.err == (
            f"Dry run: the offsets of group '{group}' were not changed; add --execute to commit them.\n"
        )
        assert committed(admin, group) == {(topic.name, 0): 4, (topic.name, 1): 6}
    executed = strom(
        "groups", "reset-offsets", "--group", group, "--topic", topic.name, "--to-earliest", "--execute"
    )
    assert executed.code == 0 and executed.err == ""
    assert committed(admin, group) == {(topic.name, 0): 0, (topic.name, 1): 0}


def test_describe_all_groups(strom: Strom, topic: Topic, admin: AdminClient) -> None:
    first, second = sorted((new_group(), new_group()))
    set_committed(admin, first, topic.name, {0: 1})
    set_committed(admin, second, topic.name, {1: 2})
    result = strom("groups", "describe", "--all-groups", "--offsets")
    assert result.code == 0, result
    rows = {(r[0], r[2]): r[3:6] for r in table(result.out) if r[0] in (first, second)}
    assert rows == {
        (first, "0"): ["1", str(RECORDS), str(RECORDS - 1)],
        (second, "1"): ["2", str(RECORDS), str(RECORDS - 2)],
    }
    # The two groups' sections come in group order, each with its own header.
    assert result.out.index(f"{first} ") < result.out.index(f"{second} ")
    assert_one_line_error(strom("groups", "describe", first, "--all-groups"), "not both", code=2)
    assert_one_line_error(strom("groups", "describe"), "--all-groups", code=2)
    deleted = strom("groups", "delete", "--group", first, second)
    assert deleted.out == f"Deleted consumer group {first}.\nDeleted consumer group {second}.\n"


def reset(strom: Strom, group: str, *argv: str) -> dict[int, int]:
    """Run reset-offsets --execute; returns the new offsets it printed, by partition."""
    result = strom("groups", "reset-offsets", group, *argv, "--execute")
    assert result.code == 0, result
    return {int(r[2]): int(r[3]) for r in table(result.out)}


def test_every_reset_variant(strom: Strom, topic: Topic, admin: AdminClient) -> None:
    group, name = new_group(), topic.name
    start = {0: 4, 1: 6}
    scope = ("--topic", name)

    def check(expected: dict[int, int], *argv: str) -> None:
        set_committed(admin, group, name, start)
        assert reset(strom, group, *scope, *argv) == expected, argv
        assert committed(admin, group) == {(name, p): o for p, o in expected.items()}, argv

    check({0: 0, 1: 0}, "--to-earliest")
    check({0: RECORDS, 1: RECORDS}, "--to-latest")
    check(start, "--to-current")
    check({0: 7, 1: 7}, "--to-offset", "7")
    check({0: RECORDS, 1: RECORDS}, "--to-offset", "1000")  # clamped to the log end
    check({0: 1, 1: 3}, "--shift-by", "-3")
    check({0: 0, 1: 0}, "--shift-by", "-100")  # clamped to the log start
    check({0: 9, 1: RECORDS}, "--shift-by", "5")
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((topic.base + 5500) // 1000))
    millis = (topic.base + 5500) % 1000
    check({0: 6, 1: 6}, "--to-datetime", f"{iso}.{millis:03d}Z")
    check({0: RECORDS, 1: RECORDS}, "--to-datetime", "2099-01-01T00:00:00.000")  # nothing that late: log end
    # Half a second after offset 5's timestamp, however long ago the records were written.
    ago = int(time.time() * 1000) - (topic.base + 5500)
    check({0: 6, 1: 6}, "--by-duration", f"PT{ago / 1000:.3f}S")
    check({0: 0, 1: 0}, "--by-duration", "P1D")

    # Partition scope, and --to-current for a partition without a committed offset: the log end.
    set_committed(admin, group, name, start)
    admin.delete_consumer_group_offsets(group, [TopicPartition(name, 1)])
    assert reset(strom, group, "--topic", f"{name}:1", "--to-current") == {1: RECORDS}
    assert committed(admin, group) == {(name, 0): 4, (name, 1): RECORDS}
    # --all-topics: every partition the group has an offset for.
    assert reset(strom, group, "--all-topics", "--to-offset", "2") == {0: 2, 1: 2}


def test_reset_respects_the_log_start(strom: Strom, admin: AdminClient, bootstrap: str) -> None:
    group, name = new_group(), f"trimmed-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1)])
    assert strom("produce", name, stdin=b"".join(b"%d\n" % i for i in range(8))).code == 0
    admin.delete_records({TopicPartition(name, 0): 3})
    set_committed(admin, group, name, {0: 5})
    assert reset(strom, group, "--topic", name, "--to-earliest") == {0: 3}
    assert reset(strom, group, "--topic", name, "--to-offset", "1") == {0: 3}
    set_committed(admin, group, name, {0: 5})
    assert reset(strom, group, "--topic", name, "--shift-by", "-4") == {0: 3}


def test_export_and_from_file(strom: Strom, topic: Topic, admin: AdminClient, tmp_path: Path) -> None:
    group, name = new_group(), topic.name
    set_committed(admin, group, name, {0: 4, 1: 6})
    exported = strom("groups", "reset-offsets", group, "--topic", name, "--shift-by", "2", "--export")
    assert exported.out == f"{name},0,6\n{name},1,8\n"
    assert committed(admin, group) == {(name, 0): 4, (name, 1): 6}  # --export alone is a dry run
    plan = tmp_path / "plan.csv"
    plan.write_text(exported.out + f"{name},1,999\n")  # a later line wins; 999 is clamped
    assert reset(strom, group, "--from-file", str(plan)) == {0: 6, 1: RECORDS}
    assert committed(admin, group) == {(name, 0): 6, (name, 1): RECORDS}
    plan.write_text("not,a,plan\n")
    assert_one_line_error(
        strom("groups", "reset-offsets", group, "--from-file", str(plan)), "expected topic,partition,offset"
    )


def test_reset_an_unknown_group_creates_its_offsets(strom: Strom, topic: Topic, admin: AdminClient) -> None:
    group = new_group()
    assert reset(strom, group, "--topic", f"{topic.name}:0", "--to-latest") == {0: RECORDS}
    assert committed(admin, group) == {(topic.name, 0): RECORDS}


def test_reset_errors(strom: Strom, topic: Topic, admin: AdminClient) -> None:
    group = new_group()
    assert_one_line_error(
        strom("groups", "reset-offsets", group, "--to-earliest"), "give --topic or --all-topics", code=2
    )
    assert_one_line_error(
        strom("groups", "reset-offsets", group, "--topic", f"{topic.name}:0", "--shift-by", "1"),
        f"cannot shift the offset of {topic.name}-0",
    )
    assert_one_line_error(
        strom("groups", "reset-offsets", group, "--all-topics", "--to-latest"), "no committed offsets"
    )
    assert_one_line_error(
        strom("groups", "reset-offsets", group, "--topic", "nosuch-topic", "--to-latest"),
        "UNKNOWN_TOPIC_OR_PARTITION",
    )


# -- delete-offsets --------------------------------------------------------------------------


def test_delete_offsets(strom: Strom, topic: Topic, admin: AdminClient, bootstrap: str) -> None:
    group = new_group()
    set_committed(admin, group, topic.name, {0: 4, 1: 6})
    deleted = strom("groups", "delete-offsets", group, "--topic", f"{topic.name}:1")
    assert table(deleted.out) == [[topic.name, "1", "Successful"]]
    assert committed(admin, group) == {(topic.name, 0): 4}
    assert strom("groups", "delete-offsets", group, "--topic", topic.name).code == 0
    assert committed(admin, group) == {}

    member = consumer(bootstrap, group)
    try:
        join_and_commit(member, topic.name, 1)
        result = strom("groups", "delete-offsets", group, "--topic", topic.name)
        assert_one_line_error(result, "GROUP_SUBSCRIBED_TO_TOPIC")
    finally:
        member.close()
