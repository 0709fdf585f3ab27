"""CRC-valid malformed batches and compression bombs against a real broker, then real consumers.

Every malformed kind the LogValidator must catch is produced (raw wire) to a plain and a
compacted topic, uncompressed and compressed: each gets Kafka's error code, the connection
goes on serving, and confluent-kafka and kafka-python then read every acknowledged record of
the partition up to its end. Compression bombs of every codec go to a plain, a compacted and
a recompressing topic, followed by ListOffsets by timestamp. Throughout, a canary producer
and consumer on their own connection must be answered within a second, and the broker's peak
RSS stays under a bound.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cramjam
import kafka
import pytest
from confluent_kafka import TopicPartition as CKPartition
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from integration.clients_util import GROUP_ID, confluent_consumer, kafka_python_consumer
from kafka_wire import REQUEST_TIMEOUT, GroupWire, KafkaWire, build_entity, kio_request
from strom.records import batch as rb
from strom.records import scanner
from strom.records.batch import CompressionType
from strom.records.codec import decode_batches
from strom.records.compression import XERIAL_MAGIC
from strom.records.varint import write_varint

SEED = 11
CANARY_TOPIC = "poison-canary"
# The longest a canary produce + fetch may take while the attacks run.
CANARY_LIMIT_S = 1.0
# The broker's peak RSS (VmHWM) after every attack: a bomb is cut at 64 MiB of output.
RSS_LIMIT_BYTES = 400 * 1024 * 1024
HOUR_MS = 3_600_000

PLAIN = f"poison-plain-{uuid.uuid4().hex[:6]}"
COMPACTED = f"poison-compacted-{uuid.uuid4().hex[:6]}"
RECOMPRESSING = f"poison-lz4-{uuid.uuid4().hex[:6]}"
TOPICS = {
    PLAIN: {},
    COMPACTED: {"cleanup.policy": "compact"},
    RECOMPRESSING: {"compression.type": "lz4"},
}
# topic -> offsets the broker acknowledged; consumers must read exactly these.
ACKNOWLEDGED: dict[str, list[int]] = {topic: [] for topic in TOPICS}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------- building batches byte by byte


def varint(value: int) -> bytes:
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


def field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def record(
    offset_delta: int,
    key: bytes | None = b"key",
    value: bytes | None = b"value",
    *,
    timestamp_delta: int = 0,
    tail: bytes = b"\x00",  # the header count (and whatever a test appends)
) -> bytes:
    body = b"\x00" + varint(timestamp_delta) + varint(offset_delta) + field(key) + field(value) + tail
    return varint(len(body)) + body


def batch(
    payload: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    codec: int = CompressionType.NONE,
    attributes: int = 0,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    compressed_payload: bytes | None = None,
) -> bytes:
    """A CRC-valid v2 batch around ``payload`` (compressed with ``codec``), or around
    ``compressed_payload`` as it is, claimed to be ``codec``."""
    base = now_ms() if base_timestamp is None else base_timestamp
    fields = dict(
        base_offset=0,
        partition_leader_epoch=-1,
        last_offset_delta=count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp=base,
        max_timestamp=base if max_timestamp is None else max_timestamp,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        records_count=count,
    )
    if compressed_payload is None:
        return bytes(scanner.assemble_batch(payload, attributes=codec | attributes, **fields))
    built = scanner.assemble_batch(compressed_payload, attributes=0, **fields)
    struct.pack_into(">h", built, rb.ATTRIBUTES, codec | attributes)
    scanner.write_crc(built)
    return bytes(built)


def records(count: int) -> bytes:
    return b"".join(record(i, b"key-%d" % i, b"value-%d" % i) for i in range(count))


# Each malformed kind: (name, build(codec) -> batch, expected error code).
def _kinds() -> list[tuple[str, Callable[[int], bytes], int]]:
    def length_past_end(codec: int) -> bytes:
        raw = record(0)
        return batch(varint(len(raw) + 40) + raw[1:], 1, codec=codec)

    def length_not_matching(codec: int) -> bytes:
        body = record(0)[1:] + b"\x00"
        return batch(varint(len(body)) + body, 1, codec=codec)

    def count_too_large(codec: int) -> bytes:
        return batch(records(3), 4, codec=codec)

    def count_too_small(codec: int) -> bytes:
        return batch(records(4), 3, codec=codec)

    def duplicated_deltas(codec: int) -> bytes:
        return batch(record(0) + record(1) + record(1), 3, codec=codec)

    def delta_past_last(codec: int) -> bytes:
        return batch(record(0) + record(5), 2, codec=codec)

    def bad_varint(codec: int) -> bytes:
        body = b"\x00\x00" + b"\x80" * 6 + b"\x00" + field(b"k") + field(b"v") + b"\x00"
        return batch(varint(len(body)) + body, 1, codec=codec)

    def negative_key_length(codec: int) -> bytes:
        body = b"\x00\x00\x00" + varint(-5) + field(b"value") + b"\x00"
        return batch(varint(len(body)) + body, 1, codec=codec)

    def header_count_out_of_bounds(codec: int) -> bytes:
        return batch(record(0, tail=varint(1_000_000)), 1, codec=codec)

    def header_length_out_of_bounds(codec: int) -> bytes:
        return batch(record(0, tail=varint(1) + varint(300) + b"h"), 1, codec=codec)

    def timestamp_out_of_range(codec: int) -> bytes:
        # The header's timestamps are fine; the second record is two hours ahead.
        return batch(record(0) + record(1, timestamp_delta=2 * HOUR_MS), 2, codec=codec)

    def control_batch(codec: int) -> bytes:
        return batch(records(1), 1, codec=codec, attributes=rb.CONTROL_FLAG)

    return [
        ("length-past-end", length_past_end, ErrorCode.invalid_record),
        ("length-not-matching", length_not_matching, ErrorCode.invalid_record),
        ("count-too-large", count_too_large, ErrorCode.invalid_record),
        ("count-too-small", count_too_small, ErrorCode.invalid_record),
        ("duplicated-deltas", duplicated_deltas, ErrorCode.invalid_record),
        ("delta-past-last", delta_past_last, ErrorCode.invalid_record),
        ("bad-varint", bad_varint, ErrorCode.invalid_record),
        ("negative-key-length", negative_key_length, ErrorCode.invalid_record),
        ("header-count", header_count_out_of_bounds, ErrorCode.invalid_record),
        ("header-length", header_length_out_of_bounds, ErrorCode.invalid_record),
        ("timestamp", timestamp_out_of_range, ErrorCode.invalid_timestamp),
        ("control-batch", control_batch, ErrorCode.invalid_record),
    ]


KINDS = _kinds()


def gzip_bomb(total: int) -> bytes:
    """A valid gzip stream of ``total`` zero bytes (a multiple of 16 MiB), built from one
    compressed 16 MiB segment repeated: after a full flush deflate blocks stand alone."""
    chunk = bytes(16 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    segment = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    header, first_segment = first[:10], first[10:]
    assert first_segment == segment
    end = compressor.flush(zlib.Z_FINISH)[:-8]  # the final empty block, without this stream's trailer
    crc = 0
    for _ in range(total // len(chunk)):
        crc = zlib.crc32(chunk, crc)
    return header + segment * (total // len(chunk)) + end + struct.pack("<II", crc, total & 0xFFFFFFFF)


def streamed(compressor: object, total: int) -> bytes:
    chunk = bytes(16 << 20)
    for _ in range(total // len(chunk)):
        compressor.compress(chunk)  # type: ignore[attr-defined]
    return bytes(compressor.finish())  # type: ignore[attr-defined]


def bomb(name: str) -> bytes:
    """The payload of bomb ``name`` (built when a test asks: the big ones take a moment)."""
    if name == "gzip-1GiB":
        return gzip_bomb(1 << 30)
    if name == "zstd-1GiB":
        return streamed(cramjam.zstd.Compressor(level=3), 1 << 30)
    if name == "lz4-192MiB":
        return streamed(cramjam.lz4.Compressor(level=0, content_checksum=False, block_linked=False), 192 << 20)
    if name == "snappy-claims-2GiB":
        # Raw snappy whose preamble (a plain varint) claims 2 GiB - 1.
        return b"\xff\xff\xff\xff\x07" + b"\x00" * 40
    # Xerial framing, 97 bytes in all, whose chunks each claim 2 GiB - 1.
    chunk = b"\xff\xff\xff\xff\x07" + b"\x00" * 18
    xerial = XERIAL_MAGIC + struct.pack(">ii", 1, 1) + b"".join(struct.pack(">i", len(chunk)) + chunk for _ in range(3))
    assert len(xerial) == 97
    return xerial


BOMBS = {
    "gzip-1GiB": CompressionType.GZIP,
    "zstd-1GiB": CompressionType.ZSTD,
    "lz4-192MiB": CompressionType.LZ4,
    "snappy-claims-2GiB": CompressionType.SNAPPY,
    "xerial-claims-2GiB": CompressionType.SNAPPY,
}


@pytest.fixture(scope="module")
def bomb_payloads() -> dict[str, bytes]:
    """Built before the canary starts: compressing them holds this process's GIL for a while."""
    return {name: bomb(name) for name in BOMBS}


@pytest.fixture(scope="module")
def large_payload() -> bytes:
    # 32 records of 1000 KiB of zeros: decompresses to 32 MB, within its bound (32 x max.message.bytes).
    payload = b"".join(record(i, b"big-%d" % i, bytes(1000 << 10)) for i in range(32))
    return batch(payload, 32, codec=CompressionType.ZSTD)


# ---------------------------------------------------------------- fixtures


# The canary runs in its own process: in this one, the clients under test and the bombs' compression
# hold the GIL at times, which would count against the broker.
CANARY_SCRIPT = """
import json, sys, threading, time
from kafka_wire import KafkaWire
from integration.test_poison_batches import CANARY_TOPIC, batch, records
stopping = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stopping.set()), daemon=True).start()
slowest, rounds, errors, slow = 0.0, 0, [], []
try:
    with KafkaWire.connect(sys.argv[1]) as wire:
        while not stopping.is_set():
            started = time.monotonic()
            offset = wire.produce_ok(CANARY_TOPIC, batch(records(1), 1))
            fetched = wire.fetch(CANARY_TOPIC, offset)
            if fetched.error_code != 0 or not fetched.records:
                errors.append(f"fetch at {offset}: {fetched.error_code}")
            took = time.monotonic() - started
            slowest = max(slowest, took)
            if took > 0.5:
                slow.append((time.strftime("%H:%M:%S"), round(took, 3)))
            rounds += 1
            time.sleep(0.01)
except Exception as e:
    errors.append(repr(e))
print(json.dumps({"slowest": slowest, "rounds": rounds, "errors": errors, "slow": slow}))
"""


class Canary:
    """Produces one record and fetches it back, over and over, on its own connection (in a child process)."""

    def __init__(self, bootstrap: str) -> None:
        tests = Path(__file__).parent.parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(
            [sys.executable, "-c", CANARY_SCRIPT, bootstrap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.report: dict[str, Any] = {}

    def stop(self) -> dict[str, Any]:
        if not self.report:
            out, _ = self.process.communicate(timeout=30)
            self.report = json.loads(out)
        return self.report


@pytest.fixture(scope="module")
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as connection:
        for topic, configs in {**TOPICS, CANARY_TOPIC: {}}.items():
            assert connection.create_topic(topic, configs=configs) == ErrorCode.none
        # confluent-kafka asks for a group coordinator: the broker's first answer creates
        # __consumer_offsets, on the event loop today. Not this module's subject: done before the canary.
        with GroupWire.connect(broker.bootstrap) as group_wire:
            group_wire.find_coordinator(GROUP_ID)
        yield connection


@pytest.fixture(scope="module")
def canary(
    broker: BrokerProcess, wire: KafkaWire, bomb_payloads: dict[str, bytes], large_payload: bytes
) -> Iterator[Canary]:
    canary = Canary(broker.bootstrap)
    yield canary
    canary.stop()


def produce_valid(wire: KafkaWire, topic: str, count: int = 3) -> None:
    base = wire.produce_ok(topic, batch(records(count), count))
    ACKNOWLEDGED[topic] += range(base, base + count)


# ---------------------------------------------------------------- malformed batches


@pytest.mark.parametrize("topic", [PLAIN, COMPACTED])
@pytest.mark.parametrize(("kind", "build", "expected"), KINDS, ids=[k[0] for k in KINDS])
def test_malformed_batches_are_refused_and_the_connection_goes_on(
    wire: KafkaWire, canary: Canary, topic: str, kind: str, build: Callable[[int], bytes], expected: int
) -> None:
    produce_valid(wire, topic)
    rng = random.Random(f"{SEED}-{kind}-{topic}")
    for codec in (CompressionType.NONE, rng.choice([1, 2, 3, 4])):
        result = wire.produce(topic, build(codec))
        assert result.error_code == expected, (kind, codec, result)
        assert result.error_message, result
    produce_valid(wire, topic)


@pytest.mark.parametrize("topic", [PLAIN, COMPACTED])
@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codecs_are_refused(wire: KafkaWire, canary: Canary, topic: str, codec: int) -> None:
    result = wire.produce(topic, batch(records(2), 2, codec=codec, compressed_payload=records(2)))
    assert result.error_code == ErrorCode.invalid_record, result
    produce_valid(wire, topic)


@pytest.mark.parametrize("topic", [PLAIN, COMPACTED])
@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_payloads_that_do_not_decompress_are_corrupt(wire: KafkaWire, canary: Canary, topic: str, codec: int) -> None:
    garbage = random.Random(codec).randbytes(200)
    result = wire.produce(topic, batch(b"", 3, codec=codec, compressed_payload=garbage))
    assert result.error_code == ErrorCode.corrupt_message, result
    produce_valid(wire, topic)


def test_keyless_records_on_a_compacted_topic(wire: KafkaWire, canary: Canary) -> None:
    payload = record(0, b"k") + record(1, None) + record(2, None)
    result = wire.produce(COMPACTED, batch(payload, 3))
    assert result.error_code == ErrorCode.invalid_record, result
    assert [e.batch_index for e in result.record_errors] == [1, 2]
    base = wire.produce_ok(PLAIN, batch(payload, 3))
    ACKNOWLEDGED[PLAIN] += range(base, base + 3)


def test_a_batch_whose_max_timestamp_lies_is_stored_with_its_records_largest(wire: KafkaWire) -> None:
    base_timestamp = now_ms()
    payload = record(0, timestamp_delta=0) + record(1, timestamp_delta=250) + record(2, timestamp_delta=-9)
    offset = wire.produce_ok(PLAIN, batch(payload, 3, base_timestamp=base_timestamp, max_timestamp=base_timestamp - 1))
    ACKNOWLEDGED[PLAIN] += range(offset, offset + 3)
    fetched = wire.fetch(PLAIN, offset)
    (stored,) = [b for b in decode_batches(fetched.records) if b.header.base_offset == offset]
    assert stored.header.max_timestamp == base_timestamp + 250


# ---------------------------------------------------------------- compression bombs


@pytest.mark.parametrize("topic", list(TOPICS))
@pytest.mark.parametrize("name", list(BOMBS))
def test_compression_bombs_stop_at_their_bound(
    wire: KafkaWire, canary: Canary, bomb_payloads: dict[str, bytes], topic: str, name: str
) -> None:
    codec = BOMBS[name]
    payload = bomb_payloads[name]
    # 1000 records: the batch's bound is the 64 MiB cap, not the record count.
    started = time.monotonic()
    result = wire.produce(topic, batch(b"", 1000, codec=codec, compressed_payload=payload))
    assert result.error_code == ErrorCode.corrupt_message, (name, result)
    assert time.monotonic() - started < 5
    produce_valid(wire, topic)
    started = time.monotonic()
    assert wire.list_offset(topic, now_ms() - HOUR_MS) == ACKNOWLEDGED[topic][0]
    assert time.monotonic() - started < CANARY_LIMIT_S


def test_a_large_valid_compressed_batch_is_accepted_and_recompressed(
    wire: KafkaWire, canary: Canary, large_payload: bytes
) -> None:
    # Validated (and recompressed) on a worker thread.
    for topic in (PLAIN, RECOMPRESSING):
        base = wire.produce_ok(topic, large_payload)
        ACKNOWLEDGED[topic] += range(base, base + 32)
    fetched = wire.fetch(RECOMPRESSING, ACKNOWLEDGED[RECOMPRESSING][-1], max_bytes=8 << 20)
    stored = [b.header for b in decode_batches(fetched.records)]
    assert stored and all(h.compression == CompressionType.LZ4 for h in stored)


# ---------------------------------------------------------------- readers and the broker afterwards


def end_offset(wire: KafkaWire, topic: str) -> int:
    return wire.list_offset(topic, -1)


@pytest.mark.parametrize("topic", list(TOPICS))
def test_confluent_kafka_reads_every_acknowledged_record_to_the_end(
    wire: KafkaWire, bootstrap: str, topic: str
) -> None:
    end = end_offset(wire, topic)
    assert ACKNOWLEDGED[topic] and ACKNOWLEDGED[topic][-1] == end - 1
    consumer = confluent_consumer(bootstrap, **{"fetch.message.max.bytes": 64 << 20})
    got: list[int] = []
    try:
        consumer.assign([CKPartition(topic, 0, 0)])
        deadline = time.monotonic() + 20
        while (not got or got[-1] < end - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.offset())
    finally:
        consumer.close()
    assert got == ACKNOWLEDGED[topic]


@pytest.mark.parametrize("topic", list(TOPICS))
def test_kafka_python_reads_every_acknowledged_record_to_the_end(
    wire: KafkaWire, bootstrap: str, topic: str
) -> None:
    end = end_offset(wire, topic)
    consumer = kafka_python_consumer(bootstrap)
    got: list[int] = []
    try:
        tp = kafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 20
        while (not got or got[-1] < end - 1) and time.monotonic() < deadline:
            got += [r.offset for rs in consumer.poll(timeout_ms=200).values() for r in rs]
    finally:
        consumer.close()
    assert got == ACKNOWLEDGED[topic]


def test_the_canary_was_served_within_a_second_and_rss_stayed_bounded(broker: BrokerProcess, canary: Canary) -> None:
    report = canary.stop()
    assert not report["errors"], report
    assert report["rounds"] > 10, report
    assert report["slowest"] < CANARY_LIMIT_S, report
    status = open(f"/proc/{broker.pid}/status").read()  # noqa: SIM115
    peak = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024
    print(
        f"broker peak RSS {peak / 2**20:.0f} MiB, canary slowest round trip {report['slowest'] * 1000:.0f} ms "
        f"over {report['rounds']} rounds"
    )
    assert peak < RSS_LIMIT_BYTES


@pytest.mark.parametrize("version", [3, 7])
def test_record_errors_before_produce_v8_are_answered_by_the_error_alone(
    wire: KafkaWire, canary: Canary, version: int
) -> None:
    # Produce v3-v7 answers have no record_errors: the handler died building them and closed the
    # connection (found by the cluster wire fuzz).
    m = kio_request("produce", version)
    payload = record(0, b"k") + record(1, None) + record(2, None)
    request = build_entity(
        m.ProduceRequest,
        transactional_id=None,
        acks=1,
        timeout=REQUEST_TIMEOUT,
        topic_data=(
            m.TopicProduceData(
                name=COMPACTED, partition_data=(m.PartitionProduceData(index=0, records=batch(payload, 3)),)
            ),
        ),
    )
    (answer,) = wire.request(request).responses[0].partition_responses
    assert answer.error_code == ErrorCode.invalid_record, answer
    produce_valid(wire, COMPACTED)
