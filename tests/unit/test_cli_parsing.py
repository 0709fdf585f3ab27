"""The `strom` commands' parsing and formatting, without a broker: timestamps, durations, partition
lists, config files, profiles and where the bootstrap servers come from, --topic/--group spellings,
reset plans, --format templates, JSON records, tables, one-line errors and error-code sentences."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from strom.cli.common import (
    CLI_TIMEOUTS,
    DEFAULT_BOOTSTRAP,
    CliError,
    HelpFormatter,
    bootstrap_servers,
    client_config,
    key_value,
    parse_datetime,
    parse_duration,
    parse_timestamp,
    print_table,
    read_properties,
    topic_partitions,
)
from strom.cli.configs import parse_add_config
from strom.cli.consume import compile_format, record_json, render
from strom.cli.delete_records import read_offset_json
from strom.cli.error_text import SENTENCES, explain
from strom.cli.groups import read_reset_plan
from strom.cli.main import build_parser
from strom.client.cluster import TopicPartition
from strom.client.config import ADMIN, PRODUCER
from strom.client.consumer import ConsumerRecord
from strom.client.errors import ErrorCode, KafkaException


@pytest.fixture(autouse=True)
def no_user_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own profiles and environment must not leak into these tests."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("STROM_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("STROM_PROFILE", raising=False)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("PT15M", 900_000),
        ("PT0.5S", 500),
        ("P1DT2H0.25S", 93_600_250),
        ("P2D", 172_800_000),
        ("pt1h30m", 5_400_000),
        ("-PT1M", -60_000),
        ("PT-90S", -90_000),
        ("PT1,5S", 1500),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["P", "PT", "P1DT", "1D", "P1H", "PT1D", "P1.5D", "30m", ""])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2024-05-01T12:00:00.000Z", 1_714_564_800_000),
        ("2024-05-01T12:00:00.250", 1_714_564_800_250),  # no zone: UTC, as in Kafka's tools
        ("2024-05-01T14:00:00+02:00", 1_714_564_800_000),
        ("2024-05-01", 1_714_521_600_000),
    ],
)
def test_parse_datetime(text: str, ms: int) -> None:
    assert parse_datetime(text) == ms
    assert parse_timestamp(text) == ms


def test_parse_timestamp_takes_milliseconds() -> None:
    assert parse_timestamp("1714564800000") == 1_714_564_800_000
    with pytest.raises(argparse.ArgumentTypeError, match="ISO-8601"):
        parse_timestamp("yesterday")


def test_topic_partitions() -> None:
    assert topic_partitions("orders") == ("orders", None)
    assert topic_partitions("orders:0,2,5") == ("orders", [0, 2, 5])
    for bad in (":0", "orders:a", "orders:", "orders:-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            topic_partitions(bad)


def test_key_value() -> None:
    assert key_value(" linger.ms = 5 ") == ("linger.ms", "5")
    assert key_value("a=b=c") == ("a", "b=c")
    for bad in ("novalue", "=x"):
        with pytest.raises(argparse.ArgumentTypeError):
            key_value(bad)


def test_parse_add_config() -> None:
    assert parse_add_config("retention.ms=1000,cleanup.policy=[compact,delete], segment.ms = 5") == {
        "retention.ms": "1000",
        "cleanup.policy": "compact,delete",
        "segment.ms": "5",
    }
    with pytest.raises(CliError, match="KEY=VALUE"):
        parse_add_config("retention.ms")


def test_read_properties(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("# a comment\n! another\n\nclient.id=cli\nrequest.timeout.ms: 5000\nretries 3\n")
    assert read_properties(path) == {"client.id": "cli", "request.timeout.ms": "5000", "retries": "3"}
    with pytest.raises(CliError, match="cannot read"):
        read_properties(tmp_path / "missing")


def _args(
    tmp_path: Path, properties: list[tuple[str, str]], file_text: str | None = None
) -> argparse.Namespace:
    config = None
    if file_text is not None:
        config = tmp_path / "c.properties"
        config.write_text(file_text)
    return argparse.Namespace(bootstrap_server="h:1", command_config=config, property=properties)


def test_client_config_precedence(tmp_path: Path) -> None:
    args = _args(tmp_path, [("client.id", "from-flag")], "client.id=from-file\nretries=2\n")
    config = client_config(args, ADMIN, {"retries": "9", "client.id": "default"})
    assert config == {
        "default.api.timeout.ms": CLI_TIMEOUTS["default.api.timeout.ms"],
        "retries": "2",
        "client.id": "from-flag",
        "bootstrap.servers": "h:1",
    }
    # Each client gets only the CLI timeouts it has.
    assert "default.api.timeout.ms" not in client_config(_args(tmp_path, []), PRODUCER)
    with pytest.raises(CliError, match=r"linger\.ms: not a config of this command's admin client"):
        client_config(_args(tmp_path, [("linger.ms", "5")]), ADMIN, kind="admin client")


def test_read_reset_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.csv"
    path.write_text("orders,0,5\n\norders,1,7\nother-group,orders,0,99\ng,orders,2,3\n")
    assert read_reset_plan(path, "g") == {
        TopicPartition("orders", 0): 5,
        TopicPartition("orders", 1): 7,
        TopicPartition("orders", 2): 3,
    }
    path.write_text("orders,zero,5\n")
    with pytest.raises(CliError, match=r"plan.csv:1: expected topic,partition,offset"):
        read_reset_plan(path, "g")
    path.write_text("other,orders,0,1\n")
    with pytest.raises(CliError, match="no offsets for group 'g'"):
        read_reset_plan(path, "g")


def test_read_offset_json(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps({"version": 1, "partitions": [{"topic": "t", "partition": 1, "offset": 10}]}))
    assert read_offset_json(path) == {TopicPartition("t", 1): 10}
    for text, message in (
        ("{", "is not JSON"),
        ('{"partitions": []}', "expected"),
        ('{"partitions": [{"topic": "t", "partition": 0}]}', "needs topic, partition and offset"),
        (
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 1}, {"topic": "t", "partition": 0, "offset": 2}]}',
            "appears twice",
        ),
    ):
        path.write_text(text)
        with pytest.raises(CliError, match=message):
            read_offset_json(path)


RECORD = ConsumerRecord(
    "orders", 2, 41, 1_714_564_800_000, 0, b"k1", b"hello", (("source", b"cli"), ("flag", None))
)


def test_format_tokens() -> None:
    pieces = compile_format(r"%t/%p@%o %k=%s [%h] %K %S %T%%\t|\n")
    assert render(pieces, RECORD) == b"orders/2@41 k1=hello [source=cli,flag] 2 5 1714564800000%\t|\n"
    tombstone = ConsumerRecord("t", 0, 0, 0, 0, None, None)
    assert render(compile_format("%k|%s|%K|%S|%h"), tombstone) == b"||-1|-1|"
    assert render(compile_format(r"plain \q text"), RECORD) == b"plain \\q text"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown format token %x"):
        compile_format("%x")


def test_record_json() -> None:
    document = json.loads(record_json(RECORD))
    assert document == {
        "topic": "orders",
        "partition": 2,
        "offset": 41,
        "timestamp": 1_714_564_800_000,
        "timestamp_type": "CreateTime",
        "key": "k1",
        "value": "hello",
        "headers": [["source", "cli"], ["flag", None]],
    }
    binary = ConsumerRecord("t", 0, 0, 0, 1, b"\xff\x00", None)
    document = json.loads(record_json(binary))
    assert (document["key"], document["value"], document["timestamp_type"]) == (
        {"base64": "/wA="},
        None,
        "LogAppendTime",
    )


def test_print_table(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(("TOPIC", "PARTITION", "LAG"), [("orders", 0, 12), ("o", 10, None)])
    assert capsys.readouterr().out == "TOPIC   PARTITION  LAG\norders  0          12\no       10         -\n"


def test_argument_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        build_parser().parse_args(["groups", "reset-offsets", "g", "--all-topics"])
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "strom groups reset-offsets: error: one of the arguments --to-earliest --to-latest --to-current "
        "--to-offset --to-datetime --shift-by --by-duration --from-file is required (see --help)\n"
    )


def test_help_formatter_wraps_paragraphs_and_keeps_examples() -> None:
    formatter = HelpFormatter("strom", width=40)
    text = "A long paragraph that must be wrapped to the width.\n\nexamples:\n  strom x --a --very-long-option-name\n"
    filled = formatter._fill_text(text, 40, "")
    assert filled.splitlines() == [
        "A long paragraph that must be wrapped to",
        "the width.",
        "",
        "examples:",
        "  strom x --a --very-long-option-name",
    ]


def test_serve_keeps_its_arguments() -> None:
    args = build_parser().parse_args(["serve", "server.properties", "--override", "num.partitions=3"])
    assert (args.command, args.config, args.override) == (
        "serve",
        Path("server.properties"),
        [("num.partitions", "3")],
    )
    assert args.log_level is None


def test_bootstrap_servers_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profiles = tmp_path / "config" / "strom"
    profiles.mkdir(parents=True)

    def args(flag: str | None = None, properties: list[tuple[str, str]] | None = None) -> argparse.Namespace:
        return argparse.Namespace(
            bootstrap_server=flag, command_config=None, property=properties or [], profile=None
        )

    assert bootstrap_servers(args()) == DEFAULT_BOOTSTRAP
    (profiles / "default.properties").write_text("bootstrap.servers=profile:1\nretries=4\nlinger.ms=9\n")
    assert bootstrap_servers(args()) == "profile:1"
    monkeypatch.setenv("STROM_BOOTSTRAP_SERVERS", "env:1")
    assert bootstrap_servers(args()) == "env:1"
    assert bootstrap_servers(args(properties=[("bootstrap.servers", "property:1")])) == "property:1"
    assert bootstrap_servers(args("flag:1", [("bootstrap.servers", "property:1")])) == "flag:1"
    # A profile's configs apply where the client knows them; flags still win.
    config = client_config(args(properties=[("retries", "7")]), ADMIN)
    assert (config["retries"], config["bootstrap.servers"], "linger.ms" in config) == ("7", "env:1", False)
    assert client_config(args(), PRODUCER)["linger.ms"] == "9"


def test_either_spelling_of_topics_and_groups(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    assert parse(["consume", "--topic", "t"]).topic == "t"
    assert parse(["consume", "t"]).topic == "t"
    assert parse(["topics", "delete", "a", "--topic", "b"]).topics == ["a", "b"]
    assert parse(["topics", "describe"]).topics in (None, [])
    assert parse(["groups", "reset-offsets", "--group", "g", "--topic", "t:0", "--to-latest"]).group == "g"
    args = parse(["groups", "delete", "--group", "g1", "--group", "g2"])
    assert (args.groups, args.command_prog) == (["g1", "g2"], "strom groups delete")
    for argv, message in (
        (["produce"], "strom produce: error: the following arguments are required: TOPIC (or --topic)"),
        (
            ["consume", "a", "--topic", "b"],
            "strom consume: error: two different values for TOPIC: 'a' and 'b'",
        ),
        (["groups", "delete"], "the following arguments are required: GROUP (or --group)"),
    ):
        with pytest.raises(SystemExit):
            parse(argv)
        assert message in capsys.readouterr().err


def test_every_error_code_has_a_sentence() -> None:
    missing = [code.name for code in ErrorCode if code != ErrorCode.none and code not in SENTENCES]
    assert missing == []
    error = KafkaException.from_code(ErrorCode.non_empty_group, "group 'g'")
    assert explain(error) == f"group 'g': NON_EMPTY_GROUP: {SENTENCES[ErrorCode.non_empty_group]}"
    assert explain(KafkaException("no code")) == "no code"


def test_leader_election_json_file() -> None:
    from strom.cli.leader_election import partitions_from_json
    from strom.client.cluster import TopicPartition

    parsed = partitions_from_json(
        '{"partitions": [{"topic": "a", "partition": 0}, {"topic": "b", "partition": 2}]}'
    )
    assert parsed == [TopicPartition("a", 0), TopicPartition("b", 2)]
    with pytest.raises(CliError):
        partitions_from_json('{"topics": []}')


def test_reassignment_json_round_trips_kafkas_format() -> None:
    from strom.cli.reassign import parse_broker_list, parse_reassignment, reassignment_json
    from strom.client.cluster import TopicPartition

    text = (
        '{"version":1,"partitions":[{"topic":"t","partition":1,"replicas":[2,3],"log_dirs":["any","any"]}]}'
    )
    parsed = parse_reassignment(json.loads(text))
    assert parsed == {TopicPartition("t", 1): [2, 3]}
    assert reassignment_json(parsed) == text
    assert parse_broker_list("1,2,3") == [1, 2, 3]
    with pytest.raises(CliError):
        parse_broker_list("1,1")
    with pytest.raises(CliError):
        parse_reassignment({"partitions": [{"topic": "t"}]})


def test_cli_parses_the_operator_commands() -> None:
    from strom.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["leader-election", "--election-type", "preferred", "--all-topic-partitions"])
    assert args.election_type == "PREFERRED" and args.all_topic_partitions
    args = parser.parse_args(["topics", "reassign", "--verify", "--reassignment-json-file", "p.json"])
    assert args.verify and str(args.reassignment_json_file) == "p.json"
    args = parser.parse_args(["topics", "describe", "--under-min-isr-partitions"])
    assert args.under_min_isr_partitions
    args = parser.parse_args(
        ["configs", "--entity-type", "brokers", "--entity-default", "--alter", "--add-config", "a=b"]
    )
    assert args.alter and args.entity_default and args.add_config == ["a=b"]
