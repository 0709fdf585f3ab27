"""``strom produce``: one record per input line, from stdin or a file."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
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


# kafka-console-producer's --property keys (its LineMessageReader's), with their defaults.
READER_PROPERTIES = {
    "parse.key": "false",
    "key.separator": "\t",
    "parse.headers": "false",
    "headers.delimiter": "\t",
    "headers.separator": ",",
    "headers.key.separator": ":",
    "null.marker": "",
}


def _flag(properties: dict[str, str], key: str) -> bool:
    value = properties[key].strip().lower()
    if value not in ("true", "false"):
        raise CliError(f"--property {key}: expected true or false, got {properties[key]!r}", exit_code=2)
    return value == "true"


@dataclass(frozen=True)
class LineReader:
    """How a line becomes a record: [headers DELIM] [key SEP] value, as kafka-console-producer
    reads it with parse.headers and parse.key. A line without the key separator has a null key."""

    key_separator: bytes | None = None
    headers_delimiter: bytes | None = None
    headers_separator: bytes = b","
    header_key_separator: bytes = b":"
    null_marker: bytes | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LineReader:
        given = {k: v for k, v in args.property if k in READER_PROPERTIES}
        properties = {**READER_PROPERTIES, **given}
        separator = args.key_separator
        if separator is None and _flag(properties, "parse.key"):
            separator = properties["key.separator"]
        if separator == "":
            raise CliError("the key separator is empty", exit_code=2)
        return cls(
            key_separator=separator.encode() if separator is not None else None,
            headers_delimiter=properties["headers.delimiter"].encode()
            if _flag(properties, "parse.headers")
            else None,
            headers_separator=properties["headers.separator"].encode(),
            header_key_separator=properties["headers.key.separator"].encode(),
            null_marker=properties["null.marker"].encode() or None,
        )

    def _nullable(self, data: bytes) -> bytes | None:
        return None if data == self.null_marker else data

    def read(self, line: bytes) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
        """(key, value, headers) of one line."""
        headers: list[tuple[str, bytes | None]] = []
        if self.headers_delimiter is not None:
            head, sep, rest = line.partition(self.headers_delimiter)
            if sep:
                line = rest
                for pair in head.split(self.headers_separator) if head else []:
                    name, _, value = pair.partition(self.header_key_separator)
                    headers.append((name.decode(errors="replace"), self._nullable(value)))
        key: bytes | None = None
        if self.key_separator is not None:
            head, sep, tail = line.partition(self.key_separator)
            if sep:
                key, line = self._nullable(head), tail
        return key, self._nullable(line), headers


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "produce",
        help="write records from stdin or a file, one per line",
        description="Send each input line as a record's value (the trailing newline removed). With "
        "--key-separator, the text before the first separator is the key (a line without it has a "
        "null key). Exits non-zero if any record was not acknowledged.\n\n"
        "kafka-console-producer's --property keys work too: parse.key=true with key.separator "
        "(default a tab), parse.headers=true with headers.delimiter (default a tab), "
        "headers.separator (,) and headers.key.separator (:), as in 'h1:v1,h2:v2<TAB>key<TAB>value', "
        "and null.marker (a key or value equal to it is null). kcat's -b, -t, -p and -K work as "
        "--bootstrap-server, --topic, --partition and --key-separator; --broker-list as "
        "--bootstrap-server.\n\n"
        "examples:\n"
        "  echo 'hello' | strom produce greetings\n"
        "  printf 'user1:signed up\\nuser2:logged in\\n' | strom produce events --key-separator : "
        "--header source=cli\n"
        "  printf 'user1:signed up\\n' | strom produce --topic events --property parse.key=true "
        "--property key.separator=:\n"
        "  echo hello | strom produce -b 127.0.0.1:9092 -t greetings",
    )
    add_either(parser, "topic", help="the topic", short="-t")
    parser.add_argument("--file", type=Path, metavar="PATH", help="read lines from PATH instead of stdin")
    parser.add_argument(
        "--key-separator", "-K", metavar="SEP", help="split each line into key SEP value (as parse.key=true)"
    )
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        type=_header,
        metavar="NAME=VALUE",
        help="a header on every record (repeatable; NAME alone for a null value)",
    )
    parser.add_argument("--partition", "-p", type=non_negative_int, metavar="N", help="write to partition N")
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
    # kafka-console-producer's old spelling, and kcat's.
    add_connection_options(parser, bootstrap_aliases=("-b", "--broker-list"))
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
        formatter=READER_PROPERTIES,
    )
    reader = LineReader.from_args(args)
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
            key, value, parsed = reader.read(line)
            producer.send(
                args.topic,
                value,
                key,
                partition=args.partition,
                headers=[*headers, *parsed],
                callback=delivered,
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
