"""``strom transactions``: list, describe and abort transactions, find hanging ones, as
``kafka-transactions`` does (the same subcommands, options and columns).

A hanging transaction is one a partition still holds open (its producer state has a
transaction start offset) although the coordinator no longer knows it there: its markers
will never come, so ``read_committed`` consumers of the partition stay stuck at its start
offset until ``abort`` writes the ABORT marker on the partition itself.
"""

from __future__ import annotations

import argparse
import time

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_commands,
    add_connection_options,
    add_parser,
    admin_client,
    non_negative_int,
    print_table,
)
from strom.client.admin import AbortTransactionSpec, AdminClient
from strom.client.cluster import TopicPartition
from strom.client.errors import KafkaException


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "transactions",
        help="list, describe and abort transactions; find hanging ones",
        description="Analyse the transactional state of producers in the cluster and recover from "
        "hanging transactions, as kafka-transactions does.",
    )
    commands = add_commands(parser, "transactions_command")

    listing = add_parser(
        commands,
        "list",
        help="list transactions",
        description="List the transactional ids of every transaction coordinator with their "
        "producer id and state.",
    )
    add_connection_options(listing)
    listing.set_defaults(func=_list)

    describe = add_parser(
        commands,
        "describe",
        help="describe the state of an active transactional-id",
        description="Describe the state of an active transactional id, as its coordinator has it.\n\n"
        "example:\n  strom transactions describe --transactional-id copier-1",
    )
    describe.add_argument("--transactional-id", required=True, help="transactional id")
    add_connection_options(describe)
    describe.set_defaults(func=_describe)

    producers = add_parser(
        commands,
        "describe-producers",
        help="describe the states of active producers for a topic partition",
        description="Describe the active producers of a partition, as its leader (or the replica "
        "on --broker-id) keeps them.",
    )
    producers.add_argument("--broker-id", type=non_negative_int, help="describe the replica on this broker")
    producers.add_argument("--topic", required=True, help="topic name")
    producers.add_argument("--partition", required=True, type=non_negative_int, help="partition number")
    add_connection_options(producers)
    producers.set_defaults(func=_describe_producers)

    abort = add_parser(
        commands,
        "abort",
        help="abort a hanging transaction (requires administrative privileges)",
        description="Abort a hanging transaction on one partition by writing its ABORT marker there. "
        "Name it by its --start-offset (the partition's producer state finds the rest), or by "
        "--producer-id, --producer-epoch and --coordinator-epoch.\n\n"
        "example:\n  strom transactions abort --topic orders --partition 0 --start-offset 1200",
    )
    abort.add_argument("--topic", required=True, help="topic name")
    abort.add_argument("--partition", required=True, type=non_negative_int, help="partition number")
    abort.add_argument(
        "--start-offset", type=non_negative_int, help="start offset of the transaction to abort"
    )
    abort.add_argument("--producer-id", type=int, help="producer id")
    abort.add_argument("--producer-epoch", type=int, help="producer epoch")
    abort.add_argument("--coordinator-epoch", type=int, help="coordinator epoch")
    add_connection_options(abort)
    abort.set_defaults(func=_abort)

    hanging = add_parser(
        commands,
        "find-hanging",
        help="find hanging transactions",
        description="Find transactions open on partitions (of --topic, or with a replica on "
        "--broker-id) for longer than --max-transaction-timeout minutes whose coordinator no "
        "longer expects to end them there.",
    )
    hanging.add_argument(
        "--broker-id", type=non_negative_int, help="broker id to search for hanging transactions"
    )
    hanging.add_argument(
        "--max-transaction-timeout",
        type=non_negative_int,
        default=15,
        metavar="MINUTES",
        help="maximum transaction timeout in minutes to limit the scope of the search (default 15)",
    )
    hanging.add_argument("--topic", help="topic name to limit search to")
    hanging.add_argument("--partition", type=non_negative_int, help="partition number")
    add_connection_options(hanging)
    hanging.set_defaults(func=_find_hanging)


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        listings = admin.list_transactions()
    print_table(
        ("TransactionalId", "Coordinator", "ProducerId", "TransactionState"),
        [(t.transactional_id, t.coordinator_id, t.producer_id, t.state) for t in listings],
    )
    return 0


def _describe(args: argparse.Namespace) -> int:
    transactional_id: str = args.transactional_id
    with admin_client(args) as admin:
        try:
            description = admin.describe_transactions([transactional_id])[transactional_id]
        except KafkaException as exc:
            raise CliError(
                f"failed to describe transaction state of transactional-id `{transactional_id}`: {exc}"
            ) from exc
    start = description.transaction_start_time_ms
    print_table(
        (
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions",
        ),
        [
            (
                description.coordinator_id,
                transactional_id,
                description.producer_id,
                description.producer_epoch,
                description.state,
                description.transaction_timeout_ms,
                "None" if start is None else start,
                "None" if start is None else _now_ms() - start,
                ",".join(str(tp) for tp in sorted(description.topic_partitions)),
            )
        ],
    )
    return 0


def _describe_producers(args: argparse.Namespace) -> int:
    tp = TopicPartition(args.topic, args.partition)
    with admin_client(args) as admin:
        try:
            states = admin.describe_producers([tp], broker_id=args.broker_id)[tp]
        except KafkaException as exc:
            where = "leader" if args.broker_id is None else f"broker {args.broker_id}"
            raise CliError(f"failed to describe producers for partition {tp} on {where}: {exc}") from exc
    print_table(
        (
            "ProducerId",
            "ProducerEpoch",
            "LatestCoordinatorEpoch",
            "LastSequence",
            "LastTimestamp",
            "CurrentTransactionStartOffset",
        ),
        [
            (
                s.producer_id,
                s.producer_epoch,
                -1 if s.coordinator_epoch is None else s.coordinator_epoch,
                s.last_sequence,
                s.last_timestamp,
                "None" if s.current_transaction_start_offset is None else s.current_transaction_start_offset,
            )
            for s in states
        ],
    )
    return 0


def _abort(args: argparse.Namespace) -> int:
    tp = TopicPartition(args.topic, args.partition)
    if args.start_offset is None and args.producer_id is None:
        raise CliError(
            "the transaction to abort must be identified either with --start-offset or with "
            "--producer-id, --producer-epoch and --coordinator-epoch",
            exit_code=2,
        )
    with admin_client(args) as admin:
        if args.start_offset is None:
            if args.producer_epoch is None:
                raise CliError("missing required argument --producer-epoch", exit_code=2)
            if args.coordinator_epoch is None:
                raise CliError("missing required argument --coordinator-epoch", exit_code=2)
            # A transaction hanging before its producer's first marker has coordinator epoch -1:
            # 0 is at most any epoch the partition's leader can have seen.
            spec = AbortTransactionSpec(
                tp, args.producer_id, args.producer_epoch, max(args.coordinator_epoch, 0)
            )
        else:
            spec = _spec_at(admin, tp, args.start_offset)
        try:
            admin.abort_transaction(spec)
        except KafkaException as exc:
            raise CliError(f"failed to abort transaction {spec}: {exc}") from exc
    return 0


def _spec_at(admin: AdminClient, tp: TopicPartition, start_offset: int) -> AbortTransactionSpec:
    """The open transaction starting at ``start_offset`` on ``tp``, from the partition's producer state."""
    try:
        states = admin.describe_producers([tp])[tp]
    except KafkaException as exc:
        raise CliError(f"failed to validate producer state for partition {tp}: {exc}") from exc
    for state in states:
        if state.current_transaction_start_offset == start_offset:
            return AbortTransactionSpec(
                tp, state.producer_id, state.producer_epoch, state.coordinator_epoch or 0
            )
    raise CliError(
        f"could not find any open transactions starting at offset {start_offset} on partition {tp}"
    )


def _find_hanging(args: argparse.Namespace) -> int:
    if args.topic is None and args.broker_id is None:
        raise CliError(
            "find-hanging needs --topic or --broker-id to limit the scope of the search", exit_code=2
        )
    if args.partition is not None and args.topic is None:
        raise CliError("--partition needs --topic", exit_code=2)
    with admin_client(args) as admin:
        hanging = admin.find_hanging_transactions(
            [args.topic] if args.topic is not None and args.partition is None else None,
            partitions=[TopicPartition(args.topic, args.partition)] if args.partition is not None else None,
            broker_id=args.broker_id,
            max_transaction_timeout_ms=args.max_transaction_timeout * 60_000,
        )
    print_table(
        (
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)",
        ),
        [
            (
                h.partition.topic,
                h.partition.partition,
                h.state.producer_id,
                h.state.producer_epoch,
                -1 if h.state.coordinator_epoch is None else h.state.coordinator_epoch,
                h.state.current_transaction_start_offset,
                h.state.last_timestamp,
                h.open_ms // 60_000,
            )
            for h in hanging
        ],
    )
    return 0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
