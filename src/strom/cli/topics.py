"""``strom topics``: create, list, describe, alter and delete topics, as ``kafka-topics`` does."""

from __future__ import annotations

import argparse

from strom.cli import reassign
from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_commands,
    add_connection_options,
    add_either,
    add_parser,
    admin_client,
    key_value,
    positive_int,
)
from strom.client.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, TopicDescription
from strom.client.errors import ErrorCode, KafkaException

KAFKA_ACTIONS = {
    "--create": "create",
    "--list": "list",
    "--describe": "describe",
    "--alter": "alter",
    "--delete": "delete",
}
_COMMANDS = ("create", "list", "describe", "alter", "reassign", "delete")


def kafka_spelling(argv: list[str]) -> list[str]:
    """kafka-topics' ``topics [options] --create [options]`` as ``topics --create create [options]``:
    the command named after the flags (a second flag is then argparse's error), the rest as given.
    Strom's own spelling (``topics create ...``) is left alone."""
    position = _command_position(argv)
    if position is None or argv[position] != "topics":
        return argv
    rest = argv[position + 1 :]
    flags = [word for word in rest if word in KAFKA_ACTIONS]
    if not flags or (rest and rest[0] in _COMMANDS):
        return argv
    others = [word for word in rest if word not in KAFKA_ACTIONS]
    return [*argv[: position + 1], *flags, KAFKA_ACTIONS[flags[0]], *others]


def _command_position(argv: list[str]) -> int | None:
    """Where the command is: the first word that is neither an option of `strom` nor its value."""
    position = 0
    while position < len(argv):
        word = argv[position]
        if not word.startswith("-"):
            return position
        position += 2 if word == "--log-level" else 1
    return None


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "topics",
        help="create, list, describe, alter and delete topics",
        description="Manage topics on any Kafka-protocol broker, as kafka-topics does. Its spelling "
        "works too: --create, --list, --describe, --alter or --delete in place of the command, "
        "anywhere among the options.\n\n"
        "examples:\n"
        "  strom topics create orders --partitions 6\n"
        "  strom topics --bootstrap-server 127.0.0.1:9092 --create --topic orders --partitions 6 "
        "--replication-factor 1\n"
        "  strom topics --describe --topic orders",
    )
    # Only for --help and for the error when two are given: kafka_spelling() puts the command after them.
    actions = parser.add_mutually_exclusive_group()
    for flag, command in KAFKA_ACTIONS.items():
        actions.add_argument(
            flag, action="store_true", help=f"kafka-topics' spelling of `strom topics {command}`"
        )
    commands = add_commands(parser, "topics_command")

    create = add_parser(
        commands,
        "create",
        help="create a topic",
        description="Create a topic. Partitions and replication factor default to the broker's "
        "num.partitions and default.replication.factor.\n\n"
        "example: strom topics create orders --partitions 6 --config retention.ms=86400000",
    )
    add_either(create, "topic", help="the topic's name")
    create.add_argument("--partitions", type=positive_int, default=-1, metavar="N", help="partition count")
    create.add_argument(
        "--replication-factor", type=positive_int, default=-1, metavar="N", help="replicas per partition"
    )
    create.add_argument(
        "--config",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="a topic config such as cleanup.policy=compact (repeatable)",
    )
    create.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    add_connection_options(create)
    create.set_defaults(func=_create)

    listing = add_parser(
        commands, "list", help="list topic names", description="List the topics, one a line."
    )
    listing.add_argument("--exclude-internal", action="store_true", help="leave out internal topics")
    add_connection_options(listing)
    listing.set_defaults(func=_list)

    describe = add_parser(
        commands,
        "describe",
        help="show topics' partitions, leaders, replicas and configs",
        description="For each topic a line with its id, partition count, replication factor and "
        "non-default configs, then a line per partition with its leader, replicas and in-sync "
        "replicas. With a filter, only the partitions it selects are printed.",
    )
    add_either(describe, "topic", many=True, required=False, help="topics to describe (default: all)")
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions with fewer in-sync replicas than replicas",
    )
    describe.add_argument(
        "--unavailable-partitions", action="store_true", help="only partitions whose leader is not available"
    )
    describe.add_argument(
        "--under-min-isr-partitions",
        action="store_true",
        help="only partitions with fewer in-sync replicas than the topic's min.insync.replicas",
    )
    describe.add_argument("--exclude-internal", action="store_true", help="leave out internal topics")
    add_connection_options(describe)
    describe.set_defaults(func=_describe)

    alter = add_parser(
        commands,
        "alter",
        help="add partitions to a topic",
        description="Grow a topic to a larger partition count (partitions are never removed). "
        "Change topic configs with `strom configs alter`.",
    )
    add_either(alter, "topic", help="the topic's name")
    alter.add_argument("--partitions", type=positive_int, required=True, metavar="N", help="new total count")
    add_connection_options(alter)
    alter.set_defaults(func=_alter)

    reassign_parser = add_parser(
        commands,
        "reassign",
        help="move partitions between brokers (as kafka-reassign-partitions)",
        description=(reassign.__doc__ or "").split("\n\n", 1)[1] + "\nexamples:\n"
        "  strom topics reassign --generate --topics-to-move-json-file topics.json --broker-list 1,2,3\n"
        "  strom topics reassign --execute --reassignment-json-file plan.json\n"
        "  strom topics reassign --verify --reassignment-json-file plan.json",
    )
    reassign.add_arguments(reassign_parser)

    delete = add_parser(commands, "delete", help="delete topics", description="Delete topics and their data.")
    add_either(delete, "topic", many=True, help="the topics to delete")
    delete.add_argument("--if-exists", action="store_true", help="succeed if a topic does not exist")
    add_connection_options(delete)
    delete.set_defaults(func=_delete)


def _create(args: argparse.Namespace) -> int:
    topic = NewTopic(args.topic, args.partitions, args.replication_factor, dict(args.config))
    with admin_client(args) as admin:
        try:
            admin.create_topics([topic])
        except KafkaException as exc:
            if not (args.if_not_exists and exc.error_code == ErrorCode.topic_already_exists):
                raise
            return 0
    print(f"Created topic {args.topic}.")
    return 0


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        for name in admin.list_topics(include_internal=not args.exclude_internal):
            print(name)
    return 0


def _describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        names = args.topics or admin.list_topics(include_internal=not args.exclude_internal)
        described = admin.describe_topics(names)
        if args.exclude_internal:
            described = {n: d for n, d in described.items() if not d.is_internal}
        live = {node.node_id for node in admin.describe_cluster().nodes}
        filtered = (
            args.under_replicated_partitions or args.unavailable_partitions or args.under_min_isr_partitions
        )
        configs = {} if filtered else _dynamic_configs(admin, list(described))
        min_isr = _min_isr(admin, list(described)) if args.under_min_isr_partitions else {}
    for name in sorted(described):
        description = described[name]
        if not filtered:
            _print_topic(description, configs[name])
        for p in description.partitions:
            under_replicated = len(p.isr) < len(p.replicas)
            unavailable = p.leader not in live
            if args.under_replicated_partitions and not under_replicated:
                continue
            if args.unavailable_partitions and not unavailable:
                continue
            if args.under_min_isr_partitions and not len(p.isr) < min_isr.get(name, 1):
                continue
            line = (
                f"\tTopic: {name}\tPartition: {p.partition}\tLeader: {p.leader if p.leader >= 0 else 'none'}"
                f"\tReplicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}"
            )
            if p.offline:
                line += f"\tOffline: {_ids(p.offline)}"
            print(line)
    return 0


def _dynamic_configs(admin: AdminClient, names: list[str]) -> dict[str, str]:
    """Each topic's overrides as ``k=v,...`` (what kafka-topics prints as Configs)."""
    if not names:
        return {}
    resources = [ConfigResource("topic", n) for n in names]
    described = admin.describe_configs(resources)
    return {
        r.name: ",".join(
            f"{e.name}={e.value}"
            for e in sorted(described[r].values(), key=lambda e: e.name)
            if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG
        )
        for r in resources
    }


def _min_isr(admin: AdminClient, names: list[str]) -> dict[str, int]:
    """Each topic's effective min.insync.replicas."""
    if not names:
        return {}
    resources = [ConfigResource("topic", n) for n in names]
    described = admin.describe_configs(resources)
    found: dict[str, int] = {}
    for r in resources:
        entry = described[r].get("min.insync.replicas")
        found[r.name] = int(entry.value) if entry is not None and entry.value is not None else 1
    return found


def _print_topic(description: TopicDescription, configs: str) -> None:
    replication = max((len(p.replicas) for p in description.partitions), default=0)
    topic_id = description.topic_id if description.topic_id is not None else "none"
    print(
        f"Topic: {description.name}\tTopicId: {topic_id}\tPartitionCount: {len(description.partitions)}"
        f"\tReplicationFactor: {replication}\tConfigs: {configs}"
    )


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in ids)


def _alter(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        current = len(admin.describe_topics([args.topic])[args.topic].partitions)
        if args.partitions <= current:
            raise CliError(
                f"topic '{args.topic}' has {current} partitions; the new count must be larger "
                "(partitions cannot be removed)"
            )
        admin.create_partitions({args.topic: args.partitions})
    print(f"Topic {args.topic} now has {args.partitions} partitions.")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        names = args.topics
        if args.if_exists:
            existing = set(admin.list_topics(include_internal=True))
            names = [n for n in names if n in existing]
        if names:
            admin.delete_topics(names)
    for name in names:
        print(f"Deleted topic {name}.")
    return 0
