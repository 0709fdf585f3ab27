"""The `strom` client commands end to end against a real broker: topics, configs, offsets,
delete-records, produce and consume, their errors, and --help everywhere. Commands run in-process
through strom.cli.main.main (fast); a few run as the real `strom` console script."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer as CKProducer

from brokerproc import HOST, STROM, free_port
from strom import __version__ as strom_version
from strom.cli.main import build_parser, main
from strom.client.admin import AdminClient, NewTopic, OffsetSpec
from strom.client.cluster import TopicPartition
from strom.records.batch import CompressionType

BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}


@dataclass
class Result:
    code: int
    out: str
    err: str


Strom = Callable[..., Result]


@pytest.fixture()
def strom(capsys: pytest.CaptureFixture[str], bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Strom:
    """Run `strom ARGV... --bootstrap-server <the broker>` in-process; stdin may be given as bytes."""

    def run(*argv: str, stdin: bytes | None = None, connect: bool = True) -> Result:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        args = [*argv, "--bootstrap-server", bootstrap] if connect else list(argv)
        root = logging.getLogger()
        saved = root.handlers[:], root.level  # main() configures logging for a whole process
        capsys.readouterr()
        try:
            code = main(args)
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


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def assert_one_line_error(result: Result, *fragments: str, code: int = 1) -> None:
    assert result.code == code, result
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    for fragment in fragments:
        assert fragment in result.err, result.err


def rows(out: str) -> list[list[str]]:
    """A printed table's data rows, split on whitespace (the header dropped)."""
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


# -- help and argument errors ----------------------------------------------------------------


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield path
    for action in actions:
        for name, sub in action.choices.items():
            yield from _leaf_parsers(sub, (*path, name))


def test_help_on_every_command(strom: Strom) -> None:
    paths = list(_leaf_parsers(build_parser()))
    for expected in (
        ("topics", "create"),
        ("groups", "reset-offsets"),
        ("consume",),
        ("produce",),
        ("offsets",),
    ):
        assert expected in paths
    for path in paths:
        result = strom(*path, "--help", connect=False)
        assert result.code == 0 and result.out.startswith(f"usage: strom {' '.join(path)}".rstrip()), path
        assert len(result.out) > 200, path  # a description, not just the usage line


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["topics", "create", "t", "--partitions", "zero"], "expected a whole number"),
        (["topics", "create"], "the following arguments are required: TOPIC (or --topic)"),
        (["topics", "frobnicate"], "invalid choice"),
        (
            ["groups", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"],
            "not allowed with",
        ),
        (["groups", "reset-offsets", "g", "--to-datetime", "yesterday", "--all-topics"], "ISO-8601"),
        (["consume", "t", "--format", "%x"], "unknown format token %x"),
        (["topics", "list", "--property", "nonsense"], "expected key=value"),
    ],
)
def test_bad_arguments_are_one_line(strom: Strom, argv: list[str], fragment: str) -> None:
    result = strom(*argv, connect=False)
    assert_one_line_error(result, fragment, "(see --help)", code=2)
    # Named by the (sub)command that refused; the hint only once.
    assert re.match(rf"strom {argv[0]}( {argv[1]})?: error: ", result.err), result.err
    assert result.err.count("--help") == 1


def test_version(strom: Strom) -> None:
    result = strom("--version", connect=False)
    assert (result.code, result.out) == (0, f"strom {strom_version}\n")


def test_config_a_command_does_not_know_is_refused(strom: Strom) -> None:
    assert_one_line_error(
        strom("topics", "list", "--property", "linger.ms=5"),
        "linger.ms: not a config of this command's admin client",
        code=2,
    )


@pytest.mark.parametrize(
    "argv",
    [["produce", "orders"], ["consume", "orders"], ["topics", "list"], ["groups", "list"], ["cluster"]],
)
def test_unreachable_cluster_is_reported_alike_and_fast(strom: Strom, argv: list[str]) -> None:
    """Every command says the same within seconds (the producer used to wait max.block.ms, 15 s,
    and blame metadata); the clients' own timeouts are left at their 15 s defaults here."""
    address = f"{HOST}:{free_port()}"
    started = time.monotonic()
    result = strom(*argv, "--bootstrap-server", address, stdin=b"a\n", connect=False)
    assert time.monotonic() - started < 5
    command = " ".join(argv[:2] if argv[0] in ("topics", "groups") else argv[:1])
    assert_one_line_error(
        result, f"strom {command}: error: cannot reach the cluster at {address} (connection refused)"
    )


def test_command_config_file(strom: Strom, tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("# comments are skipped\nclient.id = from-file\ndefault.api.timeout.ms: 5000\n")
    assert strom("topics", "list", "--command-config", str(config)).code == 0
    bad = tmp_path / "bad.properties"
    bad.write_text("request.timeout.ms=soon\n")
    assert_one_line_error(strom("topics", "list", "--command-config", str(bad)), "request.timeout.ms")
    assert_one_line_error(
        strom("topics", "list", "--command-config", str(tmp_path / "missing")), "cannot read"
    )


# -- topics ----------------------------------------------------------------------------------


def test_topics_create_list_describe_alter_delete(strom: Strom, admin: AdminClient) -> None:
    name = unique("cli-topic")
    created = strom("topics", "create", name, "--partitions", "3", "--config", "retention.ms=3600000")
    assert (created.code, created.out) == (0, f"Created topic {name}.\n")
    assert name in strom("topics", "list").out.splitlines()

    described = strom("topics", "describe", name)
    assert described.code == 0
    head, *partitions = described.out.splitlines()
    topic_id = admin.describe_topics([name])[name].topic_id
    assert head == (
        f"Topic: {name}\tTopicId: {topic_id}\tPartitionCount: 3\tReplicationFactor: 1\tConfigs: retention.ms=3600000"
    )
    node = admin.describe_cluster().nodes[0].node_id
    assert partitions == [
        f"\tTopic: {name}\tPartition: {p}\tLeader: {node}\tReplicas: {node}\tIsr: {node}" for p in range(3)
    ]
    # A healthy single broker has no under-replicated or unavailable partitions.
    for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
        assert strom("topics", "describe", name, flag) == Result(0, "", "")
    assert f"Topic: {name}\t" in strom("topics", "describe").out  # no names: every topic

    assert strom("topics", "alter", name, "--partitions", "5").code == 0
    assert len(admin.describe_topics([name])[name].partitions) == 5
    assert_one_line_error(strom("topics", "alter", name, "--partitions", "2"), "has 5 partitions")

    assert_one_line_error(strom("topics", "create", name), "TOPIC_ALREADY_EXISTS")
    assert strom("topics", "create", name, "--if-not-exists") == Result(0, "", "")

    assert strom("topics", "delete", name).out == f"Deleted topic {name}.\n"
    assert name not in admin.list_topics()
    assert_one_line_error(strom("topics", "describe", name), "UNKNOWN_TOPIC_OR_PARTITION", name)
    assert_one_line_error(strom("topics", "delete", name), "UNKNOWN_TOPIC_OR_PARTITION")
    assert strom("topics", "delete", name, "--if-exists").code == 0


def test_topics_create_with_bad_config(strom: Strom) -> None:
    assert_one_line_error(
        strom("topics", "create", unique("bad"), "--config", "cleanup.policy=shred"), "INVALID_CONFIG"
    )


# -- configs ---------------------------------------------------------------------------------


def test_configs_describe_and_alter(strom: Strom, admin: AdminClient) -> None:
    name = unique("cli-configs")
    admin.create_topics([NewTopic(name, 1, 1, {"retention.ms": "60000"})])
    entity = ("--entity-type", "topics", "--entity-name", name)
    described = strom("configs", "describe", *entity)
    assert (
        described.out == f"Dynamic configs for topic {name}:\n  retention.ms=60000  (DYNAMIC_TOPIC_CONFIG)\n"
    )
    assert (
        "  segment.bytes=1073741824  (DEFAULT_CONFIG)" in strom("configs", "describe", *entity, "--all").out
    )

    altered = strom(
        "configs",
        "alter",
        *entity,
        "--add-config",
        "max.message.bytes=2097152,cleanup.policy=[compact,delete]",
        "--delete-config",
        "retention.ms",
    )
    assert altered.out == f"Completed updating config for topic {name}.\n"
    assert strom("configs", "describe", *entity).out.splitlines()[1:] == [
        "  cleanup.policy=compact,delete  (DYNAMIC_TOPIC_CONFIG)",
        "  max.message.bytes=2097152  (DYNAMIC_TOPIC_CONFIG)",
    ]
    assert_one_line_error(
        strom("configs", "alter", *entity, "--add-config", "retention.ms=soon"), "INVALID_CONFIG"
    )
    assert_one_line_error(strom("configs", "alter", *entity), "nothing to change", code=2)
    # kafka-configs' shorthand.
    assert strom("configs", "describe", "--topic", name).out == strom("configs", "describe", *entity).out
    shorthand = strom("configs", "alter", "--topic", name, "--delete-config", "max.message.bytes")
    assert shorthand.out == f"Completed updating config for topic {name}.\n"
    assert "max.message.bytes" not in strom("configs", "describe", "--topic", name).out
    assert_one_line_error(
        strom("configs", "describe", "--topic", name, "--entity-type", "topics"), "give one of", code=2
    )
    assert_one_line_error(strom("configs", "describe"), "give --entity-type", code=2)

    node = admin.describe_cluster().nodes[0].node_id
    assert (
        strom("configs", "describe", "--entity-type", "brokers").out
        == f"Dynamic configs for broker {node}:\n"
    )
    brokers = strom("configs", "describe", "--entity-type", "brokers", "--all")
    assert brokers.out.startswith(f"All configs for broker {node}:\n")
    assert strom("configs", "describe", "--broker", str(node), "--all").out == brokers.out
    assert (
        "  group.initial.rebalance.delay.ms=0  (STATIC_BROKER_CONFIG read-only)" in brokers.out.splitlines()
    )
    assert_one_line_error(
        strom(
            "configs", "alter", "--entity-type", "brokers", "--entity-name", str(node), "--add-config", "a=b"
        ),
        "INVALID_REQUEST",
    )


# -- offsets and delete-records --------------------------------------------------------------


def produce_timestamped(bootstrap: str, topic: str, partition: int, timestamps: list[int]) -> None:
    producer = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i, ts in enumerate(timestamps):
        producer.produce(topic, f"v{i}".encode(), partition=partition, timestamp=ts)
    assert producer.flush(15) == 0


def test_offsets(strom: Strom, admin: AdminClient, bootstrap: str) -> None:
    name = unique("cli-offsets")
    admin.create_topics([NewTopic(name, 2, 1)])
    base = (int(time.time()) - 60) * 1000  # a whole second, recent enough for retention to keep
    produce_timestamped(bootstrap, name, 0, [base + i * 1000 for i in range(4)])
    assert rows(strom("offsets", name).out) == [[name, "0", "0", "4"], [name, "1", "0", "0"]]

    def iso(ms: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"

    at = strom("offsets", name, "--partition", "0", "--time", iso(base + 1500))
    assert (
        at.out
        == f"TOPIC{' ' * (len(name) - 3)}PARTITION  OFFSET  TIMESTAMP\n{name}  0          2       {iso(base + 2000)}\n"
    )
    by_ms = strom("offsets", name, "--partition", "0", "--time", str(base + 3000))
    assert rows(by_ms.out) == [[name, "0", "3", iso(base + 3000)]]
    assert rows(strom("offsets", name, "--time", "2099-01-01T00:00:00").out) == [
        [name, "0", "-1", "-"],
        [name, "1", "-1", "-"],
    ]
    assert rows(strom("offsets", name, "--partition", "1", "--time", "earliest").out) == [
        [name, "1", "0", "-"]
    ]
    newest = strom("offsets", name, "--partition", "0", "--time", "max-timestamp")
    assert rows(newest.out) == [[name, "0", "3", iso(base + 3000)]]
    assert_one_line_error(strom("offsets", name, "--partition", "5"), "has no partition 5")
    assert_one_line_error(strom("offsets", unique("nosuch")), "UNKNOWN_TOPIC_OR_PARTITION")


def test_delete_records(strom: Strom, admin: AdminClient, bootstrap: str, tmp_path: Path) -> None:
    name = unique("cli-delete")
    admin.create_topics([NewTopic(name, 2, 1)])
    now = int(time.time() * 1000)
    produce_timestamped(bootstrap, name, 0, [now] * 5)
    produce_timestamped(bootstrap, name, 1, [now] * 3)
    deleted = strom("delete-records", name, "--partition", "0", "--offset", "2")
    assert rows(deleted.out) == [[name, "0", "2"]]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": name, "partition": 1, "offset": 1}]}))
    assert rows(strom("delete-records", "--offset-json", str(plan)).out) == [[name, "1", "1"]]
    earliest = admin.list_offsets({TopicPartition(name, p): OffsetSpec.earliest() for p in (0, 1)})
    assert [earliest[TopicPartition(name, p)].offset for p in (0, 1)] == [2, 1]
    assert rows(strom("delete-records", name, "--offset", "-1").out) == [[name, "0", "5"], [name, "1", "3"]]

    assert_one_line_error(
        strom("delete-records", name, "--partition", "0", "--offset", "9"), "OFFSET_OUT_OF_RANGE"
    )
    plan.write_text('{"partitions": [{"topic": "t"}]}')
    assert_one_line_error(
        strom("delete-records", "--offset-json", str(plan)), "needs topic, partition and offset"
    )
    assert_one_line_error(strom("delete-records", "--offset", "1"), "give a TOPIC", code=2)


# -- produce and consume ---------------------------------------------------------------------


def stored(
    bootstrap: str, topic: str, partition: int
) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]:
    """(key, value, headers, compression) of every stored record, read with a raw Fetch."""
    from integration.clients_util import fetch_batches

    return [
        (r.key, r.value, list(r.headers), b.header.compression)
        for b in fetch_batches(bootstrap, topic, partition)
        for r in b.records
    ]


def test_produce_from_stdin_with_keys_and_headers(strom: Strom, admin: AdminClient, bootstrap: str) -> None:
    name = unique("cli-produce")
    admin.create_topics([NewTopic(name, 2, 1)])
    lines = b"user1:signed up\nuser2:logged in: twice\nno key here\n:empty key\r\n\n"
    produced = strom(
        "produce",
        name,
        "--key-separator",
        ":",
        "--header",
        "source=cli",
        "--header",
        "flag",
        "--partition",
        "1",
        "--compression",
        "gzip",
        stdin=lines,
    )
    assert produced == Result(0, "", "")
    headers = [("source", b"cli"), ("flag", None)]
    gzip = CompressionType.GZIP
    assert stored(bootstrap, name, 1) == [
        (b"user1", b"signed up", headers, gzip),
        (b"user2", b"logged in: twice", headers, gzip),
        (None, b"no key here", headers, gzip),
        (b"", b"empty key", headers, gzip),
        (None, b"", headers, gzip),
    ]
    assert stored(bootstrap, name, 0) == []


def test_produce_from_file_with_acks(
    strom: Strom, admin: AdminClient, bootstrap: str, tmp_path: Path
) -> None:
    name = unique("cli-file")
    admin.create_topics([NewTopic(name, 1, 1)])
    source = tmp_path / "lines.txt"
    source.write_bytes(b"a\nb\nc")
    assert strom("produce", name, "--file", str(source), "--acks", "1").code == 0
    assert [v for _k, v, _h, _c in stored(bootstrap, name, 0)] == [b"a", b"b", b"c"]
    assert_one_line_error(strom("produce", name, "--file", str(tmp_path / "missing")), "cannot read")
    assert_one_line_error(
        strom("produce", name, "--partition", "5", stdin=b"x\n"), f"topic '{name}' has no partition 5"
    )


@pytest.fixture()
def filled_topic(strom: Strom, admin: AdminClient) -> str:
    """Two partitions: partition 0 holds k0..k2 (headers h=0..2), partition 1 holds k3, k4."""
    name = unique("cli-consume")
    admin.create_topics([NewTopic(name, 2, 1)])
    for partition, keys in ((0, range(3)), (1, range(3, 5))):
        for i in keys:
            result = strom(
                "produce",
                name,
                "--partition",
                str(partition),
                "--key-separator",
                "=",
                "--header",
                f"h={i}",
                stdin=f"k{i}=value {i}\n".encode(),
            )
            assert result.code == 0, result
    return name


def test_consume_from_beginning_with_format(strom: Strom, filled_topic: str) -> None:
    result = strom(
        "consume",
        filled_topic,
        "--from-beginning",
        "--max-messages",
        "5",
        "--format",
        "%t|%p|%o|%k|%s|%h|%K|%S\\n",
    )
    assert result.code == 0, result
    assert sorted(result.out.splitlines()) == sorted(
        [f"{filled_topic}|0|{o}|k{o}|value {o}|h={o}|2|7" for o in range(3)]
        + [f"{filled_topic}|1|{o}|k{o + 3}|value {o + 3}|h={o + 3}|2|7" for o in range(2)]
    )


def test_consume_json(strom: Strom, filled_topic: str) -> None:
    result = strom(
        "consume", filled_topic, "--partition", "1", "--from-beginning", "--json", "--max-messages", "2"
    )
    documents = [json.loads(line) for line in result.out.splitlines()]
    assert [(d["partition"], d["offset"], d["key"], d["value"], d["headers"]) for d in documents] == [
        (1, 0, "k3", "value 3", [["h", "3"]]),
        (1, 1, "k4", "value 4", [["h", "4"]]),
    ]
    assert all(d["topic"] == filled_topic and d["timestamp_type"] == "CreateTime" for d in documents)
    assert all(abs(d["timestamp"] - time.time() * 1000) < 60_000 for d in documents)


def test_consume_offset_timestamp_partition(strom: Strom, filled_topic: str, admin: AdminClient) -> None:
    at_offset = strom(
        "consume",
        filled_topic,
        "--partition",
        "0",
        "--offset",
        "1",
        "--max-messages",
        "2",
        "--format",
        "%o %s\\n",
    )
    assert at_offset.out == "1 value 1\n2 value 2\n"
    from_end = strom(
        "consume",
        filled_topic,
        "--partition",
        "0",
        "--offset",
        "-1",
        "--max-messages",
        "1",
        "--format",
        "%k\\n",
    )
    assert from_end.out == "k2\n"
    second = admin.list_offsets({TopicPartition(filled_topic, 0): OffsetSpec.latest()})
    assert second[TopicPartition(filled_topic, 0)].offset == 3
    # Every record is newer than a minute ago; none is newer than an hour from now.
    recent = strom(
        "consume", filled_topic, "--timestamp", str(int(time.time() * 1000) - 60_000), "--max-messages", "5"
    )
    assert sorted(recent.out.splitlines()) == [f"value {i}" for i in range(5)]
    future = strom("consume", filled_topic, "--timestamp", "2099-01-01T00:00:00Z", "--timeout-ms", "300")
    assert future == Result(0, "", "")


def test_consume_idle_timeout_and_tail(strom: Strom, filled_topic: str) -> None:
    started = time.monotonic()
    assert strom("consume", filled_topic, "--timeout-ms", "400") == Result(0, "", "")  # from the end: nothing
    assert time.monotonic() - started < 5
    everything = strom("consume", filled_topic, "--from-beginning", "--timeout-ms", "1000")
    assert len(everything.out.splitlines()) == 5


def test_consume_with_group_commits_what_it_printed(
    strom: Strom, filled_topic: str, admin: AdminClient
) -> None:
    group = unique("cli-group")
    first = strom("consume", filled_topic, "--group", group, "--from-beginning", "--max-messages", "3")
    assert first.code == 0 and len(first.out.splitlines()) == 3
    committed = admin.list_consumer_group_offsets(group)
    assert sum(o.offset for o in committed.values()) == 3
    # --from-beginning only where the group has no offset: a partition the first run never read.
    # A short fetch wait: a partition positioned while a fetch waits at another's end joins the next fetch.
    rest = strom(
        "consume",
        filled_topic,
        "--group",
        group,
        "--from-beginning",
        "--timeout-ms",
        "1000",
        "--property",
        "fetch.max.wait.ms=100",
    )
    assert len(rest.out.splitlines()) == 2
    assert sorted(first.out.splitlines() + rest.out.splitlines()) == [f"value {i}" for i in range(5)]
    assert {tp.partition: o.offset for tp, o in admin.list_consumer_group_offsets(group).items()} == {
        0: 3,
        1: 2,
    }
    assert_one_line_error(
        strom("consume", filled_topic, "--group", group, "--partition", "0"), "drop --group", code=2
    )


def test_produce_failure_explains_the_error_code(strom: Strom, admin: AdminClient) -> None:
    name = unique("cli-small")
    admin.create_topics([NewTopic(name, 1, 1, {"max.message.bytes": "200"})])
    result = strom("produce", name, stdin=b"x" * 500 + b"\n")
    assert_one_line_error(
        result,
        "strom produce: error: 1 of 1 records were not written: ",
        "MESSAGE_TOO_LARGE",
        ": a record batch is larger than the topic's max.message.bytes",
    )


def test_consume_exit_at_end(strom: Strom, admin: AdminClient, bootstrap: str) -> None:
    """-e stops at the end of every partition (an empty one included), alone or in a group."""
    name = unique("cli-end")
    admin.create_topics([NewTopic(name, 3, 1)])
    producer = CKProducer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for partition, count in ((0, 3), (1, 2)):  # partition 2 stays empty
        for i in range(count):
            producer.produce(name, f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(10) == 0
    expected = sorted(["0-0", "0-1", "0-2", "1-0", "1-1"])
    for argv in (
        ("--from-beginning", "-e"),
        ("--from-beginning", "--exit-at-end", "--group", unique("cli-end-group")),
    ):
        started = time.monotonic()
        result = strom("consume", "--topic", name, *argv)
        assert result.code == 0, result
        assert sorted(result.out.splitlines()) == expected
        assert time.monotonic() - started < 10
    # From the end there is nothing to wait for.
    tail = strom("consume", name, "-e")
    assert (tail.code, tail.out) == (0, "")


def test_topic_option_wherever_a_topic_is_positional(
    strom: Strom, admin: AdminClient, tmp_path: Path
) -> None:
    name = unique("cli-alias")
    assert strom("topics", "create", "--topic", name, "--partitions", "1").out == f"Created topic {name}.\n"
    assert strom("topics", "alter", "--topic", name, "--partitions", "2").code == 0
    described = strom("topics", "describe", "--topic", name)
    assert described.out.startswith(f"Topic: {name}\t") and "PartitionCount: 2" in described.out
    assert strom("produce", "--topic", name, "--partition", "1", stdin=b"a\nb\n").code == 0
    offsets = strom("offsets", "--topic", name)
    assert rows(offsets.out) == [[name, "0", "0", "0"], [name, "1", "0", "2"]]
    consumed = strom("consume", "--topic", name, "--from-beginning", "--max-messages", "2")
    assert consumed.out == "a\nb\n"
    deleted = strom("delete-records", "--topic", name, "--partition", "1", "--offset", "1")
    assert rows(deleted.out) == [[name, "1", "1"]]
    # The same value twice is fine; two different ones are not.
    assert strom("offsets", name, "--topic", name).code == 0
    assert_one_line_error(
        strom("offsets", name, "--topic", "other"), "two different values for TOPIC", code=2
    )
    assert strom("topics", "delete", "--topic", name).out == f"Deleted topic {name}.\n"
    assert name not in admin.list_topics()


def test_cluster(strom: Strom, admin: AdminClient, bootstrap: str) -> None:
    described = admin.describe_cluster()
    (node,) = described.nodes
    text = strom("cluster")
    assert text.code == 0, text
    lines = text.out.splitlines()
    assert lines[:4] == [
        f"Cluster ID: {described.cluster_id}",
        f"Controller: {node.node_id}",
        "Under-replicated partitions: 0",
        "Offline partitions: 0",
    ]
    assert lines[5].split() == ["ID", "HOST", "PORT", "RACK", "CONTROLLER"]
    assert lines[6].split() == [str(node.node_id), node.host, str(node.port), "-", "*"]
    assert f"{node.address} (id: {node.node_id} rack: null) -> (" in lines
    listed = [re.fullmatch(r"\t(\w+)\((\d+)\): (\d+) to (\d+),?", line) for line in lines[9:-1]]
    assert all(listed) and lines[-1] == ")"
    versions = {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in listed if m}
    assert versions["Produce"][0] == 0 and versions["ApiVersions"][:2] == (18, 0)
    document = json.loads(strom("cluster", "--json").out)
    assert (document["cluster_id"], document["controller_id"]) == (described.cluster_id, node.node_id)
    (broker,) = document["brokers"]
    assert (broker["id"], broker["host"], broker["port"], broker["error"]) == (
        node.node_id,
        node.host,
        node.port,
        None,
    )
    assert {
        v["name"]: (v["api_key"], v["min_version"], v["max_version"]) for v in broker["api_versions"]
    } == versions
    brief = strom("cluster", "--no-api-versions")
    assert brief.out.splitlines() == lines[:7]


def test_bootstrap_from_the_environment_and_profiles(
    strom: Strom, bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("STROM_PROFILE", raising=False)
    nobody = f"{HOST}:{free_port()}"
    monkeypatch.setenv("STROM_BOOTSTRAP_SERVERS", bootstrap)
    assert strom("topics", "list", connect=False).code == 0
    # --bootstrap-server comes first.
    result = strom("topics", "list", "--bootstrap-server", nobody, connect=False)
    assert_one_line_error(result, f"cannot reach the cluster at {nobody}")
    monkeypatch.delenv("STROM_BOOTSTRAP_SERVERS")

    profiles = tmp_path / "strom"
    profiles.mkdir()
    # A profile's keys serve every command: linger.ms (a producer's) does not trouble the admin client.
    (profiles / "default.properties").write_text(f"bootstrap.servers={bootstrap}\nlinger.ms=5\n")
    (profiles / "elsewhere.properties").write_text(f"bootstrap.servers={nobody}\n")
    assert strom("topics", "list", connect=False).code == 0
    assert_one_line_error(strom("groups", "list", "--profile", "elsewhere", connect=False), nobody)
    monkeypatch.setenv("STROM_PROFILE", "elsewhere")
    assert_one_line_error(strom("topics", "list", connect=False), nobody)
    # The environment's address beats the profile's.
    monkeypatch.setenv("STROM_BOOTSTRAP_SERVERS", bootstrap)
    assert strom("topics", "list", connect=False).code == 0
    assert_one_line_error(
        strom("topics", "list", "--profile", "nosuch", connect=False),
        f"no client profile 'nosuch': {profiles / 'nosuch.properties'} does not exist",
        code=2,
    )


def test_consume_unknown_topic(strom: Strom, admin: AdminClient) -> None:
    name = unique("nosuch")
    assert_one_line_error(strom("consume", name, "--timeout-ms", "500"), f"topic '{name}' does not exist")
    assert name not in admin.list_topics()


# -- Kafka's and kcat's spellings ------------------------------------------------------------


def test_kafka_topics_spelling(strom: Strom, admin: AdminClient) -> None:
    """kafka-topics' --create/--list/--describe/--alter/--delete, wherever they stand among the options."""
    name = unique("cli-kafka-topics")
    created = strom("topics", "--create", "--topic", name, "--partitions", "2", "--replication-factor", "1")
    assert created == Result(0, f"Created topic {name}.\n", "")
    assert strom("topics", "--topic", name, "--create", "--if-not-exists").code == 0
    assert name in strom("topics", "--list").out.splitlines()
    assert strom("topics", "--alter", "--topic", name, "--partitions", "3").code == 0
    described = strom("topics", "--describe", "--topic", name)
    assert described.out.startswith(f"Topic: {name}\t") and "PartitionCount: 3" in described.out
    assert strom("topics", "--delete", "--topic", name).out == f"Deleted topic {name}.\n"
    assert name not in admin.list_topics()
    assert_one_line_error(
        strom("topics", "--create", "--list", "--topic", name),
        "strom topics: error: argument --list: not allowed with argument --create",
        code=2,
    )


def test_kafka_spelling_leaves_strom_spelling_alone() -> None:
    from strom.cli.topics import kafka_spelling

    assert kafka_spelling(["--log-level", "DEBUG", "topics", "--bootstrap-server", "b:9092", "--list"]) == [
        "--log-level", "DEBUG", "topics", "--list", "list", "--bootstrap-server", "b:9092",
    ]  # fmt: skip
    for argv in (["topics", "create", "--delete"], ["consume", "topics", "--list"], ["topics", "list"]):
        assert kafka_spelling(argv) == argv


def test_console_producer_properties(strom: Strom, admin: AdminClient, bootstrap: str) -> None:
    name = unique("cli-parse-key")
    admin.create_topics([NewTopic(name, 1, 1)])
    keyed = strom(
        "produce", "--topic", name, "--property", "parse.key=true", "--property", "key.separator=:",
        "--broker-list", bootstrap, stdin=b"alice:created\nno separator\n", connect=False,
    )  # fmt: skip
    assert keyed == Result(0, "", "")
    tabbed = strom("produce", name, "--property", "parse.key=true", stdin=b"bob\tpaid: twice\n")
    assert tabbed.code == 0, tabbed
    with_headers = strom(
        "produce", name, *("--property", "parse.headers=true", "--property", "parse.key=true"),
        *("--property", "null.marker=<null>"),
        stdin=b"source:web,trace:<null>\tcarol\tshipped\n\t<null>\tno headers\n",
    )  # fmt: skip
    assert with_headers.code == 0, with_headers
    assert [(k, v, h) for k, v, h, _ in stored(bootstrap, name, 0)] == [
        (b"alice", b"created", []),
        (None, b"no separator", []),
        (b"bob", b"paid: twice", []),
        (b"carol", b"shipped", [("source", b"web"), ("trace", None)]),
        (None, b"no headers", []),
    ]
    assert_one_line_error(
        strom("produce", name, "--property", "parse.key=yes", stdin=b"x\n"),
        "--property parse.key: expected true or false, got 'yes'",
        code=2,
    )


def test_console_consumer_properties(strom: Strom, filled_topic: str) -> None:
    shown = strom(
        "consume", filled_topic, "--partition", "1", "--from-beginning", "-e",
        *("--property", "print.key=true", "--property", "print.offset=true", "--property", "print.partition=true"),
        *("--property", "print.headers=true", "--property", "key.separator= | "),
    )  # fmt: skip
    assert shown.out == (
        "Partition:1 | Offset:0 | h:3 | k3 | value 3\nPartition:1 | Offset:1 | h:4 | k4 | value 4\n"
    ), shown
    stamped = strom(
        "consume", filled_topic, "--partition", "0", "--offset", "2", "-e",
        *("--property", "print.timestamp=true", "--property", "print.value=false"),
    )  # fmt: skip
    assert re.fullmatch(r"CreateTime:\d{13}\n", stamped.out), stamped
    assert_one_line_error(
        strom("consume", filled_topic, "--property", "print.kye=true"),
        "print.kye: not a config of this command's consumer nor one of its --property keys (print.timestamp,",
        "did you mean print.key?",
        code=2,
    )
    assert_one_line_error(
        strom("consume", filled_topic, "--property", "print.key=true", "--json"),
        "--property print.key formats the output as --format, -K and --json do: give one",
        code=2,
    )


def test_kcat_flags(strom: Strom, filled_topic: str, bootstrap: str) -> None:
    def kcat(*argv: str) -> Result:
        return strom("consume", "-b", bootstrap, "-t", filled_topic, *argv, connect=False)

    assert kcat("-p", "0", "-o", "beginning", "-e", "-f", "%p/%o %k=%s %S\\x21\\n").out == "".join(
        f"0/{o} k{o}=value {o} 7!\n" for o in range(3)
    )
    assert kcat("-p", "0", "-o", "1", "-c", "1").out == "value 1\n"
    assert kcat("-p", "0", "-o", "-1", "-e", "-K", "::").out == "k2::value 2\n"
    assert kcat("-p", "1", "-o", "beginning", "-c", "1", "-f", "%R%s").out == "\x00\x00\x00\x07value 3"
    assert kcat("-p", "1", "-o", f"s@{int(time.time() * 1000) - 60_000}", "-e").out == "value 3\nvalue 4\n"
    assert kcat("-o", "end", "-e") == Result(0, "", "")
    produced = strom(
        "produce",
        "-b",
        bootstrap,
        "-t",
        filled_topic,
        "-p",
        "1",
        "-K",
        "=",
        stdin=b"k5=value 5\n",
        connect=False,
    )
    assert produced.code == 0, produced
    assert kcat("-p", "1", "-o", "-1", "-e", "-f", "%k %s\\n").out == "k5 value 5\n"
    assert_one_line_error(
        kcat("-o", "begining"), "argument -o: expected beginning, end, N, -N or s@MS", code=2
    )


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["consume", "t", "--from-begining"], "unrecognized arguments: --from-begining (did you mean --from-beginning?)"),
        (["produce", "t", "--key-seperator=:"], "unrecognized arguments: --key-seperator=: (did you mean --key-separator?)"),
        (["topics", "create", "t", "--partitons", "3"], "unrecognized arguments: --partitons 3 (did you mean --partitions?)"),
        (["cluster", "up", "--brokerz", "3"], "unrecognized arguments: --brokerz 3 (did you mean --brokers?)"),
        (["consume", "t", "--nonsense"], "unrecognized arguments: --nonsense (see --help)"),
    ],
)  # fmt: skip
def test_a_misspelt_option_names_the_one_taken(strom: Strom, argv: list[str], fragment: str) -> None:
    result = strom(*argv, connect=False)
    assert_one_line_error(
        result,
        f"strom {' '.join(argv[: 2 if argv[0] in ('topics', 'cluster') else 1])}: error: ",
        fragment,
        code=2,
    )


def test_abbreviations_still_work(strom: Strom) -> None:
    """argparse's unique prefixes (allow_abbrev) are kept: --no-api-version is --no-api-versions."""
    result = strom("cluster", "--no-api-version", "--json")
    assert result.code == 0 and "api_versions" not in result.out, result


# -- the real console script -----------------------------------------------------------------


def test_console_script_round_trip(bootstrap: str) -> None:
    name = unique("cli-script")

    def run(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(STROM), *argv, "--bootstrap-server", bootstrap], input=stdin, capture_output=True, timeout=60
        )

    assert run("topics", "create", name, "--partitions", "1").stdout == f"Created topic {name}.\n".encode()
    assert run("produce", name, stdin=b"one\ntwo\n").returncode == 0
    consumed = run("consume", name, "--from-beginning", "--max-messages", "2", "--format", "%o:%s\\n")
    assert (consumed.returncode, consumed.stdout, consumed.stderr) == (0, b"0:one\n1:two\n", b"")
    failed = run("topics", "describe", unique("nosuch"))
    assert failed.returncode == 1 and failed.stdout == b""
    assert (
        failed.stderr.startswith(b"strom topics describe: error: topic") and failed.stderr.count(b"\n") == 1
    )
