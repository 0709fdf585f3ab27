"""``strom configs``: describe and alter topic and broker configs, as ``kafka-configs`` does."""

from __future__ import annotations

import argparse

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
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
    # kafka-configs' own form: --describe or --alter with the entity and change options.
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--describe", action="store_true", help="as `strom configs describe`")
    mode.add_argument("--alter", action="store_true", help="as `strom configs alter`")
    _entity_options(parser, name_required=False)
    _change_options(parser)
    parser.add_argument("--all", action="store_true", help="with --describe: every config")
    add_connection_options(parser)
    parser.set_defaults(func=_run_flags)
    commands = parser.add_subparsers(
        dest="configs_command", required=False, metavar="COMMAND", parser_class=ArgumentParser
    )

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
    _change_options(alter)
    add_connection_options(alter)
    alter.set_defaults(func=_alter)


def _change_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--add-config",
        action="append",
        default=[],
        metavar="K=V[,K=V...]",
        help="configs to set (repeatable)",
    )
    parser.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K[,K...]",
        help="configs to remove (repeatable)",
    )


def _run_flags(args: argparse.Namespace) -> int:
    """``strom configs --describe|--alter ...``, as kafka-configs is called."""
    if args.alter:
        args.name_required = True
        return _alter(args)
    if args.describe:
        return _describe(args)
    raise CliError("give --describe or --alter (or a command: describe, alter)", exit_code=2)


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
    parser.add_argument(
        "--entity-default",
        action="store_true",
        help="with --entity-type brokers: the cluster-wide default of every broker",
    )


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
    if args.entity_default:
        if _ENTITY_TYPES[args.entity_type] != "broker" or args.entity_name is not None:
            raise CliError(
                "--entity-default goes with --entity-type brokers, without --entity-name", exit_code=2
            )
        return "broker", ""  # Kafka's resource name of the cluster-wide broker default
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
        title = "the cluster-wide broker default" if resource.name == "" else f"{kind} {resource.name}"
        print(f"{scope} configs for {title}:")
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
    print(
        f"Completed updating {'default config for brokers in the cluster' if name == '' else f'config for {kind} {name}'}."
    )
    return 0
