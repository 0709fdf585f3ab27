"""``strom topics reassign``: move partitions between brokers, as kafka-reassign-partitions does.

--generate proposes an assignment of the topics in --topics-to-move-json-file over --broker-list
(Kafka's replica assignment, keeping each partition's replication factor); --execute starts the
reassignment in --reassignment-json-file and prints the current assignment for a rollback;
--verify tells, per partition, whether its reassignment is completed or still in progress. The
files are Kafka's JSON: {"version":1,"topics":[{"topic":"t"}]} and
{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2],"log_dirs":["any","any"]}]}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from strom.broker.control_plane.assignment import assign_replicas
from strom.cli.common import CliError, add_connection_options, admin_client
from strom.client.admin import AdminClient
from strom.client.cluster import TopicPartition


def add_arguments(parser: argparse.ArgumentParser) -> None:
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--generate", action="store_true", help="propose an assignment")
    action.add_argument("--execute", action="store_true", help="start the reassignment in the file")
    action.add_argument("--verify", action="store_true", help="tell whether the file's reassignment is done")
    parser.add_argument(
        "--topics-to-move-json-file", type=Path, help='with --generate: {"topics":[{"topic":"t"}]}'
    )
    parser.add_argument("--broker-list", help="with --generate: the brokers to assign over, e.g. 1,2,3")
    parser.add_argument("--reassignment-json-file", type=Path, help="with --execute and --verify")
    add_connection_options(parser)
    parser.set_defaults(func=run)


def _load(path: Path | None, option: str) -> Any:
    if path is None:
        raise CliError(f"give {option}", exit_code=2)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {option} {path}: {exc}") from exc


def parse_reassignment(document: Any) -> dict[TopicPartition, list[int]]:
    try:
        return {
            TopicPartition(str(p["topic"]), int(p["partition"])): [int(b) for b in p["replicas"]]
            for p in document["partitions"]
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CliError(f"not a partition reassignment file: {exc!r}") from exc


def reassignment_json(assignment: dict[TopicPartition, list[int]]) -> str:
    return json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "replicas": r, "log_dirs": ["any"] * len(r)}
                for tp, r in sorted(assignment.items(), key=lambda item: (item[0].topic, item[0].partition))
            ],
        },
        separators=(",", ":"),
    )


def parse_broker_list(text: str | None) -> list[int]:
    if not text:
        raise CliError("--generate needs --broker-list", exit_code=2)
    try:
        brokers = [int(b) for b in text.split(",") if b.strip()]
    except ValueError as exc:
        raise CliError(f"--broker-list is comma-separated broker ids, got {text!r}") from exc
    if len(set(brokers)) != len(brokers):
        raise CliError(f"--broker-list repeats a broker: {text}")
    return brokers


def _current(admin: AdminClient, topics: list[str]) -> dict[TopicPartition, list[int]]:
    described = admin.describe_topics(topics)
    return {
        TopicPartition(name, p.partition): list(p.replicas)
        for name, d in described.items()
        for p in d.partitions
    }


def run(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        if args.generate:
            return _generate(args, admin)
        if args.execute:
            return _execute(args, admin)
        return _verify(args, admin)


def _generate(args: argparse.Namespace, admin: AdminClient) -> int:
    document = _load(args.topics_to_move_json_file, "--topics-to-move-json-file")
    try:
        topics = [str(t["topic"]) for t in document["topics"]]
    except (KeyError, TypeError) as exc:
        raise CliError(f"not a topics-to-move file: {exc!r}") from exc
    brokers = parse_broker_list(args.broker_list)
    racks = {n.node_id: n.rack for n in admin.describe_cluster().nodes if n.node_id in brokers}
    missing = sorted(set(brokers) - set(racks))
    if missing:
        raise CliError(f"the brokers {missing} are not in the cluster")
    current = _current(admin, topics)
    proposed: dict[TopicPartition, list[int]] = {}
    for topic in topics:
        partitions = sorted(tp.partition for tp in current if tp.topic == topic)
        factor = len(current[TopicPartition(topic, partitions[0])]) if partitions else 0
        if factor > len(brokers):
            raise CliError(
                f"topic {topic} has replication factor {factor}, more than the {len(brokers)} brokers"
            )
        for p, replicas in assign_replicas(racks, len(partitions), factor).items():
            proposed[TopicPartition(topic, p)] = replicas
    print("Current partition replica assignment")
    print(reassignment_json(current))
    print()
    print("Proposed partition reassignment configuration")
    print(reassignment_json(proposed))
    return 0


def _execute(args: argparse.Namespace, admin: AdminClient) -> int:
    target = parse_reassignment(_load(args.reassignment_json_file, "--reassignment-json-file"))
    current = _current(admin, sorted({tp.topic for tp in target}))
    print("Current partition replica assignment")
    print()
    print(reassignment_json({tp: r for tp, r in current.items() if tp in target}))
    print()
    print("Save this to use as the --reassignment-json-file option during rollback")
    admin.alter_partition_reassignments(dict(target))
    names = ",".join(
        f"{tp.topic}-{tp.partition}" for tp in sorted(target, key=lambda t: (t.topic, t.partition))
    )
    print(f"Successfully started partition reassignments for {names}")
    return 0


def _verify(args: argparse.Namespace, admin: AdminClient) -> int:
    target = parse_reassignment(_load(args.reassignment_json_file, "--reassignment-json-file"))
    ongoing = admin.list_partition_reassignments(list(target))
    current = _current(admin, sorted({tp.topic for tp in target}))
    print("Status of partition reassignment:")
    done = True
    for tp in sorted(target, key=lambda t: (t.topic, t.partition)):
        if tp in ongoing:
            done = False
            print(f"Reassignment of partition {tp.topic}-{tp.partition} is still in progress.")
        elif current.get(tp) == target[tp]:
            print(f"Reassignment of partition {tp.topic}-{tp.partition} is completed.")
        else:
            done = False
            print(
                f"There is no active reassignment of partition {tp.topic}-{tp.partition}, but replica set is "
                f"{current.get(tp)} rather than {target[tp]}."
            )
    return 0 if done else 1
