"""``strom consume``: print a topic's records, from a position or as a member of a group."""

from __future__ import annotations

import argparse
import base64
import json
import re
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from strom.cli.common import (
    ArgumentParser,
    CliError,
    Subparsers,
    add_connection_options,
    add_either,
    add_parser,
    client_config,
    non_negative_int,
    parse_timestamp,
    positive_int,
)
from strom.client.cluster import TopicPartition
from strom.client.config import CONSUMER
from strom.client.consumer import Consumer, ConsumerRecord, OffsetAndMetadata
from strom.client.errors import ErrorCode, KafkaException

DEFAULT_FORMAT = "%s\\n"
_TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}
Piece = bytes | Callable[[ConsumerRecord], bytes]


def _headers_text(record: ConsumerRecord) -> bytes:
    # NAME=VALUE pairs joined by commas; a null value prints as the bare NAME (as --header takes it).
    return b",".join(
        name.encode() if value is None else name.encode() + b"=" + value for name, value in record.headers
    )


def _length(data: bytes | None) -> bytes:
    return str(-1 if data is None else len(data)).encode()


_FIELDS: dict[str, Callable[[ConsumerRecord], bytes]] = {
    "t": lambda r: r.topic.encode(),
    "p": lambda r: str(r.partition).encode(),
    "o": lambda r: str(r.offset).encode(),
    "k": lambda r: r.key or b"",
    "s": lambda r: r.value or b"",
    "T": lambda r: str(r.timestamp).encode(),
    "h": _headers_text,
    "K": lambda r: _length(r.key),
    "S": lambda r: _length(r.value),
    "R": lambda r: struct.pack(">i", -1 if r.value is None else len(r.value)),
}
_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", "0": b"\0"}
_TOKEN = re.compile(r"%(.)|\\x([0-9a-fA-F]{2})|\\(.)", re.DOTALL)


def compile_format(text: str) -> list[Piece]:
    """A kcat -f style template as literal bytes and field readers."""
    pieces: list[Piece] = []
    pos = 0
    for match in _TOKEN.finditer(text):
        if match.start() > pos:
            pieces.append(text[pos : match.start()].encode())
        field, code, escape = match.groups()
        if code is not None:
            pieces.append(bytes([int(code, 16)]))
        elif field is not None:
            if field == "%":
                pieces.append(b"%")
            elif field in _FIELDS:
                pieces.append(_FIELDS[field])
            else:
                raise argparse.ArgumentTypeError(f"unknown format token %{field}")
        elif escape in _ESCAPES:
            pieces.append(_ESCAPES[escape])
        else:
            pieces.append(("\\" + escape).encode())
        pos = match.end()
    if pos < len(text):
        pieces.append(text[pos:].encode())
    return pieces


# kafka-console-consumer's --property keys (its DefaultMessageFormatter's), with their defaults.
FORMATTER_PROPERTIES = {
    "print.timestamp": "false",
    "print.partition": "false",
    "print.offset": "false",
    "print.headers": "false",
    "print.key": "false",
    "print.value": "true",
    "key.separator": "\t",
    "line.separator": "\n",
    "headers.separator": ",",
    "null.literal": "null",
}


def formatter_pieces(given: dict[str, str]) -> list[Piece]:
    """What kafka-console-consumer prints for these --property keys: the chosen fields in its
    order (timestamp, partition, offset, headers, key, value), key.separator between them."""
    properties = {**FORMATTER_PROPERTIES, **given}
    shown = []
    for field in ("timestamp", "partition", "offset", "headers", "key", "value"):
        text = properties[f"print.{field}"].strip().lower()
        if text not in ("true", "false"):
            raise CliError(f"--property print.{field}: expected true or false, got {text!r}", exit_code=2)
        if text == "true":
            shown.append(field)
    null = properties["null.literal"].encode()
    header_separator = properties["headers.separator"].encode()

    def headers(record: ConsumerRecord) -> bytes:
        if not record.headers:
            return b"NO_HEADERS"
        return header_separator.join(
            name.encode() + b":" + (null if value is None else value) for name, value in record.headers
        )

    readers: dict[str, Piece] = {
        "timestamp": lambda r: (
            f"{_TIMESTAMP_TYPES.get(r.timestamp_type, 'NO_TIMESTAMP')}:{r.timestamp}".encode()
        ),
        "partition": lambda r: f"Partition:{r.partition}".encode(),
        "offset": lambda r: f"Offset:{r.offset}".encode(),
        "headers": headers,
        "key": lambda r: null if r.key is None else r.key,
        "value": lambda r: null if r.value is None else r.value,
    }
    pieces: list[Piece] = []
    for index, field in enumerate(shown):
        if index:
            pieces.append(properties["key.separator"].encode())
        pieces.append(readers[field])
    pieces.append(properties["line.separator"].encode())
    return pieces


def render(pieces: list[Piece], record: ConsumerRecord) -> bytes:
    return b"".join(p if isinstance(p, bytes) else p(record) for p in pieces)


def _json_bytes(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def record_json(record: ConsumerRecord) -> bytes:
    document = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestamp_type": _TIMESTAMP_TYPES.get(record.timestamp_type, str(record.timestamp_type)),
        "key": _json_bytes(record.key),
        "value": _json_bytes(record.value),
        "headers": [[name, _json_bytes(value)] for name, value in record.headers],
    }
    return json.dumps(document, ensure_ascii=False).encode() + b"\n"


def register(subparsers: Subparsers[ArgumentParser]) -> None:
    parser = add_parser(
        subparsers,
        "consume",
        help="print records",
        description="Print a topic's records. Without --group the consumer reads the partitions "
        "directly (all, or --partition) from the end, the beginning, an offset or a time; with "
        "--group it joins that consumer group and commits what it printed.\n\n"
        "--format tokens (as kcat -f): %t topic, %p partition, %o offset, %k key, %s value, "
        "%T timestamp (ms), %h headers (name=value,...), %K key size, %S value size (-1: null), "
        "%R value size as a 4-byte big-endian integer, %% a percent sign; \\n, \\t, \\r, \\\\ "
        "and \\xHH escapes. Default: '%s\\n'.\n"
        "--json prints one object per record: topic, partition, offset, timestamp, timestamp_type, "
        'key, value and headers ([name, value] pairs); non-UTF-8 bytes appear as {"base64": ...}.\n\n'
        "kafka-console-consumer's --property keys work too: print.key, print.timestamp, "
        "print.partition, print.offset, print.headers, print.value (=true or false), key.separator "
        "(default a tab), line.separator, headers.separator and null.literal.\n\n"
        "kcat's flags: -b, -t, -p, -o beginning|end|N|-N|s@MS, -f FMT, -K DELIM (as -f '%kDELIM%s\\n'), "
        "-c N and -e.\n\n"
        "examples:\n"
        "  strom consume orders --from-beginning --max-messages 10\n"
        "  strom consume orders --partition 0 --offset 42 --format '%o %k=%s\\n'\n"
        "  strom consume orders --timestamp 2024-05-01T12:00:00Z --json --timeout-ms 2000\n"
        "  strom consume orders --group audit --from-beginning\n"
        "  strom consume --topic orders --from-beginning -e\n"
        "  strom consume --topic orders --from-beginning --property print.key=true --property print.offset=true\n"
        "  strom consume -b 127.0.0.1:9092 -t orders -o beginning -e -f '%p:%o %k=%s\\n'",
    )
    add_either(parser, "topic", help="the topic", short="-t")
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the earliest offset (with --group: where the group has no committed offset)",
    )
    start.add_argument(
        "--offset",
        type=int,
        metavar="N",
        help="start at offset N in each partition (N < 0: N before the end)",
    )
    start.add_argument(
        "--timestamp",
        type=parse_timestamp,
        metavar="TIME",
        help="start at the first record at or after TIME (ISO-8601, UTC unless it has a zone, or ms)",
    )
    start.add_argument(
        "-o",
        dest="kcat_offset",
        type=kcat_offset,
        metavar="OFFSET",
        help="kcat's start: beginning, end, N, -N (N before the end) or s@MS (a timestamp)",
    )
    parser.add_argument(
        "--partition",
        "-p",
        action="append",
        type=non_negative_int,
        metavar="N",
        help="read only partition N (repeatable)",
    )
    parser.add_argument("--group", metavar="ID", help="consume as a member of this consumer group")
    parser.add_argument("--max-messages", "-c", type=positive_int, metavar="N", help="stop after N records")
    parser.add_argument(
        "-e",
        "--exit-at-end",
        action="store_true",
        help="stop once every partition has been read to the end offset it had when the consumer got it "
        "(as kcat -e)",
    )
    parser.add_argument(
        "--timeout-ms",
        type=positive_int,
        metavar="MS",
        help="stop when no record arrives for MS milliseconds",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--format", "-f", type=compile_format, metavar="FMT", help="output template (see above)"
    )
    output.add_argument("--json", action="store_true", help="one JSON object per record")
    output.add_argument("-K", dest="key_delimiter", metavar="DELIM", help="print key DELIM value (kcat's -K)")
    parser.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_committed: skip aborted transactions' records (default read_uncommitted)",
    )
    add_connection_options(parser, bootstrap_aliases=("-b",))
    parser.set_defaults(func=_run)


def kcat_offset(text: str) -> tuple[str, int]:
    """kcat's -o: ("beginning", 0), ("end", 0), ("offset", N) or ("timestamp", MS)."""
    word = text.strip()
    if word in ("beginning", "end"):
        return word, 0
    if word.startswith("s@") and word[2:].isdigit():
        return "timestamp", int(word[2:])
    if word.lstrip("-").isdigit():
        return "offset", int(word)
    raise argparse.ArgumentTypeError(f"expected beginning, end, N, -N or s@MS, got {text!r}")


def _from_kcat_offset(args: argparse.Namespace) -> None:
    """-o as the options it stands for, so that the rest reads only those."""
    if args.kcat_offset is None:
        return
    kind, value = args.kcat_offset
    if kind == "beginning":
        args.from_beginning = True
    elif kind == "offset":
        args.offset = value
    elif kind == "timestamp":
        args.timestamp = value


def _config(args: argparse.Namespace) -> dict[str, str]:
    defaults = {
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "isolation.level": args.isolation_level,
        # Printing a topic must not create it.
        "allow.auto.create.topics": "false",
        # Commits name exactly the records printed, never more (see _run).
        "enable.auto.commit": "false",
    }
    if args.group is not None:
        defaults["group.id"] = args.group
    return client_config(args, CONSUMER, defaults, kind="consumer", formatter=FORMATTER_PROPERTIES)


def _partitions(consumer: Consumer, topic: str, wanted: list[int] | None) -> list[TopicPartition]:
    try:
        existing = consumer.partitions_for(topic)
    except KafkaException as exc:
        if exc.error_code != ErrorCode.unknown_topic_or_partition:
            raise
        existing = []
    if not existing:
        raise CliError(f"topic '{topic}' does not exist")
    if wanted is None:
        return [TopicPartition(topic, p) for p in sorted(existing)]
    missing = sorted(set(wanted) - set(existing))
    if missing:
        raise CliError(f"topic '{topic}' has no partition {missing[0]}")
    return [TopicPartition(topic, p) for p in sorted(set(wanted))]


def _position(consumer: Consumer, args: argparse.Namespace, partitions: list[TopicPartition]) -> None:
    if args.offset is not None and args.offset >= 0:
        for tp in partitions:
            consumer.seek(tp, args.offset)
    elif args.offset is not None:
        beginning = consumer.beginning_offsets(partitions)
        end = consumer.end_offsets(partitions)
        for tp in partitions:
            consumer.seek(tp, max(beginning[tp], end[tp] + args.offset))
    elif args.timestamp is not None:
        found = consumer.offsets_for_times(dict.fromkeys(partitions, args.timestamp))
        for tp in partitions:
            hit = found.get(tp)
            if hit is None:
                consumer.seek_to_end([tp])
            else:
                consumer.seek(tp, hit.offset)
    elif args.from_beginning:
        consumer.seek_to_beginning(partitions)
    else:
        consumer.seek_to_end(partitions)


class _EndWatch:
    """Whether the consumer has read each partition it holds up to the end offset that partition
    had when the consumer first held it (a group member gets its partitions when it joins)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.ends: dict[TopicPartition, int] = {}

    def reached(self) -> bool:
        assignment = self.consumer.assignment()
        if not assignment:
            return False  # a group member that has not joined yet
        new = [tp for tp in assignment if tp not in self.ends]
        if new:
            self.ends.update(self.consumer.end_offsets(new))
        return all(self.consumer.position(tp) >= self.ends[tp] for tp in assignment)


def _emitter(args: argparse.Namespace) -> Callable[[ConsumerRecord], bytes]:
    properties = {k: v for k, v in args.property if k in FORMATTER_PROPERTIES}
    if properties and (args.format or args.json or args.key_delimiter is not None):
        raise CliError(
            f"--property {next(iter(properties))} formats the output as --format, -K and --json do: give one",
            exit_code=2,
        )
    if args.json:
        return record_json
    if properties:
        pieces = formatter_pieces(properties)
    elif args.key_delimiter is not None:
        pieces = [_FIELDS["k"], args.key_delimiter.encode(), _FIELDS["s"], b"\n"]
    else:
        pieces = args.format or compile_format(DEFAULT_FORMAT)
    return lambda r: render(pieces, r)


def _run(args: argparse.Namespace) -> int:
    _from_kcat_offset(args)
    if args.group is not None and (args.partition or args.offset is not None or args.timestamp is not None):
        raise CliError(
            "--partition, --offset and --timestamp read without a group; drop --group", exit_code=2
        )
    emit = _emitter(args)
    out = sys.stdout.buffer
    sys.stdout.flush()
    with Consumer(_config(args)) as consumer:
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
            partitions = _partitions(consumer, args.topic, args.partition)
            consumer.assign(partitions)
            _position(consumer, args, partitions)
        printed: dict[TopicPartition, OffsetAndMetadata] = {}
        count = 0
        idle_limit = args.timeout_ms / 1000 if args.timeout_ms else None
        last_record = time.monotonic()
        at_end = _EndWatch(consumer) if args.exit_at_end else None
        try:
            while args.max_messages is None or count < args.max_messages:
                if at_end is not None and at_end.reached():
                    break
                wait = (
                    0.5
                    if idle_limit is None
                    else max(0.0, min(0.5, last_record + idle_limit - time.monotonic()))
                )
                records = consumer.poll(timeout=wait)
                if not records:
                    if idle_limit is not None and time.monotonic() - last_record >= idle_limit:
                        break
                    continue
                last_record = time.monotonic()
                for record in records[: None if args.max_messages is None else args.max_messages - count]:
                    out.write(emit(record))
                    printed[TopicPartition(record.topic, record.partition)] = OffsetAndMetadata(
                        record.offset + 1
                    )
                    count += 1
                out.flush()
                if args.group is not None and printed:
                    consumer.commit_async(dict(printed))
        except KeyboardInterrupt:
            pass  # Ctrl-C is how an open-ended consume ends: commit what was printed and leave.
        if args.group is not None and printed:
            consumer.commit_sync(printed)
    return 0
