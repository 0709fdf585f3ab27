"""``strom dump-log`` on the files a real broker wrote, and on hand-built files with what a broker
cannot be made to write here (transaction markers, corruption, unused index slots).

The broker test produces with confluent-kafka: an idempotent, lz4-compressed producer (records with
headers) and a plain one (a binary value with an explicit timestamp), stops the broker so that the
segment's indexes are trimmed and a producer snapshot is written, and dumps the partition directory.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from brokerproc import BrokerProcess
from strom.cli import dump_log
from strom.records.batch import CompressionType, TimestampType, read_header
from strom.records.codec import RecordSpec, encode_batch
from strom.records.control import ControlRecordType, build_control_batch

TOPIC = "dumped"
PLAIN_TIMESTAMP = 1_700_000_000_000
BINARY_VALUE = b"\xff\x00\xfebinary"


def run(*argv: str | Path) -> tuple[int, str, str]:
    """``strom dump-log ARGV`` in this process: exit status, stdout, stderr."""
    parser = argparse.ArgumentParser(prog="strom")
    dump_log.register(parser.add_subparsers())
    args = parser.parse_args(["dump-log", *map(str, argv)])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = args.func(args)
    return status, out.getvalue(), err.getvalue()


def events(text: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, text.splitlines()) if e["kind"] == kind]


@pytest.fixture(scope="module")
def partition_dir(broker: BrokerProcess) -> Path:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # An index entry for every batch but the first (entries come after index.interval.bytes).
    topic = NewTopic(TOPIC, num_partitions=1, replication_factor=1, config={"index.interval.bytes": "1"})
    admin.create_topics([topic])[TOPIC].result(10)
    idempotent = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 1000,
        }
    )
    # All five are queued before the flush sends them: one batch.
    for i in range(5):
        idempotent.produce(
            TOPIC, key=b"k%d" % i, value=b"value %d" % i, headers=[("h", b"%d" % i)], partition=0
        )
    assert idempotent.flush(10) == 0
    plain = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, "linger.ms": 0})
    plain.produce(TOPIC, value=BINARY_VALUE, timestamp=PLAIN_TIMESTAMP, headers=[("n", None)], partition=0)
    assert plain.flush(10) == 0
    for i in range(5, 7):
        idempotent.produce(TOPIC, key=b"k%d" % i, value=b"value %d" % i, partition=0)
    assert idempotent.flush(10) == 0
    broker.stop()
    return broker.data_dir / f"{TOPIC}-0"


def test_segment_batches_and_records(partition_dir: Path) -> None:
    status, out, err = run("--json", "--print-data-log", partition_dir / "00000000000000000000.log")
    assert (status, err) == (0, "")
    batches = events(out, "batch")
    assert [(b["base_offset"], b["last_offset"], b["count"]) for b in batches] == [
        (0, 4, 5),
        (5, 5, 1),
        (6, 7, 2),
    ]
    first, plain, second = batches
    assert all(b["crc_valid"] and b["magic"] == 2 and not b["is_control"] for b in batches)
    assert first["compression"] == "lz4" and plain["compression"] == "none"
    # Idempotent batches carry the producer id the broker gave, epoch 0 and consecutive sequences.
    assert first["producer_id"] >= 0 and first["producer_id"] == second["producer_id"]
    assert (first["producer_epoch"], first["base_sequence"], first["last_sequence"]) == (0, 0, 4)
    assert (second["base_sequence"], second["last_sequence"]) == (5, 6)
    assert (plain["producer_id"], plain["producer_epoch"], plain["base_sequence"]) == (-1, -1, -1)
    assert plain["base_timestamp"] == plain["max_timestamp"] == PLAIN_TIMESTAMP
    assert all(b["timestamp_type"] == "CreateTime" and b["partition_leader_epoch"] >= 0 for b in batches)
    # Positions and sizes tile the file.
    assert [b["position"] for b in batches] == [0, first["size"], first["size"] + plain["size"]]
    size = (partition_dir / "00000000000000000000.log").stat().st_size
    assert batches[-1]["position"] + batches[-1]["size"] == size
    records = first["records"]
    assert [(r["offset"], r["key"], r["value"], r["headers"], r["sequence"]) for r in records] == [
        (i, f"k{i}", f"value {i}", [["h", str(i)]], i) for i in range(5)
    ]
    (binary,) = plain["records"]
    assert binary["key"] is None and binary["key_size"] == -1
    assert base64.b64decode(binary["value"]["base64"]) == BINARY_VALUE
    assert binary["headers"] == [["n", None]] and binary["timestamp"] == PLAIN_TIMESTAMP
    (summary,) = events(out, "log_summary")
    assert (summary["batches"], summary["records"], summary["bytes_read"]) == (3, 8, size)


def test_segment_text(partition_dir: Path) -> None:
    status, out, _ = run("--deep-iteration", partition_dir / "00000000000000000000.log")
    assert status == 0
    lines = out.splitlines()
    assert lines[:2] == [f"Dumping {partition_dir / '00000000000000000000.log'}", "Log starting offset: 0"]
    batch_lines = [line for line in lines if line.startswith("baseOffset:")]
    assert len(batch_lines) == 3
    assert "baseOffset: 0 lastOffset: 4 count: 5 baseSequence: 0 lastSequence: 4" in batch_lines[0]
    assert "compresscodec: lz4" in batch_lines[0] and "isvalid: true" in batch_lines[0]
    assert f"CreateTime: {PLAIN_TIMESTAMP}" in batch_lines[1]
    record_lines = [line for line in lines if line.startswith("| offset:")]
    assert len(record_lines) == 8
    # --deep-iteration without --print-data-log shows record metadata, not the data.
    assert "keySize: 2 valueSize: 7 sequence: 0 headerKeys: [h]" in record_lines[0]
    assert "payload" not in out


def test_indexes_match_the_segment(partition_dir: Path) -> None:
    status, out, _ = run("--json", partition_dir)
    assert status == 0
    assert not events(out, "index_mismatch") and not events(out, "time_index_mismatch")
    positions = {b["base_offset"]: b["position"] for b in events(out, "batch")}
    entries = [(e["offset"], e["position"]) for e in events(out, "offset_index_entry")]
    # index.interval.bytes=1: every batch after the first has its entry, at its own position.
    assert entries == [(5, positions[5]), (6, positions[6])]
    time_entries = [(e["timestamp"], e["offset"]) for e in events(out, "time_index_entry")]
    max_timestamp = max(b["max_timestamp"] for b in events(out, "batch"))
    assert time_entries and time_entries[-1][0] == max_timestamp
    summaries = events(out, "index_summary")
    assert (
        all(s["verified_against_log"] and s["unused_slots"] == 0 for s in summaries) and len(summaries) == 2
    )


def test_index_sanity_check(partition_dir: Path) -> None:
    status, out, _ = run("--index-sanity-check", partition_dir / "00000000000000000000.index")
    assert status == 0
    assert f"{partition_dir / '00000000000000000000.index'} passed sanity check." in out.splitlines()


def test_producer_snapshot(partition_dir: Path) -> None:
    status, out, _ = run("--json", partition_dir)
    assert status == 0
    producer_id = events(out, "batch")[0]["producer_id"]
    states = events(out, "producer_state")
    assert [
        (s["producer_id"], s["producer_epoch"], s["last_sequence"], s["last_offset"]) for s in states
    ] == [(producer_id, 0, 6, 7)]


# --------------------------------------------------------------------------- hand-built files


def write_segment(directory: Path, *batches: bytes) -> Path:
    path = directory / "00000000000000000100.log"
    path.write_bytes(b"".join(batches))
    return path


def test_transaction_markers(tmp_path: Path) -> None:
    data = encode_batch(
        [RecordSpec(b"k", b"v")],
        base_offset=100,
        producer_id=9,
        producer_epoch=2,
        base_sequence=0,
        is_transactional=True,
    )
    commit = build_control_batch(
        ControlRecordType.COMMIT, producer_id=9, producer_epoch=2, coordinator_epoch=4, base_offset=101
    )
    abort = build_control_batch(
        ControlRecordType.ABORT, producer_id=9, producer_epoch=3, coordinator_epoch=4, base_offset=102
    )
    path = write_segment(tmp_path, data, commit, abort)
    status, out, _ = run("--json", "--deep-iteration", path)
    assert status == 0
    batches = events(out, "batch")
    assert [(b["is_transactional"], b["is_control"], b.get("control_type")) for b in batches] == [
        (True, False, None),
        (True, True, "COMMIT"),
        (True, True, "ABORT"),
    ]
    assert [(r["end_txn_marker"], r["coordinator_epoch"]) for b in batches[1:] for r in b["records"]] == [
        ("COMMIT", 4),
        ("ABORT", 4),
    ]
    status, text, _ = run(path)
    assert "isControl: true controlType: COMMIT" in text and "controlType: ABORT" in text


def test_log_append_time_and_max_bytes(tmp_path: Path) -> None:
    batches = [
        encode_batch(
            [RecordSpec(None, b"x", timestamp=5)],
            base_offset=100 + i,
            timestamp_type=TimestampType.LOG_APPEND_TIME,
        )
        for i in range(3)
    ]
    path = write_segment(tmp_path, *batches)
    status, out, _ = run("--json", "--max-bytes", str(2 * len(batches[0])), path)
    assert status == 0
    dumped = events(out, "batch")
    assert [b["base_offset"] for b in dumped] == [100, 101]
    assert dumped[0]["timestamp_type"] == "LogAppendTime"


def test_corrupt_batch_and_torn_tail(tmp_path: Path) -> None:
    good = encode_batch([RecordSpec(b"k", b"v")], base_offset=100)
    bad = bytearray(
        encode_batch([RecordSpec(b"k", b"value")], base_offset=101, compression=CompressionType.ZSTD)
    )
    bad[-1] ^= 0xFF
    torn = encode_batch([RecordSpec(b"k", b"v")], base_offset=102)[:-3]
    path = write_segment(tmp_path, good, bytes(bad), torn)
    status, out, err = run("--json", "--print-data-log", path)
    assert status == 1 and "2 problem(s) found" in err
    dumped = events(out, "batch")
    assert [(b["base_offset"], b["crc_valid"]) for b in dumped] == [(100, True), (101, False)]
    assert "error" in dumped[1]  # its zstd payload no longer decodes
    (invalid,) = events(out, "invalid_bytes")
    assert invalid["position"] == len(good) + len(bad) and invalid["bytes"] == len(torn)
    status, text, _ = run(path)
    assert status == 1
    assert f"Found {len(torn)} invalid bytes at position {len(good) + len(bad)}" in text


def test_index_checks_against_the_log(tmp_path: Path) -> None:
    batches = [encode_batch([RecordSpec(None, b"x")] * 2, base_offset=100 + 2 * i) for i in range(3)]
    write_segment(tmp_path, *batches)
    size = len(batches[0])
    index = tmp_path / "00000000000000000100.index"
    # Entry 1 names an offset its batch does not hold; three zero slots follow (a preallocated index).
    index.write_bytes(struct.pack(">ii", 2, size) + struct.pack(">ii", 3, 2 * size) + bytes(24))
    status, out, _ = run("--json", index)
    assert status == 1
    assert [(e["offset"], e["position"]) for e in events(out, "offset_index_entry")] == [
        (102, size),
        (103, 2 * size),
    ]
    (mismatch,) = events(out, "index_mismatch")
    assert mismatch["offset"] == 103 and "holds offsets 104-105" in mismatch["reason"]
    (summary,) = events(out, "index_summary")
    assert (summary["entries"], summary["unused_slots"]) == (2, 3)
    # --verify-index-only prints only what fails.
    status, out, _ = run("--json", "--verify-index-only", index)
    assert status == 1 and not events(out, "offset_index_entry") and len(events(out, "index_mismatch")) == 1

    timeindex = tmp_path / "00000000000000000100.timeindex"
    max_ts = [read_header(b).max_timestamp for b in batches]
    timeindex.write_bytes(struct.pack(">qi", max_ts[0], 1) + struct.pack(">qi", max_ts[2] + 1, 5))
    status, out, _ = run("--json", timeindex)
    mismatches = events(out, "time_index_mismatch")
    assert status == 1 and [m["offset"] for m in mismatches] == [105]


def test_sanity_check_failure_and_unknown_files(tmp_path: Path) -> None:
    index = tmp_path / "00000000000000000100.index"
    index.write_bytes(struct.pack(">ii", 4, 100) + struct.pack(">ii", 2, 200) + b"\x00")
    status, out, _ = run("--index-sanity-check", index)
    assert status == 1 and "failed sanity check: its size 17 is not a multiple of 8" in out
    (tmp_path / "leader-epoch-checkpoint").write_text("0\n0\n")
    status, out, err = run(tmp_path / "leader-epoch-checkpoint", tmp_path / "00000000000000000100.log")
    assert status == 1
    assert "skipping" in err and "leader-epoch-checkpoint" in err
    assert "cannot read" in err and "00000000000000000100.log" in err


def test_a_path_that_does_not_exist_fails(tmp_path: Path) -> None:
    for missing in (tmp_path / "no-such-dir", tmp_path / "00000000000000000000.index"):
        status, out, err = run(missing)
        assert (status, out) == (1, "")
        assert err.splitlines() == [
            f"strom dump-log: error: cannot read {missing}: no such file or directory",
            "strom dump-log: error: 1 problem(s) found",
        ]


@pytest.mark.parametrize("slots", [0, 1, 4])
def test_unused_index_slots_are_not_entries(tmp_path: Path, slots: int) -> None:
    """A live segment's indexes, preallocated (zero-filled slots) or not (no slots): no entries,
    no problem, whatever the segment holds."""
    write_segment(tmp_path, encode_batch([RecordSpec(None, b"x")] * 3, base_offset=100))
    (tmp_path / "00000000000000000100.index").write_bytes(bytes(8 * slots))
    (tmp_path / "00000000000000000100.timeindex").write_bytes(bytes(12 * slots))
    status, out, err = run("--json", tmp_path)
    assert (status, err) == (0, "")
    assert not [e for e in map(json.loads, out.splitlines()) if e["kind"].endswith(("entry", "mismatch"))]
    summaries = events(out, "index_summary")
    assert [(s["entries"], s["unused_slots"]) for s in summaries] == [(0, slots), (0, slots)]


def test_a_live_segment_is_healthy(running_broker: BrokerProcess) -> None:
    """The broker's open segments, whatever their indexes hold so far: the default
    index.interval.bytes (no entry yet) and an entry per batch."""
    admin = AdminClient({"bootstrap.servers": running_broker.bootstrap})
    topics = {"live-sparse": {}, "live-dense": {"index.interval.bytes": "1"}}
    for name, config in topics.items():
        admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(10)
    producer = Producer({"bootstrap.servers": running_broker.bootstrap, "linger.ms": 0})
    for i in range(4):
        for name in topics:
            producer.produce(name, b"value %d" % i, partition=0)
        assert producer.flush(10) == 0  # one batch each time
    for name in topics:
        status, out, err = run("--json", running_broker.data_dir / f"{name}-0")
        assert (status, err) == (0, ""), out
        assert not [e for e in map(json.loads, out.splitlines()) if e["kind"].endswith("mismatch")]
        assert sum(b["count"] for b in events(out, "batch")) == 4
        offset_entries = events(out, "offset_index_entry")
        time_entries = events(out, "time_index_entry")
        if name == "live-dense":
            assert [e["offset"] for e in offset_entries] == [1, 2, 3]
            # A batch in the same millisecond as the last indexed one adds no time entry.
            assert time_entries and {e["offset"] for e in time_entries} <= {1, 2, 3}
        else:
            assert offset_entries == [] and time_entries == []
        status, out, _ = run("--index-sanity-check", running_broker.data_dir / f"{name}-0")
        assert status == 0 and out.count("passed sanity check.") == 2


def test_transaction_index(tmp_path: Path) -> None:
    """A .txnindex in Kafka's layout (34-byte entries), as DumpLogSegments prints it; a torn one
    is a problem."""
    index = tmp_path / "00000000000000000100.txnindex"
    entries = struct.pack(">hqqqq", 0, 7, 100, 105, 100) + struct.pack(">hqqqq", 0, 9, 103, 110, 106)
    index.write_bytes(entries)
    status, out, _ = run(index)
    assert status == 0
    assert out.splitlines()[1:] == [
        "version: 0 producerId: 7 firstOffset: 100 lastOffset: 105 lastStableOffset: 100",
        "version: 0 producerId: 9 firstOffset: 103 lastOffset: 110 lastStableOffset: 106",
    ]
    index.write_bytes(entries[:-1])
    status, out, _ = run(index)
    assert status == 1 and "is not a valid transaction index" in out
