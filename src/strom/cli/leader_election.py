"""``strom leader-election``: elect preferred (or unclean) leaders, as kafka-leader-election does."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_connection_options,
    add_parser,
    admin_client,
    non_negative_int,
)
from strom.client.admin import ElectionType
from strom.client.cluster import TopicPartition
from strom.protocol.errors import ErrorCode


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "leader-election",
        help="move partition leadership back to the preferred replicas",
        description="Ask the controller to elect leaders, as kafka-leader-election does: PREFERRED "
        "makes each partition's first replica its leader again (if it is alive and in sync).\n\n"
        "examples:\n"
        "  strom leader-election --election-type preferred --all-topic-partitions\n"
        "  strom leader-election --election-type preferred --topic orders --partition 0\n"
        '  strom leader-election --election-type preferred --path-to-json-file p.json  # {"partitions": '
        '[{"topic": "orders", "partition": 0}]}',
    )
    parser.add_argument(
        "--election-type",
        required=True,
        type=str.upper,
        choices=("PREFERRED", "UNCLEAN"),
        metavar="{preferred,unclean}",
        help="the kind of election",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-topic-partitions", action="store_true", help="every partition of every topic")
    which.add_argument("--topic", help="one topic (with --partition)")
    which.add_argument("--path-to-json-file", type=Path, help="the partitions, in Kafka's JSON format")
    parser.add_argument("--partition", type=non_negative_int, help="the partition of --topic")
    add_connection_options(parser)
    parser.set_defaults(func=_run)


def partitions_from_json(text: str) -> list[TopicPartition]:
    """kafka-leader-election's file: {"partitions": [{"topic": "t", "partition": 0}, ...]}."""
    try:
        document = json.loads(text)
        return [TopicPartition(str(p["topic"]), int(p["partition"])) for p in document["partitions"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CliError(
            f'the JSON file must be {{"partitions": [{{"topic": ..., "partition": ...}}]}}: {exc}'
        ) from exc


def _wanted(args: argparse.Namespace) -> list[TopicPartition] | None:
    if args.all_topic_partitions:
        return None
    if args.path_to_json_file is not None:
        return partitions_from_json(args.path_to_json_file.read_text())
    if args.partition is None:
        raise CliError("--topic needs --partition", exit_code=2)
    return [TopicPartition(args.topic, args.partition)]


def _run(args: argparse.Namespace) -> int:
    election = ElectionType[args.election_type]
    wanted = _wanted(args)
    with admin_client(args) as admin:
        outcomes = admin.elect_leaders(election, wanted)
    elected = sorted((tp for tp, e in outcomes.items() if e is None), key=str)
    not_needed = sorted(
        (tp for tp, e in outcomes.items() if e is not None and e.error_code == ErrorCode.election_not_needed),
        key=str,
    )
    failed = {
        tp: e for tp, e in outcomes.items() if e is not None and e.error_code != ErrorCode.election_not_needed
    }
    if elected:
        names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in elected)
        print(f"Successfully completed leader election ({election.name}) for partitions {names}")
    if not_needed:
        print(
            f"Valid replica already elected for partitions {', '.join(f'{tp.topic}-{tp.partition}' for tp in not_needed)}"
        )
    for tp, error in sorted(failed.items(), key=lambda item: str(item[0])):
        print(
            f"Error completing leader election ({election.name}) for partition: {tp.topic}-{tp.partition}: {error}"
        )
    if failed:
        raise CliError(f"{len(failed)} replica(s) could not be elected")
    return 0
