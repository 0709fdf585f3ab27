"""One interface over four real Kafka clients, for tests that compare what they write and read.

Each client gets a writer (`produce(client, ...)`) and a reader (`consume(client, ...)`) that
turn the client's own types into `Message` / `Consumed`, so a test can compare any writer with
any reader field by field. Consumers never join a group (the broker has no group coordinator
yet): they assign partitions and position themselves. kcat is the Debian binary; it cannot set
timestamps, takes one set of headers per run, and splits input on newlines and a key delimiter.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiokafka
import kafka
import kafka.errors
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CKPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from kio.schema.errors import ErrorCode

from kafka_wire import KafkaWire
from strom.client.consumer import Consumer as StromConsumer
from strom.records.codec import RecordBatch, decode_batches
from strom.records.reader import ConsumerRecord

Client = Literal["confluent", "kafka-python", "aiokafka", "kcat"]
CLIENTS: tuple[Client, ...] = ("confluent", "kafka-python", "aiokafka", "kcat")
PYTHON_CLIENTS: tuple[Client, ...] = ("confluent", "kafka-python", "aiokafka")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
KCAT = shutil.which("kcat")
KCAT_KEY_DELIMITER = "\t"
# %K/%S are the key/value lengths (-1 for null), so binary keys and values parse exactly.
KCAT_FORMAT = "%p %o %T %K %S %h\n%k%s\n"
GROUP_ID = "strom-client-tests"  # confluent-kafka's Consumer requires one; it is never joined

Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class Message:
    """A record to produce; timestamp None lets the client stamp it, partition None lets it pick."""

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int | None = None
    partition: int | None = None


@dataclass(frozen=True)
class Delivery:
    """A produce result: where the record landed, or the Kafka error code (and text) it failed with."""

    partition: int
    offset: int
    error_code: int | None = None
    error: str | None = None


@dataclass(frozen=True, order=True)
class Consumed:
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


def now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------- topics and raw reads


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=10,
        request_timeout=10,
    )
    futures[name].result(timeout=15)


def delete_records_before(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    """DeleteRecords through confluent-kafka's AdminClient; returns the new low watermark."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([CKPartition(topic, partition, offset)], request_timeout=10)
    (future,) = futures.values()
    low: int = future.result(timeout=15).low_watermark
    return low


def fetch_batches(bootstrap: str, topic: str, partition: int = 0, offset: int = 0) -> list[RecordBatch]:
    """The partition's stored batches from offset on, by a raw Fetch v12, decoded by Strom's codec."""
    batches: list[RecordBatch] = []
    with KafkaWire.connect(bootstrap) as wire:
        while True:
            data = wire.fetch(topic, offset, partition=partition, max_bytes=8 << 20, max_wait_ms=10)
            assert data.error_code == ErrorCode.none, data.error_code
            new = decode_batches(data.records or b"")
            if not new:
                return batches
            batches += new
            offset = new[-1].header.next_offset


def stored_records(bootstrap: str, topic: str, partition: int = 0) -> list[Consumed]:
    """What the broker stores, as Strom's own codec decodes it: the reference the clients must match."""
    return [
        Consumed(partition, r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers))
        for batch in fetch_batches(bootstrap, topic, partition)
        for r in batch.records
    ]


# ---------------------------------------------------------------- writers


def produce(
    client: Client,
    bootstrap: str,
    topic: str,
    messages: Sequence[Message],
    *,
    compression: str = "none",
    config: dict[str, Any] | None = None,
) -> list[Delivery] | None:
    """Produce messages in order; one Delivery per message, or None for kcat (it reports none)."""
    if client == "confluent":
        return produce_confluent(
            bootstrap, topic, messages, {"compression.type": compression, **(config or {})}
        )
    if client == "kafka-python":
        return produce_kafka_python(bootstrap, topic, messages, compression, config or {})
    if client == "aiokafka":
        return asyncio.run(produce_aiokafka(bootstrap, topic, messages, compression, config or {}))
    produce_kcat(bootstrap, topic, messages, compression)
    return None


def produce_confluent(
    bootstrap: str, topic: str, messages: Sequence[Message], config: dict[str, Any]
) -> list[Delivery]:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "message.timeout.ms": 15000, **config}
    )
    results: list[Delivery | None] = [None] * len(messages)

    def reporter(index: int) -> Callable[[KafkaError | None, Any], None]:
        def report(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                results[index] = Delivery(msg.partition(), msg.offset())
            else:
                results[index] = Delivery(-1, -1, err.code(), err.str())

        return report

    for index, m in enumerate(messages):
        extra: dict[str, Any] = {}
        if m.partition is not None:
            extra["partition"] = m.partition
        if m.timestamp is not None:
            extra["timestamp"] = m.timestamp
        producer.produce(
            topic, value=m.value, key=m.key, headers=list(m.headers), on_delivery=reporter(index), **extra
        )
        producer.poll(0)
    assert producer.flush(30) == 0, "confluent-kafka producer did not deliver within 30s"
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _error_delivery(exc: BaseException) -> Delivery:
    return Delivery(-1, -1, getattr(exc, "errno", None), repr(exc))


def produce_kafka_python(
    bootstrap: str, topic: str, messages: Sequence[Message], compression: str, config: dict[str, Any]
) -> list[Delivery]:
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if compression == "none" else compression,
        linger_ms=5,
        request_timeout_ms=10000,
        **config,
    )
    try:
        futures = [
            producer.send(
                topic,
                value=m.value,
                key=m.key,
                headers=list(m.headers),
                partition=m.partition,
                timestamp_ms=m.timestamp,
            )
            for m in messages
        ]
        producer.flush(timeout=30)
        results = []
        for future in futures:
            try:
                meta = future.get(timeout=30)
            except kafka.errors.KafkaError as exc:
                results.append(_error_delivery(exc))
            else:
                results.append(Delivery(meta.partition, meta.offset))
        return results
    finally:
        producer.close(timeout=5)


async def produce_aiokafka(
    bootstrap: str, topic: str, messages: Sequence[Message], compression: str, config: dict[str, Any]
) -> list[Delivery]:
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if compression == "none" else compression,
        linger_ms=5,
        request_timeout_ms=10000,
        **config,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=m.value,
                key=m.key,
                partition=m.partition,
                timestamp_ms=m.timestamp,
                headers=list(m.headers),
            )
            for m in messages
        ]
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
    finally:
        await producer.stop()
    return [
        _error_delivery(o) if isinstance(o, BaseException) else Delivery(o.partition, o.offset)
        for o in outcomes
    ]


def kcat_headers(headers: Sequence[Header]) -> list[str]:
    args: list[str] = []
    for name, value in headers:
        args += ["-H", name if value is None else f"{name}={value.decode()}"]
    return args


def produce_kcat(bootstrap: str, topic: str, messages: Sequence[Message], compression: str = "none") -> None:
    """kcat -P: one line per message, `key<TAB>value`; no tab means a null key, -Z makes an empty
    value null. All messages must share headers and partition, and carry no timestamp."""
    assert KCAT is not None
    headers = messages[0].headers
    partition = messages[0].partition
    lines = []
    for m in messages:
        assert m.headers == headers and m.partition == partition and m.timestamp is None, m
        assert m.value != b"", "kcat -Z turns an empty value into null"
        for part in (m.key, m.value):
            assert part is None or not {ord("\n"), ord("\t")} & set(part), m
        value = m.value or b""
        lines.append(value if m.key is None else m.key + b"\t" + value)
    args = [KCAT, "-b", bootstrap, "-P", "-t", topic, "-K", KCAT_KEY_DELIMITER, "-Z", "-z", compression]
    if partition is not None:
        args += ["-p", str(partition)]
    args += kcat_headers(headers)
    done = subprocess.run(args, input=b"\n".join(lines) + b"\n", capture_output=True, timeout=60)
    assert done.returncode == 0 and b"fail" not in done.stderr.lower(), done.stderr.decode(errors="replace")


# ---------------------------------------------------------------- readers

Start = Literal["beginning", "end"] | int


def consume(
    client: Client,
    bootstrap: str,
    topic: str,
    partitions: Sequence[int],
    count: int,
    *,
    start: Start = "beginning",
    timeout: float = 20.0,
) -> list[Consumed]:
    """Read until `count` records arrived from the given partitions (or timeout), sorted by
    (partition, offset). Each client positions itself at `start` without a consumer group."""
    if client == "confluent":
        got = consume_confluent(bootstrap, topic, partitions, count, start, timeout)
    elif client == "kafka-python":
        got = consume_kafka_python(bootstrap, topic, partitions, count, start, timeout)
    elif client == "aiokafka":
        got = asyncio.run(consume_aiokafka(bootstrap, topic, partitions, count, start, timeout))
    else:
        got = consume_kcat(bootstrap, topic, partitions, count, start, timeout)
    return sorted(got)


def confluent_consumer(bootstrap: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP_ID,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            **extra,
        }
    )


def _confluent_record(msg: Any) -> Consumed:
    return Consumed(
        msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), tuple(msg.headers() or ())
    )


def _confluent_start(start: Start) -> int:
    return {"beginning": OFFSET_BEGINNING, "end": OFFSET_END}.get(start, start)  # type: ignore[arg-type]


def poll_confluent(consumer: Consumer, count: int, timeout: float) -> list[Consumed]:
    got: list[Consumed] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(_confluent_record(msg))
    return got


def consume_confluent(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int, start: Start, timeout: float
) -> list[Consumed]:
    consumer = confluent_consumer(bootstrap)
    try:
        consumer.assign([CKPartition(topic, p, _confluent_start(start)) for p in partitions])
        return poll_confluent(consumer, count, timeout)
    finally:
        consumer.close()


def _python_record(record: Any) -> Consumed:
    return Consumed(
        record.partition,
        record.offset,
        record.timestamp,
        record.key,
        record.value,
        tuple(record.headers or ()),
    )


def kafka_python_consumer(bootstrap: str) -> kafka.KafkaConsumer:
    return kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        request_timeout_ms=10000,
    )


def poll_kafka_python(consumer: kafka.KafkaConsumer, count: int, timeout: float) -> list[Consumed]:
    got: list[Consumed] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=100).values():
            got += [_python_record(r) for r in records]
    return got


def consume_kafka_python(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int, start: Start, timeout: float
) -> list[Consumed]:
    consumer = kafka_python_consumer(bootstrap)
    try:
        tps = [kafka.TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        if start == "beginning":
            consumer.seek_to_beginning(*tps)
        elif start == "end":
            consumer.seek_to_end(*tps)
        else:
            for tp in tps:
                consumer.seek(tp, start)
        return poll_kafka_python(consumer, count, timeout)
    finally:
        consumer.close()


def aiokafka_consumer(bootstrap: str) -> aiokafka.AIOKafkaConsumer:
    return aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        request_timeout_ms=10000,
    )


async def poll_aiokafka(consumer: aiokafka.AIOKafkaConsumer, count: int, timeout: float) -> list[Consumed]:
    got: list[Consumed] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=100)).values():
            got += [_python_record(r) for r in records]
    return got


async def consume_aiokafka(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int, start: Start, timeout: float
) -> list[Consumed]:
    consumer = aiokafka_consumer(bootstrap)
    await consumer.start()
    try:
        tps = [aiokafka.TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        if start == "beginning":
            await consumer.seek_to_beginning(*tps)
        elif start == "end":
            await consumer.seek_to_end(*tps)
        else:
            for tp in tps:
                consumer.seek(tp, start)
        return await poll_aiokafka(consumer, count, timeout)
    finally:
        await consumer.stop()


def kcat_consume_args(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int, start: Start
) -> list[str]:
    assert KCAT is not None
    args = [KCAT, "-b", bootstrap, "-C", "-t", topic, "-o", str(start), "-c", str(count), "-f", KCAT_FORMAT]
    if len(partitions) == 1:
        args += ["-p", str(partitions[0])]
    return args


def consume_kcat(
    bootstrap: str, topic: str, partitions: Sequence[int], count: int, start: Start, timeout: float
) -> list[Consumed]:
    # -e: stop at the end of every partition, so a short read returns instead of hanging.
    args = [*kcat_consume_args(bootstrap, topic, partitions, count, start), "-e"]
    done = subprocess.run(args, capture_output=True, timeout=timeout)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    got = parse_kcat(done.stdout)
    return [r for r in got if r.partition in partitions]


def parse_kcat(out: bytes) -> list[Consumed]:
    """Parse KCAT_FORMAT output: a text line `partition offset ts keylen valuelen headers`, then
    exactly keylen + valuelen raw bytes and a newline."""
    records = []
    pos = 0
    while pos < len(out):
        eol = out.index(b"\n", pos)
        partition, offset, timestamp, key_len, value_len, header_text = out[pos:eol].split(b" ", 5)
        pos = eol + 1
        key, pos = _take(out, pos, int(key_len))
        value, pos = _take(out, pos, int(value_len))
        assert out[pos : pos + 1] == b"\n", out[pos - 20 : pos + 20]
        pos += 1
        records.append(
            Consumed(int(partition), int(offset), int(timestamp), key, value, _kcat_header_list(header_text))
        )
    return records


def _take(out: bytes, pos: int, size: int) -> tuple[bytes | None, int]:
    if size < 0:
        return None, pos
    return out[pos : pos + size], pos + size


def _kcat_header_list(text: bytes) -> tuple[Header, ...]:
    # kcat prints `k=v,k2=v2`, and NULL for a null value: header values in tests avoid `,`, `=` and "NULL".
    if not text:
        return ()
    headers: list[Header] = []
    for item in text.split(b","):
        name, _, value = item.partition(b"=")
        headers.append((name.decode(), None if value == b"NULL" else value))
    return tuple(headers)


# ---------------------------------------------------------------- offsets


def watermarks(client: Client, bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, high watermark) as each client asks for them."""
    if client == "confluent":
        consumer = confluent_consumer(bootstrap)
        try:
            low, high = consumer.get_watermark_offsets(
                CKPartition(topic, partition), timeout=10, cached=False
            )
            return low, high
        finally:
            consumer.close()
    if client == "kafka-python":
        kp = kafka_python_consumer(bootstrap)
        try:
            tp = kafka.TopicPartition(topic, partition)
            return kp.beginning_offsets([tp])[tp], kp.end_offsets([tp])[tp]
        finally:
            kp.close()
    if client == "aiokafka":
        return asyncio.run(_aiokafka_watermarks(bootstrap, topic, partition))
    return _kcat_offset(bootstrap, topic, partition, -2), _kcat_offset(bootstrap, topic, partition, -1)


async def _aiokafka_watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = aiokafka_consumer(bootstrap)
    await consumer.start()
    try:
        tp = aiokafka.TopicPartition(topic, partition)
        low = (await consumer.beginning_offsets([tp]))[tp]
        high = (await consumer.end_offsets([tp]))[tp]
        return low, high
    finally:
        await consumer.stop()


def _kcat_offset(bootstrap: str, topic: str, partition: int, timestamp: int) -> int:
    """kcat -Q: ListOffsets for one timestamp (-1 latest, -2 earliest); prints `topic [p] offset N`."""
    assert KCAT is not None
    done = subprocess.run(
        [KCAT, "-b", bootstrap, "-Q", "-t", f"{topic}:{partition}:{timestamp}"],
        capture_output=True,
        timeout=20,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    words = done.stdout.split()
    return int(words[words.index(b"offset") + 1])


def offsets_for_times(
    client: Client, bootstrap: str, topic: str, partition: int, timestamps: Sequence[int]
) -> list[tuple[int, int] | None]:
    """(offset, timestamp) of the first record at or after each timestamp; None where there is none."""
    if client == "confluent":
        consumer = confluent_consumer(bootstrap)
        try:
            found = []
            for ts in timestamps:
                (tp,) = consumer.offsets_for_times([CKPartition(topic, partition, ts)], timeout=10)
                assert tp.error is None, tp.error
                # librdkafka reports "none" as the end offset (-1) and does not expose the timestamp.
                found.append(None if tp.offset == OFFSET_END else (tp.offset, -1))
            return found
        finally:
            consumer.close()
    if client == "kafka-python":
        kp = kafka_python_consumer(bootstrap)
        try:
            tp = kafka.TopicPartition(topic, partition)
            results = [kp.offsets_for_times({tp: ts})[tp] for ts in timestamps]
        finally:
            kp.close()
        return [None if r is None else (r.offset, r.timestamp) for r in results]
    assert client == "aiokafka", client
    return asyncio.run(_aiokafka_offsets_for_times(bootstrap, topic, partition, timestamps))


async def _aiokafka_offsets_for_times(
    bootstrap: str, topic: str, partition: int, timestamps: Sequence[int]
) -> list[tuple[int, int] | None]:
    consumer = aiokafka_consumer(bootstrap)
    await consumer.start()
    try:
        tp = aiokafka.TopicPartition(topic, partition)
        results = [(await consumer.offsets_for_times({tp: ts}))[tp] for ts in timestamps]
    finally:
        await consumer.stop()
    return [None if r is None else (r.offset, r.timestamp) for r in results]


# ---------------------------------------------------------------- tailing from the end


def tail(
    client: Client, bootstrap: str, topic: str, count: int, produce_new: Callable[[], None]
) -> list[Consumed]:
    """Position a consumer at the end of partition 0, then call produce_new, then read `count`
    records: only what produce_new wrote may arrive."""
    if client == "confluent":
        # librdkafka resolves "end" in the background; its partition-EOF event says it got there.
        consumer = confluent_consumer(bootstrap, **{"enable.partition.eof": True})
        try:
            consumer.assign([CKPartition(topic, 0, OFFSET_END)])
            early = _poll_confluent_until_eof(consumer, 15)
            produce_new()
            return early + poll_confluent(consumer, count - len(early), 15)
        finally:
            consumer.close()
    if client == "kafka-python":
        kp = kafka_python_consumer(bootstrap)
        try:
            tp = kafka.TopicPartition(topic, 0)
            kp.assign([tp])
            kp.seek_to_end(tp)
            kp.position(tp)  # resolves "end" now, before the new records exist
            early = poll_kafka_python(kp, 1, 0.3)
            produce_new()
            return early + poll_kafka_python(kp, count - len(early), 15)
        finally:
            kp.close()
    if client == "aiokafka":
        return asyncio.run(_aiokafka_tail(bootstrap, topic, count, produce_new))
    return _kcat_tail(bootstrap, topic, count, produce_new)


def _poll_confluent_until_eof(consumer: Consumer, timeout: float) -> list[Consumed]:
    got: list[Consumed] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        error = msg.error()
        if error is not None and error.code() == KafkaError._PARTITION_EOF:
            return got
        assert error is None, error
        got.append(_confluent_record(msg))
    raise AssertionError(f"confluent-kafka consumer reached no partition end within {timeout}s")


def _kcat_tail(bootstrap: str, topic: str, count: int, produce_new: Callable[[], None]) -> list[Consumed]:
    proc = subprocess.Popen(
        kcat_consume_args(bootstrap, topic, [0], count, "end"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr = proc.stderr
    stderr_lines: queue.Queue[bytes] = queue.Queue()

    def pump() -> None:
        for line in stderr:
            stderr_lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[bytes] = []
    try:
        # kcat reports "% Reached end of topic T [0] at offset N" once it has resolved and fetched "end".
        while not any(b"Reached end of topic" in line for line in seen):
            seen.append(stderr_lines.get(timeout=15))
        produce_new()
        out = proc.stdout.read()
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, b"".join(seen).decode(errors="replace")
    return parse_kcat(out)


async def _aiokafka_tail(
    bootstrap: str, topic: str, count: int, produce_new: Callable[[], None]
) -> list[Consumed]:
    consumer = aiokafka_consumer(bootstrap)
    await consumer.start()
    try:
        tp = aiokafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)
        early = await poll_aiokafka(consumer, 1, 0.3)
        await asyncio.get_running_loop().run_in_executor(None, produce_new)
        return early + await poll_aiokafka(consumer, count - len(early), 15)
    finally:
        await consumer.stop()


# -- Strom's own consumer ---------------------------------------------------------------------


def read(consumer: StromConsumer, count: int, timeout: float = 15.0) -> list[ConsumerRecord]:
    """Poll a Strom consumer until ``count`` records arrived (more may come with the last poll)."""
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"read {len(got)} of {count} records within {timeout}s"
        got += consumer.poll(0.2)
    return got


def poll_until(
    consumer: StromConsumer, condition: Callable[[], bool], what: str, timeout: float = 15.0
) -> None:
    """Poll a Strom consumer until ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        consumer.poll(0.1)
