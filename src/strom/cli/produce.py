"""``strom produce``: one record per input line, from stdin or a file."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_connection_options,
    add_either,
    add_parser,
    client_config,
    non_negative_int,
)
from strom.cli.error_text import explain
from strom.client.config import PRODUCER
from strom.client.errors import KafkaException
from strom.client.producer import Producer, RecordMetadata


def _header(text: str) -> tuple[str, bytes | None]:
    name, sep, value = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (or NAME for a null value), got {text!r}")
    return name, value.encode() if sep else None


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "produce",
        help="write records from stdin or a file, one per line",
        description="Send each input line as a record's value (the trailing newline removed). With "
        "--key-separator, the text before the first separator is the key (a line without it has a "
        "null key). Exits non-zero if any record was not acknowledged.\n\n"
        "examples:\n"
        "  echo 'hello' | strom produce greetings\n"
        "  printf 'user1:signed up\\nuser2:logged in\\n' | strom produce events --key-separator : "
        "--header source=cli",
    )
    add_either(parser, "topic", help="the topic")
    parser.add_argument("--file", type=Path, metavar="PATH", help="read lines from PATH instead of stdin")
    parser.add_argument("--key-separator", metavar="SEP", help="split each line into key SEP value")
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        type=_header,
        metavar="NAME=VALUE",
        help="a header on every record (repeatable; NAME alone for a null value)",
    )
    parser.add_argument("--partition", type=non_negative_int, metavar="N", help="write to partition N")
    parser.add_argument(
        "--acks",
        choices=("all", "-1", "0", "1"),
        default="all",
        help="acknowledgements to wait for (default all)",
    )
    parser.add_argument(
        "--compression",
        choices=("none", "gzip", "snappy", "lz4", "zstd"),
        default="none",
        help="batch compression (default none)",
    )
    add_connection_options(parser)
    parser.set_defaults(func=_run)


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        yield line


def _run(args: argparse.Namespace) -> int:
    config = client_config(
        args,
        PRODUCER,
        {"acks": args.acks, "compression.type": args.compression},
        kind="producer",
    )
    separator = args.key_separator.encode() if args.key_separator else None
    headers = list(args.header)
    failures: list[Exception] = []
    sent = 0

    def delivered(_metadata: RecordMetadata | None, exc: Exception | None) -> None:
        if exc is not None:
            failures.append(exc)

    try:
        source: contextlib.AbstractContextManager[BinaryIO] = (
            args.file.open("rb") if args.file is not None else contextlib.nullcontext(sys.stdin.buffer)
        )
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from exc
    with source as stream, Producer(config) as producer:
        # A partition the topic lacks would block each send for max.block.ms: say so at once.
        if args.partition is not None and args.partition not in producer.partitions_for(args.topic):
            raise CliError(f"topic '{args.topic}' has no partition {args.partition}")
        for line in _lines(stream):
            key: bytes | None = None
            value = line
            if separator is not None:
                head, sep, tail = line.partition(separator)
                if sep:
                    key, value = head, tail
            producer.send(
                args.topic, value, key, partition=args.partition, headers=headers, callback=delivered
            )
            sent += 1
            if failures:
                break
        producer.flush()
    if failures:
        first = failures[0]
        reason = explain(first) if isinstance(first, KafkaException) else str(first)
        raise CliError(f"{len(failures)} of {sent} records were not written: {reason}")
    return 0
