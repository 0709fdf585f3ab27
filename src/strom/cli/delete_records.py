"""``strom delete-records``: move partitions' log start offsets forward, as ``kafka-delete-records`` does."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_connection_options,
    add_either,
    add_parser,
    admin_client,
    non_negative_int,
    print_table,
)
from strom.cli.offsets import partitions_of
from strom.client.cluster import TopicPartition

HIGH_WATERMARK = -1


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "delete-records",
        help="delete records before an offset",
        description="Delete every record before an offset in some partitions: their log start offset "
        "(low watermark) moves to that offset. --offset -1 deletes everything up to the high watermark. "
        "--offset-json takes kafka-delete-records' file:\n"
        '  {"version": 1, "partitions": [{"topic": "orders", "partition": 0, "offset": 100}]}\n\n'
        "examples:\n  strom delete-records orders --partition 0 --offset 100\n"
        "  strom delete-records --offset-json plan.json",
    )
    add_either(parser, "topic", required=False, help="the topic (with --offset)")
    parser.add_argument(
        "--partition",
        action="append",
        type=non_negative_int,
        metavar="P",
        help="a partition of TOPIC (repeatable; default: all)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--offset", type=int, metavar="N", help="delete the records before offset N (-1: all)"
    )
    source.add_argument("--offset-json", type=Path, metavar="FILE", help="topics, partitions and offsets")
    add_connection_options(parser)
    parser.set_defaults(func=_run)


def read_offset_json(path: Path) -> dict[TopicPartition, int]:
    try:
        document: Any = json.loads(path.read_text())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from exc
    entries = document.get("partitions") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CliError(
            f'{path}: expected {{"partitions": [{{"topic": ..., "partition": ..., "offset": ...}}]}}'
        )
    offsets: dict[TopicPartition, int] = {}
    for entry in entries:
        try:
            tp = TopicPartition(str(entry["topic"]), int(entry["partition"]))
            offset = int(entry["offset"])
        except (KeyError, TypeError, ValueError):
            raise CliError(
                f"{path}: each partition needs topic, partition and offset, got {entry!r}"
            ) from None
        if tp in offsets:
            raise CliError(f"{path}: partition {tp} appears twice")
        offsets[tp] = offset
    return offsets


def _run(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        if args.offset_json is not None:
            if args.topic is not None or args.partition:
                raise CliError("--offset-json names its own topics and partitions", exit_code=2)
            offsets = read_offset_json(args.offset_json)
        else:
            if args.topic is None:
                raise CliError("give a TOPIC with --offset", exit_code=2)
            if args.offset < HIGH_WATERMARK:
                raise CliError(
                    f"--offset is >= 0, or -1 for the high watermark; got {args.offset}", exit_code=2
                )
            offsets = dict.fromkeys(partitions_of(admin, args.topic, args.partition), args.offset)
        low_watermarks = admin.delete_records(offsets)
    print_table(
        ("TOPIC", "PARTITION", "LOW-WATERMARK"),
        [
            (tp.topic, tp.partition, low_watermarks[tp])
            for tp in sorted(offsets, key=lambda t: (t.topic, t.partition))
        ],
    )
    return 0
