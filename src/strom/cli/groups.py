"""``strom groups``: list, describe and delete consumer groups, and reset or delete their committed
offsets, as ``kafka-consumer-groups`` does."""

from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_commands,
    add_connection_options,
    add_either,
    add_parser,
    admin_client,
    parse_datetime,
    parse_duration,
    print_table,
    topic_partitions,
)
from strom.client.admin import (
    AdminClient,
    GroupDescription,
    OffsetReset,
    OffsetResetError,
    OffsetSpec,
    PlannedOffset,
)
from strom.client.cluster import TopicPartition
from strom.client.errors import ErrorCode, KafkaException

# A group whose offsets an outsider may change: no member can overwrite them (Dead: unknown or gone).
_INACTIVE_STATES = ("Empty", "Dead")


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "groups",
        help="list, describe and delete consumer groups; reset their offsets",
        description="Inspect and manage consumer groups, as kafka-consumer-groups does.",
    )
    commands = add_commands(parser, "groups_command")

    listing = add_parser(
        commands,
        "list",
        help="list consumer groups",
        description="List the groups of every broker, one a line. With --state, a table with each "
        "group's state, optionally only groups in the given states (Stable, Empty, "
        "PreparingRebalance, CompletingRebalance, Dead).",
    )
    listing.add_argument(
        "--state", nargs="*", metavar="STATE", help="show states; with names, only groups in those states"
    )
    add_connection_options(listing)
    listing.set_defaults(func=_list)

    describe = add_parser(
        commands,
        "describe",
        help="show a group's state, members and per-partition lag",
        description="Print a group's state, coordinator and assignor; then for each partition it has "
        "an offset for or is assigned, the committed offset (CURRENT-OFFSET), the log end offset "
        "and the LAG between them with the member that owns it; then the members with their "
        "client id, host and assigned partitions. --all-groups does so for every group.\n\n"
        "examples:\n"
        "  strom groups describe billing\n"
        "  strom groups describe --all-groups --offsets",
    )
    add_either(describe, "group", required=False, help="the group id")
    describe.add_argument("--all-groups", action="store_true", help="describe every group")
    only = describe.add_mutually_exclusive_group()
    only.add_argument("--state", action="store_true", help="only the state line")
    only.add_argument("--offsets", action="store_true", help="only the per-partition table")
    only.add_argument("--members", action="store_true", help="only the members table")
    add_connection_options(describe)
    describe.set_defaults(func=_describe)

    delete = add_parser(
        commands,
        "delete",
        help="delete groups and their committed offsets",
        description="Delete groups that have no active members, with their committed offsets.",
    )
    add_either(delete, "group", many=True, help="the groups to delete")
    add_connection_options(delete)
    delete.set_defaults(func=_delete)

    _register_reset(commands)

    delete_offsets = add_parser(
        commands,
        "delete-offsets",
        help="delete a group's committed offsets for some partitions",
        description="Delete a group's committed offsets for topics (all their partitions) or the "
        "partitions given. Refused for topics the group's active members are subscribed to.\n\n"
        "example: strom groups delete-offsets billing --topic orders:0,1",
    )
    add_either(delete_offsets, "group", help="the group id")
    delete_offsets.add_argument(
        "--topic",
        action="append",
        required=True,
        type=topic_partitions,
        metavar="TOPIC[:P,...]",
        help="a topic, or some of its partitions (repeatable)",
    )
    add_connection_options(delete_offsets)
    delete_offsets.set_defaults(func=_delete_offsets)


def _register_reset(commands: Subparsers[ArgumentParser]) -> None:
    reset = add_parser(
        commands,
        "reset-offsets",
        help="move a group's committed offsets (dry run unless --execute)",
        description="Compute new committed offsets for a group and, with --execute, commit them. The "
        "group must be inactive (Empty, or unknown). Offsets past the log end or before the log start "
        "are moved to them. --export prints the plan as CSV (topic,partition,offset), which "
        "--from-file reads back.\n\n"
        "examples:\n"
        "  strom groups reset-offsets billing --topic orders --to-earliest\n"
        "  strom groups reset-offsets billing --all-topics --by-duration PT30M --execute\n"
        "  strom groups reset-offsets billing --topic orders:0 --shift-by -10 --export > plan.csv\n"
        "  strom groups reset-offsets billing --from-file plan.csv --execute",
    )
    add_either(reset, "group", help="the group id")
    scope = reset.add_mutually_exclusive_group()
    scope.add_argument(
        "--topic",
        action="append",
        type=topic_partitions,
        metavar="TOPIC[:P,...]",
        help="reset this topic, or only the partitions given (repeatable)",
    )
    scope.add_argument(
        "--all-topics", action="store_true", help="every partition the group has an offset for"
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="to the log start offset")
    to.add_argument("--to-latest", action="store_true", help="to the log end offset")
    to.add_argument("--to-current", action="store_true", help="to the committed offset (the log end if none)")
    to.add_argument("--to-offset", type=int, metavar="N", help="to offset N")
    to.add_argument(
        "--to-datetime",
        type=parse_datetime,
        metavar="ISO",
        help="to the first offset at or after a time, e.g. 2024-05-01T12:00:00.000 (UTC unless it has a zone)",
    )
    to.add_argument("--shift-by", type=int, metavar="N", help="by N from the committed offset (N may be < 0)")
    to.add_argument(
        "--by-duration",
        type=parse_duration,
        metavar="PnDTnHnMnS",
        help="to the first offset at or after that long ago, e.g. PT30M",
    )
    to.add_argument(
        "--from-file", type=Path, metavar="CSV", help="to the offsets in a CSV topic,partition,offset"
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the new offsets only (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.add_argument("--export", action="store_true", help="print the new offsets as CSV")
    add_connection_options(reset)
    reset.set_defaults(func=_reset)


# -- list, describe, delete ------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        groups = admin.list_consumer_groups(args.state or None)
    if args.state is None:
        for group in groups:
            print(group.group_id)
    else:
        print_table(("GROUP", "STATE"), [(g.group_id, g.state or "Unknown") for g in groups])
    return 0


def describe_group(admin: AdminClient, group_id: str) -> GroupDescription | None:
    """The group, or None when the coordinator knows no such group."""
    try:
        return admin.describe_consumer_groups([group_id])[group_id]
    except KafkaException as exc:
        if exc.error_code == ErrorCode.group_id_not_found:
            return None
        raise


def _describe(args: argparse.Namespace) -> int:
    if (args.group is None) == (not args.all_groups):
        raise CliError("give a GROUP (or --group) or --all-groups, not both", exit_code=2)
    with admin_client(args) as admin:
        if not args.all_groups:
            _describe_one(admin, args.group, args, must_exist=True)
            return 0
        group_ids = sorted(g.group_id for g in admin.list_consumer_groups())
        shown = 0
        for group_id in group_ids:
            if shown:
                print()
            shown += _describe_one(admin, group_id, args, must_exist=False)
    return 0


def _describe_one(admin: AdminClient, group_id: str, args: argparse.Namespace, *, must_exist: bool) -> bool:
    """Print one group; False (nothing printed) for a group that is gone, unless it ``must_exist``."""
    group = describe_group(admin, group_id)
    committed = admin.list_consumer_group_offsets(group_id)
    if group is None or (group.state == "Dead" and not committed):
        if must_exist:
            raise CliError(f"consumer group '{group_id}' does not exist")
        return False
    owners = {tp: m for m in group.members for tp in m.assignment}
    partitions = sorted(set(committed) | set(owners), key=lambda tp: (tp.topic, tp.partition))
    log_ends = _log_end_offsets(admin, partitions) if not (args.state or args.members) else {}
    show_all = not (args.state or args.offsets or args.members)
    if args.state or show_all:
        coordinator = f"{group.coordinator.address} ({group.coordinator.node_id})"
        print_table(
            ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
            [(group_id, coordinator, group.protocol or None, group.state, len(group.members))],
        )
    if args.offsets or show_all:
        if show_all:
            print()
        if not group.members:
            print(f"Consumer group '{group_id}' has no active members.")
        rows = []
        for tp in partitions:
            offset = committed[tp].offset if tp in committed else None
            end = log_ends.get(tp)
            lag = end - offset if end is not None and offset is not None else None
            owner = owners.get(tp)
            rows.append(
                (
                    group_id,
                    tp.topic,
                    tp.partition,
                    offset,
                    end,
                    lag,
                    owner.member_id if owner else None,
                    owner.host if owner else None,
                    owner.client_id if owner else None,
                )
            )
        print_table(
            (
                "GROUP",
                "TOPIC",
                "PARTITION",
                "CURRENT-OFFSET",
                "LOG-END-OFFSET",
                "LAG",
                "CONSUMER-ID",
                "HOST",
                "CLIENT-ID",
            ),
            rows,
        )
    if args.members or (show_all and group.members):
        if show_all:
            print()
        print_table(
            ("GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"),
            [
                (
                    group_id,
                    m.member_id,
                    m.group_instance_id,
                    m.host,
                    m.client_id,
                    len(m.assignment),
                    _assignment_text(m.assignment),
                )
                for m in sorted(group.members, key=lambda m: m.member_id)
            ],
        )
    return True


def _log_end_offsets(admin: AdminClient, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Log end offsets of the partitions whose topics still exist."""
    existing = set(admin.list_topics(include_internal=True))
    alive = [tp for tp in partitions if tp.topic in existing]
    if not alive:
        return {}
    found = admin.list_offsets(dict.fromkeys(alive, OffsetSpec.latest()))
    return {tp: result.offset for tp, result in found.items()}


def _assignment_text(assignment: Iterable[TopicPartition]) -> str | None:
    by_topic: dict[str, list[int]] = {}
    for tp in assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if not by_topic:
        return None
    return ",".join(f"{t}({','.join(str(p) for p in sorted(ps))})" for t, ps in sorted(by_topic.items()))


def _delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_consumer_groups(args.groups)
    for group_id in args.groups:
        print(f"Deleted consumer group {group_id}.")
    return 0


def _expand(admin: AdminClient, specs: list[tuple[str, list[int] | None]]) -> list[TopicPartition]:
    """TOPIC[:P,...] arguments as partitions; a bare topic means all of its partitions."""
    whole = [topic for topic, partitions in specs if partitions is None]
    described = admin.describe_topics(whole) if whole else {}
    result: list[TopicPartition] = []
    for topic, partitions in specs:
        numbers = partitions if partitions is not None else [p.partition for p in described[topic].partitions]
        result += [TopicPartition(topic, p) for p in numbers]
    return list(dict.fromkeys(result))


def _delete_offsets(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        partitions = _expand(admin, args.topic)
        admin.delete_consumer_group_offsets(args.group, partitions)
    print_table(
        ("TOPIC", "PARTITION", "STATUS"), [(tp.topic, tp.partition, "Successful") for tp in partitions]
    )
    return 0


# -- reset-offsets ---------------------------------------------------------------------------


def read_reset_plan(path: Path, group_id: str) -> dict[TopicPartition, int]:
    """``topic,partition,offset`` lines (or ``group,topic,partition,offset``: this group's lines)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
    plan: dict[TopicPartition, int] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) == 4:
            if row[0] != group_id:
                continue
            row = row[1:]
        try:
            topic, partition, offset = row[0].strip(), int(row[1]), int(row[2])
        except (ValueError, IndexError):
            raise CliError(
                f"{path}:{number}: expected topic,partition,offset, got {','.join(row)!r}"
            ) from None
        plan[TopicPartition(topic, partition)] = offset
    if not plan:
        raise CliError(f"{path} holds no offsets for group '{group_id}'")
    return plan


def _reset(args: argparse.Namespace) -> int:
    group_id = args.group
    if args.from_file is None and not (args.topic or args.all_topics):
        raise CliError("give --topic or --all-topics (or --from-file)", exit_code=2)
    with admin_client(args) as admin:
        group = describe_group(admin, group_id)
        if group is not None and group.state not in _INACTIVE_STATES:
            raise CliError(
                f"group '{group_id}' is {group.state} with {len(group.members)} active member(s); "
                "offsets can be reset only while it is inactive (stop its consumers first)"
            )
        planned = _plan(admin, args)
        if args.execute:
            admin.alter_consumer_group_offsets(group_id, {p.partition: p.new for p in planned})
    ordered = [(p.partition, p.new) for p in planned]
    if args.export:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows((tp.topic, tp.partition, offset) for tp, offset in ordered)
        sys.stdout.write(out.getvalue())
    else:
        print_table(
            ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
            [(group_id, tp.topic, tp.partition, o) for tp, o in ordered],
        )
    if not args.execute:
        # On stderr, so that an --export plan stays a clean CSV.
        print(
            f"Dry run: the offsets of group '{group_id}' were not changed; add --execute to commit them.",
            file=sys.stderr,
        )
    return 0


def _plan(admin: AdminClient, args: argparse.Namespace) -> list[PlannedOffset]:
    """The new offsets, computed as kafka-consumer-groups computes them."""
    partitions = None if args.from_file is not None or args.all_topics else _expand(admin, args.topic)
    try:
        return admin.plan_offset_reset(args.group, _target(args), partitions)
    except OffsetResetError as exc:
        raise CliError(str(exc)) from exc


def _target(args: argparse.Namespace) -> OffsetReset:
    if args.from_file is not None:
        return OffsetReset.to_offsets(read_reset_plan(args.from_file, args.group))
    if args.to_earliest:
        return OffsetReset.earliest()
    if args.to_latest:
        return OffsetReset.latest()
    if args.to_current:
        return OffsetReset.current()
    if args.to_offset is not None:
        return OffsetReset.to_offset(args.to_offset)
    if args.shift_by is not None:
        return OffsetReset.shift_by(args.shift_by)
    if args.to_datetime is not None:
        return OffsetReset.to_timestamp(args.to_datetime)
    return OffsetReset.to_timestamp(max(0, int(time.time() * 1000) - args.by_duration))
