"""Real clients against a real broker: confluent-kafka, kafka-python, aiokafka and kcat.

Every test talks TCP to the module's broker. Consumers assign partitions and seek (there is no
group coordinator). Where a test compares records it compares every field a client exposes:
partition, offset, timestamp, key, value and headers, byte for byte, including null keys, null
values (tombstones), duplicate header keys and null header values. `stored_records` decodes what
the broker stores with Strom's own codec, a third opinion next to writer and reader.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections import defaultdict
from collections.abc import Sequence

import kafka.codec
import pytest
from confluent_kafka.admin import AdminClient

from integration.clients_util import (
    CLIENTS,
    CODECS,
    KCAT,
    PYTHON_CLIENTS,
    Client,
    Consumed,
    Delivery,
    Message,
    consume,
    create_topic,
    delete_records_before,
    fetch_batches,
    now_ms,
    offsets_for_times,
    produce,
    produce_confluent,
    stored_records,
    tail,
    watermarks,
)
from kafka_wire import KafkaWire
from strom.records.batch import CompressionType
from strom.records.codec import RecordSpec, encode_batch

MESSAGE_TOO_LARGE = 10
# Producers check sizes themselves first; raise their limits so the broker is the one that refuses.
RAISED_PRODUCER_LIMIT: dict[Client, dict[str, object]] = {
    "confluent": {"message.max.bytes": 2_000_000},
    "kafka-python": {"max_request_size": 2_000_000},
    "aiokafka": {"max_request_size": 2_000_000},
}
# kafka-python compresses only with optional packages that pyproject does not pin.
KAFKA_PYTHON_CODEC_PACKAGE = {
    "snappy": (kafka.codec.has_snappy, "python-snappy"),
    "lz4": (kafka.codec.has_lz4, "lz4"),
    "zstd": (kafka.codec.has_zstd, "zstandard"),
}
COMPRESSIBLE = b"a compressible payload " * 500
# kcat takes one header set per run; its -f output prints `k=v,...`, so no `,` `=` or "NULL" here.
SHARED_HEADERS: tuple[tuple[str, bytes | None], ...] = (
    ("trace", b"t-1"),
    ("dup", b"one"),
    ("dup", b"two"),
    ("empty", b""),
    ("null", None),
)

needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install -y kcat)")


def base_timestamp() -> int:
    # Explicit create times in the recent past: inside retention and any "too far in the future" check.
    return now_ms() - 600_000


def rich_messages(t0: int) -> list[Message]:
    """Everything a record can carry, for clients that can set it per record."""
    specs: list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]] = [
        (b"key-0", b"value-0", ()),
        (b"\x00\xff\n\tbinary key", bytes(range(256)), (("bin", b"\x00\xff\n"),)),
        (b"dup-headers", COMPRESSIBLE, (("dup", b"1st"), ("dup", b"2nd"), ("other", b""), ("dup", b"3rd"))),
        (b"null-header", b"v", (("nothing", None), ("something", b"x"))),
        (None, b"null key", (("h", b"1"),)),
        (b"tombstone", None, ()),
        (b"", b"", ()),
        ("ключ".encode(), "значение 🐢".encode(), (("ünïcode-header", b"wert"),)),
    ]
    return [Message(k, v, h, timestamp=t0 + i, partition=0) for i, (k, v, h) in enumerate(specs)]


def shared_header_messages() -> list[Message]:
    """What kcat -P can express: newline- and tab-free keys and values, one header set, no timestamps."""
    specs: list[tuple[bytes | None, bytes | None]] = [
        (b"key-0", b"value-0"),
        (None, b"null key"),
        (b"tombstone", None),
        (b"bin\x00\x01\x7f\x80\xfe\xff", bytes(b for b in range(256) if b not in (9, 10))),
        (b"compressible", COMPRESSIBLE),
        ("ключ".encode(), "значение 🐢".encode()),
    ]
    return [Message(k, v, SHARED_HEADERS, partition=0) for k, v in specs]


def as_written_by(client: Client, messages: Sequence[Message]) -> list[Message]:
    """kafka-python's send() refuses null header values (its encoder could write them): drop them."""
    if client != "kafka-python":
        return list(messages)
    return [
        dataclasses.replace(m, headers=tuple((k, v) for k, v in m.headers if v is not None)) for m in messages
    ]


def expected_records(messages: Sequence[Message], stored: Sequence[Consumed]) -> list[Consumed]:
    """The records messages should become at offsets 0..n-1 of partition 0; a message without a
    timestamp takes the stored one (the client stamped it)."""
    assert len(stored) == len(messages), (len(stored), len(messages))
    return [
        Consumed(0, i, m.timestamp if m.timestamp is not None else s.timestamp, m.key, m.value, m.headers)
        for i, (m, s) in enumerate(zip(messages, stored, strict=True))
    ]


def dense(n: int, partition: int = 0) -> list[Delivery]:
    return [Delivery(partition, offset) for offset in range(n)]


def skip_without_codec(client: Client, codec: str) -> None:
    if client == "kafka-python" and codec in KAFKA_PYTHON_CODEC_PACKAGE:
        available, package = KAFKA_PYTHON_CODEC_PACKAGE[codec]
        if not available():
            pytest.skip(f"kafka-python needs the '{package}' package for {codec}; pyproject does not pin it")
    if client == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")


def produce_plain(
    bootstrap: str, topic: str, values: Sequence[bytes], timestamps: Sequence[int] = ()
) -> None:
    """Write with confluent-kafka when the writer is not what a test is about."""
    stamps: list[int | None] = list(timestamps) or [None] * len(values)
    messages = [Message(None, v, timestamp=ts, partition=0) for v, ts in zip(values, stamps, strict=True)]
    for delivery in produce_confluent(bootstrap, topic, messages, {}):
        assert delivery.error_code is None, delivery


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", CLIENTS)
def test_round_trip(client: Client, codec: str, bootstrap: str) -> None:
    skip_without_codec(client, codec)
    topic = f"roundtrip-{client}-{codec}"
    create_topic(bootstrap, topic)
    messages = shared_header_messages() if client == "kcat" else rich_messages(base_timestamp())
    messages = as_written_by(client, messages)
    before = now_ms()
    deliveries = produce(client, bootstrap, topic, messages, compression=codec)
    after = now_ms()
    if deliveries is not None:
        assert deliveries == dense(len(messages))

    stored = stored_records(bootstrap, topic)
    expected = expected_records(messages, stored)
    assert stored == expected
    if client == "kcat":
        assert all(before - 1000 <= r.timestamp <= after + 1000 for r in stored), (before, after, stored)
    assert consume(client, bootstrap, topic, [0], len(messages), timeout=10) == expected

    # The topic's compression.type is "producer": the broker keeps the client's codec.
    batches = fetch_batches(bootstrap, topic)
    (big,) = [b for b in batches if any(r.value == COMPRESSIBLE for r in b.records)]
    codes = {b.header.compression for b in batches}
    assert big.header.compression == CompressionType.NAMES[codec]
    assert codes <= {CompressionType.NONE, CompressionType.NAMES[codec]}


# ---------------------------------------------------------------- every writer, every reader


class MatrixTopics:
    """One topic per writer holding shared_header_messages, written on first use."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._written: dict[Client, tuple[str, list[Consumed]]] = {}

    def get(self, writer: Client) -> tuple[str, list[Consumed]]:
        if writer not in self._written:
            self._written[writer] = self._write(writer)
        return self._written[writer]

    def _write(self, writer: Client) -> tuple[str, list[Consumed]]:
        topic = f"matrix-{writer}"
        create_topic(self.bootstrap, topic)
        messages = shared_header_messages()
        if writer != "kcat":
            t0 = base_timestamp()
            messages = [dataclasses.replace(m, timestamp=t0 + i) for i, m in enumerate(messages)]
        messages = as_written_by(writer, messages)
        deliveries = produce(writer, self.bootstrap, topic, messages, compression="lz4")
        if deliveries is not None:
            assert deliveries == dense(len(messages))
        stored = stored_records(self.bootstrap, topic)
        expected = expected_records(messages, stored)
        assert stored == expected
        return topic, expected


@pytest.fixture(scope="module")
def matrix(bootstrap: str) -> MatrixTopics:
    return MatrixTopics(bootstrap)


@needs_kcat
@pytest.mark.parametrize("reader", CLIENTS)
@pytest.mark.parametrize("writer", CLIENTS)
def test_cross_client_byte_identity(
    writer: Client, reader: Client, matrix: MatrixTopics, bootstrap: str
) -> None:
    topic, expected = matrix.get(writer)
    assert consume(reader, bootstrap, topic, [0], len(expected), timeout=10) == expected


# ---------------------------------------------------------------- sizes and partitions


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_message_near_max_bytes(client: Client, bootstrap: str) -> None:
    """message.max.bytes is 1048588 by default: a 1,000,000-byte value fits, 1,100,000 does not."""
    topic = f"large-{client}"
    create_topic(bootstrap, topic)
    fits = Message(b"fits", os.urandom(1_000_000), partition=0)
    too_large = Message(b"too-large", os.urandom(1_100_000), partition=0)
    limit = RAISED_PRODUCER_LIMIT[client]

    assert produce(client, bootstrap, topic, [fits], config=limit) == [Delivery(0, 0)]
    (refused,) = produce(client, bootstrap, topic, [too_large], config=limit) or []
    assert refused.error_code == MESSAGE_TOO_LARGE, refused

    assert watermarks("confluent", bootstrap, topic, 0) == (0, 1)
    (got,) = consume(client, bootstrap, topic, [0], 1, timeout=10)
    assert (got.offset, got.key, got.value) == (0, fits.key, fits.value)


@pytest.mark.parametrize("client", CLIENTS)
def test_32_partitions(client: Client, bootstrap: str) -> None:
    if client == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    topic = f"partitions32-{client}"
    create_topic(bootstrap, topic, partitions=32)
    # 4 records per key: the client's partitioner must send all of a key's records to one partition.
    messages = [Message(f"key-{i % 200}".encode(), f"value-{i}".encode()) for i in range(800)]
    deliveries = produce(client, bootstrap, topic, messages, compression="snappy")
    got = consume(client, bootstrap, topic, range(32), len(messages), timeout=20)

    assert len(got) == len(messages)
    by_partition: dict[int, list[int]] = defaultdict(list)
    partitions_of_key: dict[bytes | None, set[int]] = defaultdict(set)
    for record in got:
        by_partition[record.partition].append(record.offset)
        partitions_of_key[record.key].add(record.partition)
    assert sorted(by_partition) == list(range(32))
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))
    assert all(len(p) == 1 for p in partitions_of_key.values())
    assert sorted(r.value or b"" for r in got) == sorted(m.value or b"" for m in messages)
    if deliveries is not None:
        placed = {(d.partition, d.offset): m.value for d, m in zip(deliveries, messages, strict=True)}
        assert placed == {(r.partition, r.offset): r.value for r in got}


def test_metadata_lists_32_partitions_led_by_the_broker(bootstrap: str) -> None:
    create_topic(bootstrap, "metadata-32", partitions=32)
    cluster = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    (broker_id,) = cluster.brokers
    assert f"{cluster.brokers[broker_id].host}:{cluster.brokers[broker_id].port}" == bootstrap
    partitions = cluster.topics["metadata-32"].partitions
    assert sorted(partitions) == list(range(32))
    assert {(p.leader, tuple(p.replicas), tuple(p.isrs)) for p in partitions.values()} == {
        (broker_id, (broker_id,), (broker_id,))
    }


# ---------------------------------------------------------------- offsets


@pytest.fixture(scope="module")
def timed_topic(bootstrap: str) -> tuple[str, int]:
    """Eleven records in four batches; the last batch has its timestamps out of order."""
    topic = "timed"
    create_topic(bootstrap, topic)
    t0 = base_timestamp()
    groups = [[0, 1000, 2000], [3000, 4000, 5000], [6000, 7000, 8000], [20000, 15000]]
    # One batch per group, written raw: a client's linger could split a group under load.
    with KafkaWire.connect(bootstrap) as wire:
        for deltas in groups:
            specs = [RecordSpec(key=None, value=f"t+{d}".encode(), timestamp=t0 + d) for d in deltas]
            wire.produce_ok(topic, encode_batch(specs))
    assert len(fetch_batches(bootstrap, topic)) == len(groups)
    return topic, t0


# target delta -> (offset, record timestamp delta) of the first record at or after it, or None
TIME_LOOKUPS: list[tuple[int, tuple[int, int] | None]] = [
    (-5000, (0, 0)),
    (0, (0, 0)),
    (1, (1, 1000)),
    (3000, (3, 3000)),
    (4500, (5, 5000)),
    (8000, (8, 8000)),
    (8001, (9, 20000)),  # the first record, in offset order, with a timestamp at or after the target
    (16000, (9, 20000)),
    (20000, (9, 20000)),
    (20001, None),
]


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_offsets_for_times(client: Client, timed_topic: tuple[str, int], bootstrap: str) -> None:
    topic, t0 = timed_topic
    found = offsets_for_times(client, bootstrap, topic, 0, [t0 + delta for delta, _ in TIME_LOOKUPS])
    expected: list[tuple[int, int] | None] = []
    for _, hit in TIME_LOOKUPS:
        if hit is None:
            expected.append(None)
        elif client == "confluent":
            expected.append((hit[0], -1))  # librdkafka returns only the offset
        else:
            expected.append((hit[0], t0 + hit[1]))
    assert found == expected


@pytest.mark.parametrize("client", CLIENTS)
def test_seek_to_end_reads_only_new_records(client: Client, bootstrap: str) -> None:
    if client == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    topic = f"tail-{client}"
    create_topic(bootstrap, topic)
    produce_plain(bootstrap, topic, [f"old-{i}".encode() for i in range(5)])
    new = [f"new-{i}".encode() for i in range(3)]
    got = tail(client, bootstrap, topic, len(new), lambda: produce_plain(bootstrap, topic, new))
    assert [(r.offset, r.value) for r in got] == [(5, new[0]), (6, new[1]), (7, new[2])]


@pytest.fixture(scope="module")
def trimmed_topic(bootstrap: str) -> str:
    """Ten records, the first four deleted: log start offset 4, high watermark 10."""
    create_topic(bootstrap, "trimmed")
    create_topic(bootstrap, "empty")
    produce_plain(bootstrap, "trimmed", [f"r{i}".encode() for i in range(10)])
    assert delete_records_before(bootstrap, "trimmed", 0, 4) == 4
    return "trimmed"


@pytest.mark.parametrize("client", CLIENTS)
def test_watermarks(client: Client, trimmed_topic: str, bootstrap: str) -> None:
    if client == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat)")
    assert watermarks(client, bootstrap, "empty", 0) == (0, 0)
    assert watermarks(client, bootstrap, trimmed_topic, 0) == (4, 10)
    got = consume(client, bootstrap, trimmed_topic, [0], 6, timeout=10)
    assert [(r.offset, r.value) for r in got] == [(i, f"r{i}".encode()) for i in range(4, 10)]


# ---------------------------------------------------------------- idempotence

IDEMPOTENT_CONFIG: dict[Client, dict[str, object]] = {
    "confluent": {"enable.idempotence": True, "batch.num.messages": 100},
    "kafka-python": {"enable_idempotence": True, "batch_size": 4096},
    "aiokafka": {"enable_idempotence": True, "max_batch_size": 4096},
}


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_idempotent_producer_writes_each_record_once(client: Client, bootstrap: str) -> None:
    topic = f"idempotent-{client}"
    create_topic(bootstrap, topic)
    n = 2000
    messages = [Message(None, f"idem-{i:05d}-".encode() + b"x" * 30, partition=0) for i in range(n)]
    deliveries = produce(client, bootstrap, topic, messages, config=IDEMPOTENT_CONFIG[client])
    assert deliveries == dense(n)
    assert watermarks("confluent", bootstrap, topic, 0) == (0, n)

    batches = fetch_batches(bootstrap, topic)
    assert len(batches) > 1
    assert [r.value for b in batches for r in b.records] == [m.value for m in messages]
    assert [r.offset for b in batches for r in b.records] == list(range(n))
    (producer,) = {(b.header.producer_id, b.header.producer_epoch) for b in batches}
    assert producer[0] >= 0
    # Sequences run on without gaps from 0, batch after batch, as the producer numbered them.
    assert [b.header.base_sequence for b in batches] == [b.header.base_offset for b in batches]


# ---------------------------------------------------------------- kcat, as the issue states it


@needs_kcat
def test_kcat_acceptance(bootstrap: str) -> None:
    """`seq 1 100000 | kcat -P -t numbers -z lz4`, then `kcat -C ... | wc -l` is 100000; kcat -L lists
    the broker and the (auto-created) topic."""

    def sh(command: str) -> str:
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        return done.stdout

    sh(f"seq 1 100000 | kcat -b {bootstrap} -P -t numbers -z lz4")
    assert sh(f"kcat -b {bootstrap} -C -t numbers -e -o beginning | wc -l").strip() == "100000"
    values = sh(f"kcat -b {bootstrap} -C -t numbers -e -o beginning").split()
    assert values == [str(i) for i in range(1, 100001)]

    listing = sh(f"kcat -b {bootstrap} -L")
    assert re.search(rf"^\s*1 brokers:\n\s*broker \d+ at {re.escape(bootstrap)}", listing, re.M), listing
    broker_id = re.search(r"broker (\d+) at", listing)
    assert broker_id is not None
    numbers = rf'^\s*topic "numbers" with 1 partitions:\n\s*partition 0, leader {broker_id[1]}, replicas: '
    assert re.search(numbers, listing, re.M), listing
