"""``strom offsets``: a topic's earliest and latest offsets, or the offsets for a time, per partition."""

from __future__ import annotations

import argparse

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_connection_options,
    add_either,
    add_parser,
    admin_client,
    format_timestamp,
    non_negative_int,
    parse_timestamp,
    print_table,
)
from strom.client.admin import AdminClient, OffsetSpec
from strom.client.cluster import TopicPartition

_NAMED_SPECS = {
    "earliest": OffsetSpec.earliest(),
    "latest": OffsetSpec.latest(),
    "max-timestamp": OffsetSpec.max_timestamp(),
}


def _offset_spec(text: str) -> OffsetSpec:
    named = _NAMED_SPECS.get(text.strip().lower())
    if named is not None:
        return named
    timestamp = parse_timestamp(text)
    if timestamp < 0:
        raise argparse.ArgumentTypeError(f"a timestamp is >= 0, got {text!r}")
    return OffsetSpec.for_timestamp(timestamp)


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "offsets",
        help="show partitions' earliest/latest offsets or the offset for a time",
        description="Without --time: each partition's earliest offset (log start) and latest offset "
        "(high watermark). With --time: the first offset whose timestamp is at or after that time "
        "(-1 if there is none), as kafka-get-offsets does.\n\n"
        "examples:\n  strom offsets orders\n  strom offsets orders --partition 0 --time 2024-05-01T12:00:00Z",
    )
    add_either(parser, "topic", help="the topic")
    parser.add_argument(
        "--partition",
        action="append",
        type=non_negative_int,
        metavar="P",
        help="only this partition (repeatable; default: all)",
    )
    parser.add_argument(
        "--time",
        type=_offset_spec,
        metavar="WHEN",
        help="earliest, latest, max-timestamp, ms since the epoch, or an ISO-8601 date-time (UTC unless it "
        "has a zone)",
    )
    parser.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_committed: latest is the last stable offset (default read_uncommitted)",
    )
    add_connection_options(parser)
    parser.set_defaults(func=_run)


def partitions_of(admin: AdminClient, topic: str, wanted: list[int] | None) -> list[TopicPartition]:
    """The topic's partitions (or the wanted ones, which must exist)."""
    existing = [p.partition for p in admin.describe_topics([topic])[topic].partitions]
    if wanted is None:
        return [TopicPartition(topic, p) for p in existing]
    missing = sorted(set(wanted) - set(existing))
    if missing:
        raise CliError(f"topic '{topic}' has no partition {missing[0]} (it has {len(existing)})")
    return [TopicPartition(topic, p) for p in sorted(set(wanted))]


def _run(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        partitions = partitions_of(admin, args.topic, args.partition)
        level = args.isolation_level
        rows: list[tuple[object, ...]]
        if args.time is not None:
            found = admin.list_offsets(dict.fromkeys(partitions, args.time), isolation_level=level)
            rows = [
                (tp.topic, tp.partition, found[tp].offset, format_timestamp(found[tp].timestamp))
                for tp in partitions
            ]
            headers = ("TOPIC", "PARTITION", "OFFSET", "TIMESTAMP")
        else:
            earliest = admin.list_offsets(
                dict.fromkeys(partitions, OffsetSpec.earliest()), isolation_level=level
            )
            latest = admin.list_offsets(dict.fromkeys(partitions, OffsetSpec.latest()), isolation_level=level)
            rows = [(tp.topic, tp.partition, earliest[tp].offset, latest[tp].offset) for tp in partitions]
            headers = ("TOPIC", "PARTITION", "EARLIEST", "LATEST")
    print_table(headers, rows)
    return 0
