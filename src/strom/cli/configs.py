"""``strom configs``: describe and alter topic and broker configs, as ``kafka-configs`` does."""

from __future__ import annotations

import argparse

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_commands,
    add_connection_options,
    add_parser,
    admin_client,
)
from strom.client.admin import AlterConfigOp, AlterConfigOpType, ConfigResource, ConfigSource

# What kafka-configs shows without --all: values set through the admin API, not from files or defaults.
_DYNAMIC_SOURCES = frozenset(
    {
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
        ConfigSource.DYNAMIC_BROKER_CONFIG,
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
        ConfigSource.DYNAMIC_BROKER_LOGGER_CONFIG,
    }
)
_ENTITY_TYPES = {"topics": "topic", "topic": "topic", "brokers": "broker", "broker": "broker"}


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "configs",
        help="describe and alter topic and broker configs",
        description="Read and change configs, as kafka-configs does.",
    )
    commands = add_commands(parser, "configs_command")

    describe = add_parser(
        commands,
        "describe",
        help="show configs set through the admin API (or all)",
        description="Print a topic's or broker's dynamic configs (those set with `strom configs alter` "
        "or at creation), or with --all every config, each with where its value comes from. "
        "Without --entity-name, every topic (or broker) is described.\n\n"
        "examples:\n"
        "  strom configs describe --entity-type topics --entity-name orders --all\n"
        "  strom configs describe --topic orders",
    )
    _entity_options(describe, name_required=False)
    describe.add_argument("--all", action="store_true", help="also the configs at their default values")
    add_connection_options(describe)
    describe.set_defaults(func=_describe)

    alter = add_parser(
        commands,
        "alter",
        help="set or remove configs",
        description="Set and remove configs in one incremental change. A list value is written in "
        "brackets: --add-config cleanup.policy=[compact,delete].\n\n"
        "examples:\n"
        "  strom configs alter --entity-type topics --entity-name orders "
        "--add-config retention.ms=3600000,max.message.bytes=2097152 --delete-config segment.ms\n"
        "  strom configs alter --broker 0 --add-config log.retention.ms=86400000",
    )
    _entity_options(alter, name_required=True)
    alter.add_argument(
        "--add-config",
        action="append",
        default=[],
        metavar="K=V[,K=V...]",
        help="configs to set (repeatable)",
    )
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K[,K...]",
        help="configs to remove (repeatable)",
    )
    add_connection_options(alter)
    alter.set_defaults(func=_alter)


def _entity_options(parser: argparse.ArgumentParser, *, name_required: bool) -> None:
    parser.set_defaults(name_required=name_required)
    parser.add_argument(
        "--entity-type",
        choices=sorted(_ENTITY_TYPES),
        metavar="{topics,brokers}",
        help="what the configs belong to",
    )
    parser.add_argument(
        "--entity-name",
        metavar="NAME",
        help="the topic's name or the broker's id" + ("" if name_required else " (default: all)"),
    )
    # kafka-configs' shorthands for --entity-type topics/brokers --entity-name NAME.
    parser.add_argument("--topic", metavar="NAME", help="the same as --entity-type topics --entity-name NAME")
    parser.add_argument("--broker", metavar="ID", help="the same as --entity-type brokers --entity-name ID")


def _entity(args: argparse.Namespace) -> tuple[str, str | None]:
    """The entity's kind and name from --entity-type/--entity-name or --topic/--broker."""
    if args.topic is not None or args.broker is not None:
        if (
            args.entity_type is not None
            or args.entity_name is not None
            or None not in (args.topic, args.broker)
        ):
            raise CliError("give one of --topic, --broker or --entity-type with --entity-name", exit_code=2)
        return ("topic", args.topic) if args.topic is not None else ("broker", args.broker)
    if args.entity_type is None:
        raise CliError("give --entity-type (topics or brokers), or --topic or --broker", exit_code=2)
    if args.name_required and args.entity_name is None:
        raise CliError("give --entity-name", exit_code=2)
    return _ENTITY_TYPES[args.entity_type], args.entity_name


def parse_add_config(text: str) -> dict[str, str]:
    """``k=v,k2=[a,b]``: commas separate entries except inside brackets, which hold list values."""
    configs: dict[str, str] = {}
    entries: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    entries.append(text[start:])
    for entry in (e.strip() for e in entries):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--add-config expects KEY=VALUE entries, got {entry!r}")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        configs[key.strip()] = value
    return configs


def _describe(args: argparse.Namespace) -> int:
    kind, name = _entity(args)
    with admin_client(args) as admin:
        if name is not None:
            names = [name]
        elif kind == "topic":
            names = admin.list_topics()
        else:
            names = [str(node.node_id) for node in admin.describe_cluster().nodes]
        resources = [ConfigResource(kind, name) for name in names]
        described = admin.describe_configs(resources) if resources else {}
    for resource in resources:
        entries = sorted(described[resource].values(), key=lambda e: e.name)
        shown = [e for e in entries if args.all or e.source in _DYNAMIC_SOURCES]
        scope = "All" if args.all else "Dynamic"
        print(f"{scope} configs for {kind} {resource.name}:")
        for entry in shown:
            value = "[hidden]" if entry.sensitive else "null" if entry.value is None else entry.value
            flags = " read-only" if entry.read_only else ""
            print(f"  {entry.name}={value}  ({entry.source.name}{flags})")
    return 0


def _alter(args: argparse.Namespace) -> int:
    kind, name = _entity(args)
    assert name is not None  # _entity requires it for alter
    ops: list[AlterConfigOp] = []
    for text in args.add_config:
        ops += [AlterConfigOp(k, v, AlterConfigOpType.SET) for k, v in parse_add_config(text).items()]
    for text in args.delete_config:
        ops += [
            AlterConfigOp(k.strip(), None, AlterConfigOpType.DELETE) for k in text.split(",") if k.strip()
        ]
    if not ops:
        raise CliError("nothing to change: give --add-config and/or --delete-config", exit_code=2)
    resource = ConfigResource(kind, name)
    with admin_client(args) as admin:
        admin.incremental_alter_configs({resource: ops})
    print(f"Completed updating config for {kind} {name}.")
    return 0
