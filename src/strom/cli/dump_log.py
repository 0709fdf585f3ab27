"""``strom dump-log``: what a partition directory's files hold, as ``kafka-dump-log`` prints it.

Reads ``.log`` segments (every batch header; with ``--deep-iteration`` or ``--print-data-log``
every record), ``.index`` and ``.timeindex`` files (their entries, each checked against the
segment's batches), transaction indexes (``.txnindex``: a segment's aborted transactions) and
producer-state ``.snapshot`` files. Files are opened read-only and read
with plain reads, never through storage classes that create or resize files, so a running
broker's directory can be dumped safely (the active segment's indexes may then end in unused,
zero-filled slots, which are not entries: see ``_index_entries``).
"""

from __future__ import annotations

import argparse
import base64
import bisect
import json
import os
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from strom.records import batch as rb
from strom.records.codec import Record, decode_batch
from strom.records.control import decode_control_key, decode_end_txn_marker
from strom.storage.index import OffsetIndex, TimeIndex
from strom.storage.local_log import CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX
from strom.storage.log_segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from strom.storage.producer_state import SNAPSHOT_SUFFIX, read_snapshot
from strom.storage.transaction_index import TXN_INDEX_SUFFIX, TransactionIndex

_OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
_CODEC_NAMES = {code: name for name, code in rb.CompressionType.NAMES.items()}
_TIMESTAMP_TYPES = {
    rb.TimestampType.CREATE_TIME: "CreateTime",
    rb.TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}
# Files the broker renames during deletion, compaction and swaps keep their content's format.
_TRANSIENT_SUFFIXES = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX)

Event = dict[str, Any]


@dataclass
class Options:
    deep: bool
    print_data: bool
    index_sanity_check: bool
    verify_index_only: bool
    max_bytes: int


@dataclass
class Report:
    """Where events go (one text line or JSON object each) and whether any file had a problem."""

    out: TextIO
    as_json: bool
    problems: int = 0

    def emit(self, event: Event) -> None:
        if self.as_json:
            self.out.write(json.dumps(event, separators=(",", ":")) + "\n")
            return
        line = _TEXT[event["kind"]](event)
        if line is not None:
            self.out.write(line + "\n")

    def problem(self, event: Event) -> None:
        self.problems += 1
        self.emit(event)


# --------------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True)
class _Batch:
    position: int
    header: rb.BatchHeader


def _base_offset(path: Path) -> int:
    stem = path.name.split(".", 1)[0]
    if not stem.isdigit():
        raise ValueError(f"{path.name} is not named after a base offset")
    return int(stem)


def _scan(fd: int, size: int, limit: int) -> Iterator[_Batch | Event]:
    """The headers of the batches in a segment file; an ``invalid`` event where the bytes stop being
    whole, well-formed batches. Stops before the batch that would take the bytes read past ``limit``."""
    position = 0
    while position < size:
        reason = None
        if size - position < rb.HEADER_SIZE:
            reason = f"{size - position} bytes are too few for a batch header"
        else:
            try:
                header = rb.read_header(os.pread(fd, rb.HEADER_SIZE, position))
            except rb.InvalidBatchError as exc:
                reason = str(exc)
            else:
                if position + header.size > size:
                    reason = f"batch of {header.size} bytes runs past the end of the file"
        if reason is not None:
            yield {"kind": "invalid_bytes", "position": position, "bytes": size - position, "reason": reason}
            return
        if position + header.size > limit:
            return
        yield _Batch(position, header)
        position += header.size


def dump_segment(path: Path, opts: Options, report: Report) -> None:
    report.emit({"kind": "log_start", "file": str(path), "base_offset": _base_offset(path)})
    batches = records = valid_bytes = 0
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        for item in _scan(fd, size, opts.max_bytes):
            if isinstance(item, dict):
                report.problem({"file": str(path), **item})
                break
            data = os.pread(fd, item.header.size, item.position)
            event, ok = _batch_event(path, item.position, data, opts)
            if ok:
                report.emit(event)
            else:
                report.problem(event)
            batches += 1
            records += item.header.records_count
            valid_bytes = item.position + item.header.size
    report.emit(
        {
            "kind": "log_summary",
            "file": str(path),
            "batches": batches,
            "records": records,
            "bytes_read": valid_bytes,
            "size": size,
        }
    )


def _batch_event(path: Path, position: int, data: bytes, opts: Options) -> tuple[Event, bool]:
    """The batch at ``position`` (its bytes are ``data``) as an event, and whether it is sound."""
    header = rb.read_header(data)
    crc_valid = rb.is_crc_valid(data, header)
    event: Event = {
        "kind": "batch",
        "file": str(path),
        "base_offset": header.base_offset,
        "last_offset": header.last_offset,
        "count": header.records_count,
        "position": position,
        "size": header.size,
        "magic": header.magic,
        "crc": header.crc,
        "crc_valid": crc_valid,
        "compression": _CODEC_NAMES.get(header.compression, f"unknown({header.compression})"),
        "timestamp_type": _TIMESTAMP_TYPES[header.timestamp_type],
        "base_timestamp": header.base_timestamp,
        "max_timestamp": header.max_timestamp,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
        "last_sequence": header.last_sequence,
        "partition_leader_epoch": header.partition_leader_epoch,
        "is_transactional": header.is_transactional,
        "is_control": header.is_control,
        # With this flag set, baseTimestamp holds the delete horizon of the cleaner's tombstones (KIP-534).
        "delete_horizon_ms": header.base_timestamp if header.attributes & rb.DELETE_HORIZON_FLAG else None,
    }
    ok = crc_valid
    if not (header.is_control or opts.deep):
        return event, ok
    try:
        decoded = decode_batch(data, verify_crc=False).records
    except rb.InvalidBatchError as exc:
        event["error"] = f"records cannot be decoded: {exc}"
        return event, False
    if header.is_control:
        event["control_type"] = _control_type(decoded)
    if opts.deep:
        event["records"] = [_record_event(header, record, opts.print_data) for record in decoded]
    return event, ok


def _control_type(records: list[Record]) -> str:
    if not records:
        return "NONE"
    try:
        return decode_control_key(records[0].key).name
    except rb.InvalidBatchError:
        return "CORRUPT"


def _record_event(header: rb.BatchHeader, record: Record, print_data: bool) -> Event:
    event: Event = {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key_size": -1 if record.key is None else len(record.key),
        "value_size": -1 if record.value is None else len(record.value),
        "sequence": _sequence(header, record.offset),
        "header_keys": [key for key, _ in record.headers],
    }
    if header.is_control:
        try:
            marker = decode_end_txn_marker(record)
        except rb.InvalidBatchError:
            event["control_type"] = _control_type([record])
        else:
            event["end_txn_marker"] = marker.type.name
            event["coordinator_epoch"] = marker.coordinator_epoch
    elif print_data:
        event["key"] = _json_bytes(record.key)
        event["value"] = _json_bytes(record.value)
        event["headers"] = [[key, _json_bytes(value)] for key, value in record.headers]
    return event


def _sequence(header: rb.BatchHeader, offset: int) -> int:
    if header.base_sequence == rb.NO_SEQUENCE:
        return rb.NO_SEQUENCE
    return (header.base_sequence + offset - header.base_offset) % 0x80000000


def _json_bytes(data: bytes | None) -> str | dict[str, str] | None:
    """UTF-8 text as a string; other bytes as {"base64": ...}, so JSON output is lossless."""
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


# --------------------------------------------------------------------------- indexes


def _log_batches(index_path: Path, suffix: str) -> tuple[list[_Batch], int] | None:
    """The batches of the segment an index belongs to (same base name), and its size; None if absent."""
    log_path = index_path.with_name(index_path.name.replace(suffix, LOG_SUFFIX, 1))
    try:
        with open(log_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            batches = [item for item in _scan(f.fileno(), size, size) if isinstance(item, _Batch)]
    except FileNotFoundError:
        return None
    return batches, size


def _index_entries(data: bytes, entry: struct.Struct) -> tuple[list[tuple[int, int]], int]:
    """The entries in use and how many unused slots follow them.

    An active segment's index may be preallocated, zero-filled, and trimmed only when the segment
    rolls or the log closes. As Kafka's DumpLogSegments reads it, a slot whose relative offset is 0
    after the first slot ends the entries (offsets only grow). The first slot is unused when it is
    all zero: an offset entry is never written for position 0 (the first batch is never indexed,
    entries follow index.interval.bytes of batches), and a time entry of timestamp 0 at the base
    offset is as good as none.
    """
    usable = len(data) // entry.size
    entries: list[tuple[int, int]] = []
    for n, (first, second) in enumerate(entry.iter_unpack(data[: usable * entry.size])):
        relative = second if entry is _TIME_ENTRY else first
        if (n > 0 and relative == 0) or (first == 0 and second == 0):
            return entries, usable - n
        entries.append((first, second))
    return entries, 0


def dump_offset_index(path: Path, opts: Options, report: Report) -> None:
    base = _base_offset(path)
    data = path.read_bytes()
    raw, unused = _index_entries(data, _OFFSET_ENTRY)
    entries = [(base + relative, position) for relative, position in raw]
    report.emit({"kind": "index_start", "file": str(path), "base_offset": base})
    log = _log_batches(path, INDEX_SUFFIX)
    if opts.index_sanity_check:
        reason = _offset_index_insanity(len(data), base, entries, None if log is None else log[1])
        _emit_sanity(path, reason, report)
        return
    positions = {batch.position: batch.header for batch in log[0]} if log is not None else {}
    previous = (-1, -1)
    for offset, position in entries:
        if not opts.verify_index_only:
            report.emit(
                {"kind": "offset_index_entry", "file": str(path), "offset": offset, "position": position}
            )
        reason = None
        if offset <= previous[0] or position <= previous[1]:
            reason = f"entry does not follow the previous one (offset {previous[0]}, position {previous[1]})"
        elif log is not None:
            header = positions.get(position)
            if header is None:
                reason = "no batch starts at this position of the log"
            elif not header.base_offset <= offset <= header.last_offset:
                reason = f"the batch there holds offsets {header.base_offset}-{header.last_offset}"
        if reason is not None:
            report.problem(
                {
                    "kind": "index_mismatch",
                    "file": str(path),
                    "offset": offset,
                    "position": position,
                    "reason": reason,
                }
            )
        previous = (offset, position)
    _emit_index_summary(path, len(entries), unused, log is not None, report)


def _offset_index_insanity(
    length: int, base: int, entries: list[tuple[int, int]], log_size: int | None
) -> str | None:
    if length % OffsetIndex.entry_size:
        return f"its size {length} is not a multiple of {OffsetIndex.entry_size}"
    for n, (offset, position) in enumerate(entries):
        if offset < base:
            return f"entry {n} has offset {offset}, below the base offset {base}"
        if n and (offset <= entries[n - 1][0] or position <= entries[n - 1][1]):
            return f"entry {n} (offset {offset}, position {position}) does not follow entry {n - 1}"
        if log_size is not None and position >= log_size:
            return f"entry {n} points at position {position}, past the log's {log_size} bytes"
    return None


def dump_time_index(path: Path, opts: Options, report: Report) -> None:
    base = _base_offset(path)
    data = path.read_bytes()
    raw, unused = _index_entries(data, _TIME_ENTRY)
    entries = [(timestamp, base + relative) for timestamp, relative in raw]
    report.emit({"kind": "index_start", "file": str(path), "base_offset": base})
    log = _log_batches(path, TIME_INDEX_SUFFIX)
    if opts.index_sanity_check:
        reason = _time_index_insanity(len(data), base, entries)
        _emit_sanity(path, reason, report)
        return
    batches = log[0] if log is not None else []
    last_offsets = [batch.header.last_offset for batch in batches]
    previous = (-1, -1)
    for timestamp, offset in entries:
        if not opts.verify_index_only:
            report.emit(
                {"kind": "time_index_entry", "file": str(path), "timestamp": timestamp, "offset": offset}
            )
        reason = None
        if timestamp <= previous[0] or offset < previous[1]:
            reason = f"entry does not follow the previous one (timestamp {previous[0]}, offset {previous[1]})"
        elif log is not None:
            # The entry names the batch holding the segment's largest timestamp so far.
            slot = bisect.bisect_left(last_offsets, offset)
            if slot == len(batches) or batches[slot].header.base_offset > offset:
                reason = "no batch of the log holds this offset"
            elif batches[slot].header.max_timestamp != timestamp:
                reason = f"the batch holding it has max timestamp {batches[slot].header.max_timestamp}"
        if reason is not None:
            report.problem(
                {
                    "kind": "time_index_mismatch",
                    "file": str(path),
                    "timestamp": timestamp,
                    "offset": offset,
                    "reason": reason,
                }
            )
        previous = (timestamp, offset)
    _emit_index_summary(path, len(entries), unused, log is not None, report)


def _time_index_insanity(length: int, base: int, entries: list[tuple[int, int]]) -> str | None:
    if length % TimeIndex.entry_size:
        return f"its size {length} is not a multiple of {TimeIndex.entry_size}"
    for n, (timestamp, offset) in enumerate(entries):
        if offset < base:
            return f"entry {n} has offset {offset}, below the base offset {base}"
        if n and (timestamp <= entries[n - 1][0] or offset < entries[n - 1][1]):
            return f"entry {n} (timestamp {timestamp}, offset {offset}) does not follow entry {n - 1}"
    return None


def _emit_sanity(path: Path, reason: str | None, report: Report) -> None:
    event: Event = {"kind": "sanity_check", "file": str(path), "passed": reason is None, "reason": reason}
    if reason is None:
        report.emit(event)
    else:
        report.problem(event)


def _emit_index_summary(path: Path, entries: int, unused: int, verified: bool, report: Report) -> None:
    report.emit(
        {
            "kind": "index_summary",
            "file": str(path),
            "entries": entries,
            "unused_slots": unused,
            "verified_against_log": verified,
        }
    )


# --------------------------------------------------------------------------- producer snapshots


def dump_snapshot(path: Path, report: Report) -> None:
    report.emit({"kind": "snapshot_start", "file": str(path), "offset": _base_offset(path)})
    try:
        producers = read_snapshot(path)
    except ValueError as exc:
        report.problem({"kind": "invalid_snapshot", "file": str(path), "reason": str(exc)})
        return
    for entry in producers.values():
        last = entry.batches[-1]
        report.emit(
            {
                "kind": "producer_state",
                "file": str(path),
                "producer_id": entry.producer_id,
                "producer_epoch": entry.producer_epoch,
                "coordinator_epoch": entry.coordinator_epoch,
                "current_txn_first_offset": entry.current_txn_first_offset,
                "first_sequence": last.first_seq,
                "last_sequence": last.last_seq,
                "first_offset": last.first_offset,
                "last_offset": last.last_offset,
                "timestamp": last.timestamp,
            }
        )


# --------------------------------------------------------------------------- transaction indexes


def dump_txn_index(path: Path, report: Report) -> None:
    """A segment's aborted transactions, as Kafka's DumpLogSegments prints a .txnindex."""
    report.emit({"kind": "txn_index_start", "file": str(path)})
    index = TransactionIndex(path, _base_offset(path), exists=True)
    if index.damaged is not None:
        report.problem({"kind": "invalid_txn_index", "file": str(path), "reason": str(index.damaged)})
        return
    for txn in index.all():
        report.emit(
            {
                "kind": "aborted_txn",
                "file": str(path),
                "producer_id": txn.producer_id,
                "first_offset": txn.first_offset,
                "last_offset": txn.last_offset,
                "last_stable_offset": txn.last_stable_offset,
            }
        )


# --------------------------------------------------------------------------- text rendering


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _text(data: Any) -> str:
    if data is None:
        return "null"
    if isinstance(data, dict):
        return "base64:" + str(data["base64"])
    return str(data)


def _batch_text(e: Event) -> str:
    line = (
        f"baseOffset: {e['base_offset']} lastOffset: {e['last_offset']} count: {e['count']} "
        f"baseSequence: {e['base_sequence']} lastSequence: {e['last_sequence']} "
        f"producerId: {e['producer_id']} producerEpoch: {e['producer_epoch']} "
        f"partitionLeaderEpoch: {e['partition_leader_epoch']} isTransactional: {_flag(e['is_transactional'])} "
        f"isControl: {_flag(e['is_control'])}"
    )
    if "control_type" in e:
        line += f" controlType: {e['control_type']}"
    if e["delete_horizon_ms"] is not None:
        line += f" deleteHorizonMs: {e['delete_horizon_ms']}"
    line += (
        f" position: {e['position']} {e['timestamp_type']}: {e['max_timestamp']} "
        f"baseTimestamp: {e['base_timestamp']} size: {e['size']} magic: {e['magic']} "
        f"compresscodec: {e['compression']} crc: {e['crc']} isvalid: {_flag(e['crc_valid'])}"
    )
    lines = [line]
    if "error" in e:
        lines.append(f"| error: {e['error']}")
    for r in e.get("records", ()):
        record = (
            f"| offset: {r['offset']} {e['timestamp_type']}: {r['timestamp']} keySize: {r['key_size']} "
            f"valueSize: {r['value_size']} sequence: {r['sequence']} headerKeys: [{','.join(r['header_keys'])}]"
        )
        if "end_txn_marker" in r:
            record += f" endTxnMarker: {r['end_txn_marker']} coordinatorEpoch: {r['coordinator_epoch']}"
        elif "control_type" in r:
            record += f" controlType: {r['control_type']}"
        elif "value" in r:
            if r["key"] is not None:
                record += f" key: {_text(r['key'])}"
            record += f" payload: {_text(r['value'])}"
            if r["headers"]:
                record += " headers: [" + ", ".join(f"{k}={_text(v)}" for k, v in r["headers"]) + "]"
        lines.append(record)
    return "\n".join(lines)


def _index_summary_text(e: Event) -> str:
    line = f"{e['entries']} entries"
    if e["unused_slots"]:
        line += f" ({e['unused_slots']} unused preallocated slots after them)"
    if not e["verified_against_log"]:
        line += "; not checked: the segment's .log file is missing"
    return line


_TEXT: dict[str, Callable[[Event], str | None]] = {
    "log_start": lambda e: f"Dumping {e['file']}\nLog starting offset: {e['base_offset']}",
    "batch": _batch_text,
    "invalid_bytes": lambda e: (
        f"Found {e['bytes']} invalid bytes at position {e['position']} of {e['file']}: {e['reason']}"
    ),
    "log_summary": lambda e: (
        f"{e['batches']} batches, {e['records']} records, {e['bytes_read']} of {e['size']} bytes read"
    ),
    "index_start": lambda e: f"Dumping {e['file']}",
    "offset_index_entry": lambda e: f"offset: {e['offset']} position: {e['position']}",
    "time_index_entry": lambda e: f"timestamp: {e['timestamp']} offset: {e['offset']}",
    "index_mismatch": lambda e: (
        f"Index mismatch in {e['file']}: offset {e['offset']} position {e['position']}: {e['reason']}"
    ),
    "time_index_mismatch": lambda e: (
        f"Time index mismatch in {e['file']}: timestamp {e['timestamp']} offset {e['offset']}: {e['reason']}"
    ),
    "sanity_check": lambda e: (
        f"{e['file']} passed sanity check."
        if e["passed"]
        else f"{e['file']} failed sanity check: {e['reason']}"
    ),
    "index_summary": _index_summary_text,
    "snapshot_start": lambda e: f"Dumping {e['file']}",
    "txn_index_start": lambda e: f"Dumping {e['file']}",
    "invalid_txn_index": lambda e: f"{e['file']} is not a valid transaction index: {e['reason']}",
    "aborted_txn": lambda e: (
        f"version: 0 producerId: {e['producer_id']} firstOffset: {e['first_offset']} "
        f"lastOffset: {e['last_offset']} lastStableOffset: {e['last_stable_offset']}"
    ),
    "invalid_snapshot": lambda e: f"{e['file']} is not a valid producer snapshot: {e['reason']}",
    "producer_state": lambda e: (
        f"producerId: {e['producer_id']} producerEpoch: {e['producer_epoch']} "
        f"coordinatorEpoch: {e['coordinator_epoch']} currentTxnFirstOffset: {e['current_txn_first_offset']} "
        f"firstSequence: {e['first_sequence']} lastSequence: {e['last_sequence']} "
        f"firstOffset: {e['first_offset']} lastOffset: {e['last_offset']} timestamp: {e['timestamp']}"
    ),
}


# --------------------------------------------------------------------------- command


def _kind(path: Path) -> str:
    name = path.name
    while name.endswith(_TRANSIENT_SUFFIXES):
        name = name.rsplit(".", 1)[0]
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, SNAPSHOT_SUFFIX, TXN_INDEX_SUFFIX):
        if name.endswith(suffix):
            return suffix
    return ""


def _expand(paths: list[Path], errors: TextIO) -> Iterator[Path]:
    """The files to dump: each file given, and the dumpable files of each directory given, in name
    order. A path that does not exist is yielded too, for dump() to report."""
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.iterdir() if _kind(p))
        elif _kind(path) or not path.exists():
            yield path
        else:
            print(
                f"strom dump-log: skipping {path}: not a .log, .index, .timeindex, .txnindex or .snapshot file",
                file=errors,
            )


def dump(paths: list[Path], opts: Options, out: TextIO, errors: TextIO, as_json: bool) -> int:
    """Dump every file (and every dumpable file of a directory); returns the number of problems
    found: files that cannot be read, invalid bytes, CRC failures, index entries that fail a check."""
    report = Report(out, as_json)
    unreadable = 0
    for path in _expand(paths, errors):
        kind = _kind(path)
        if not path.is_file():
            reason = "not a file" if path.exists() else "no such file or directory"
            print(f"strom dump-log: error: cannot read {path}: {reason}", file=errors)
            unreadable += 1
            continue
        try:
            if kind == LOG_SUFFIX:
                dump_segment(path, opts, report)
            elif kind == INDEX_SUFFIX:
                dump_offset_index(path, opts, report)
            elif kind == TIME_INDEX_SUFFIX:
                dump_time_index(path, opts, report)
            elif kind == TXN_INDEX_SUFFIX:
                dump_txn_index(path, report)
            else:
                dump_snapshot(path, report)
        except BrokenPipeError:
            raise
        except OSError as exc:
            print(f"strom dump-log: error: cannot read {path}: {exc.strerror}", file=errors)
            unreadable += 1
        except ValueError as exc:
            print(f"strom dump-log: error: {exc}", file=errors)
            unreadable += 1
    return report.problems + unreadable


def _run(args: argparse.Namespace) -> int:
    opts = Options(
        deep=args.deep_iteration or args.print_data_log,
        print_data=args.print_data_log,
        index_sanity_check=args.index_sanity_check,
        verify_index_only=args.verify_index_only,
        max_bytes=args.max_bytes,
    )
    try:
        problems = dump(args.files, opts, sys.stdout, sys.stderr, args.json)
    except BrokenPipeError:
        # The reader (e.g. head) is gone; keep the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if problems:
        print(f"strom dump-log: error: {problems} problem(s) found", file=sys.stderr)
        return 1
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "dump-log",
        help="print the batches, records, index entries or producer state in log files",
        description=(
            "Print what a partition directory's files hold, as kafka-dump-log does: for .log segments "
            "every batch (offsets, position, size, CRC check, codec, timestamps, producer id/epoch/sequence, "
            "transactional and control flags with the marker type); for .index and .timeindex files their "
            "entries, each checked against the segment's .log; for .snapshot files the producer state. "
            "Files are only read, so a running broker's directory can be dumped: the unused, zero-filled "
            "slots at the end of an open segment's indexes are not entries. Exits with 1 if a path does not "
            "exist, a file cannot be read or a file shows a problem (bytes that are not whole batches, a CRC "
            "mismatch, an index entry that does not match the log)."
        ),
    )
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help=".log, .index, .timeindex or .snapshot file, or a partition directory (all of those in it)",
    )
    parser.add_argument(
        "--deep-iteration",
        action="store_true",
        help="also print each record's offset, timestamp, sizes and sequence",
    )
    parser.add_argument(
        "--print-data-log",
        action="store_true",
        help="also print each record's key, value and headers (implies --deep-iteration)",
    )
    parser.add_argument(
        "--index-sanity-check",
        action="store_true",
        help="for index files only check that the entries are well-formed and ordered",
    )
    parser.add_argument(
        "--verify-index-only",
        action="store_true",
        help="for index files print only the entries that do not match the log",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=2**31 - 1,
        metavar="N",
        help="read at most N bytes of batches from each .log file",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per line, each with a "kind" (batch, offset_index_entry, ...); '
        'non-UTF-8 keys and values appear as {"base64": ...}',
    )
    parser.set_defaults(func=_run)
