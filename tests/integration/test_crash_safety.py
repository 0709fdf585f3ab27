"""Crash safety: kill -9 mid-write, damaged segment tails, and state that must survive a restart.

The module's broker is restarted (SIGTERM or SIGKILL) on the same port and data dir; each test
uses its own topic, and a broker left down by a failed test is started again for the next one.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from kio.schema.alter_configs.v2 import request as alter_configs2
from kio.schema.describe_configs.v4 import request as describe_configs4
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

from brokerproc import BrokerProcess
from kafka_wire import EARLIEST, LATEST, TOPIC_RESOURCE, KafkaWire
from strom.records.codec import Record, RecordSpec, decode_batches, encode_batch

pytestmark = pytest.mark.usefixtures("running_broker")

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
# How long the producer runs before the crash, and after the restart in the idempotent test.
PRODUCE_SECONDS = 1.5


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        yield conn


def read_all(wire: KafkaWire, topic: str, start: int, end: int) -> list[Record]:
    """Every record from the batch holding ``start`` up to ``end`` (exclusive), fetched in order."""
    records: list[Record] = []
    position = start
    while position < end:
        data = wire.fetch(topic, position)
        assert data.error_code == ErrorCode.none, (position, data.error_code)
        assert data.records, f"empty fetch at {position} below the end {end}"
        batch_records = [r for b in decode_batches(data.records) for r in b.records]
        records += [r for r in batch_records if r.offset >= position]
        position = records[-1].offset + 1
    return records


def segment_files(broker: BrokerProcess, topic: str) -> list[Path]:
    return sorted((broker.data_dir / f"{topic}-0").glob("*.log"))


class NumberedProducer(threading.Thread):
    """confluent-kafka producing records numbered 0, 1, 2, ... to partition 0 until stopped.

    ``acked`` maps each acknowledged number to the offset the broker gave it; with purge, records
    still unacknowledged when stopped are purged (never retried) before the final flush.
    """

    def __init__(self, bootstrap: str, topic: str, *, idempotent: bool, purge: bool) -> None:
        super().__init__(name=f"producer-{topic}", daemon=True)
        self.topic = topic
        self.purge = purge
        self.config = {
            "bootstrap.servers": bootstrap,
            "acks": "all" if idempotent else "1",
            "enable.idempotence": idempotent,
            "linger.ms": 2,
            "message.timeout.ms": 30000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 300,
            "retry.backoff.ms": 50,
        }
        self.sent = 0
        self.acked: dict[int, int] = {}
        self.failed: dict[int, str] = {}
        self.unflushed = -1
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        value, offset = msg.value(), msg.offset()
        assert value is not None
        number = int(value)
        if err is None and offset is not None:
            self.acked[number] = offset
        else:
            self.failed[number] = str(err)

    def run(self) -> None:
        try:
            producer = Producer(self.config)
            while not self._stop_event.is_set():
                try:
                    producer.produce(
                        self.topic,
                        key=b"key-%d" % (self.sent % 8),
                        value=b"%d" % self.sent,
                        partition=0,
                        on_delivery=self._on_delivery,
                    )
                except BufferError:
                    producer.poll(0.05)
                    continue
                self.sent += 1
                if self.sent % 50 == 0:
                    producer.poll(0.005)  # pace the producer and serve delivery reports
            if self.purge:
                producer.purge()
            self.unflushed = producer.flush(30)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join(45)
        assert not self.is_alive(), "producer did not finish flushing"
        assert self.error is None, self.error


def assert_log_holds_numbers(records: list[Record], count: int) -> None:
    """The partition holds exactly records 0..count-1, record n at offset n."""
    assert [r.offset for r in records] == list(range(count))
    mismatched = [(r.offset, r.key, r.value) for r in records if r.value != b"%d" % r.offset]
    assert mismatched == []
    assert all(r.key == b"key-%d" % (r.offset % 8) for r in records)


def test_acknowledged_records_survive_kill9_with_dense_offsets(
    broker: BrokerProcess, wire: KafkaWire
) -> None:
    topic = "crash-acks1"
    assert wire.create_topic(topic) == ErrorCode.none
    producer = NumberedProducer(broker.bootstrap, topic, idempotent=False, purge=True)
    producer.start()
    time.sleep(PRODUCE_SECONDS)
    assert broker.kill9() == -9
    producer.stop()
    acked = dict(producer.acked)
    assert len(acked) > 500, f"only {len(acked)} records acknowledged before the crash"
    # Nothing failed before the crash, so the producer's n-th record got offset n.
    assert {n: o for n, o in acked.items() if n != o} == {}

    broker.start()
    with KafkaWire.connect(broker.bootstrap) as fresh:
        end = fresh.list_offset(topic, LATEST)
        # Every acknowledged record survived; what lies beyond was in flight at the crash.
        assert max(acked) < end <= producer.sent
        assert_log_holds_numbers(read_all(fresh, topic, 0, end), end)
        assert fresh.list_offset(topic, EARLIEST) == 0
        assert fresh.produce_ok(topic, encode_batch([RecordSpec(key=b"after", value=b"crash")])) == end


def test_idempotent_producer_across_kill9_writes_each_record_exactly_once(broker: BrokerProcess) -> None:
    topic = "crash-idempotent"
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
    producer = NumberedProducer(broker.bootstrap, topic, idempotent=True, purge=False)
    producer.start()
    time.sleep(PRODUCE_SECONDS)
    broker.restart(crash=True)
    time.sleep(PRODUCE_SECONDS)  # the producer reconnects by itself and carries on
    producer.stop()
    assert producer.unflushed == 0
    assert producer.failed == {}
    assert sorted(producer.acked) == list(range(producer.sent))
    assert {n: o for n, o in producer.acked.items() if n != o} == {}
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.list_offset(topic, LATEST) == producer.sent
        assert_log_holds_numbers(read_all(wire, topic, 0, producer.sent), producer.sent)


def _cut_tail(data: bytearray, starts: list[int]) -> tuple[bytes, int]:
    return bytes(data[:-7]), len(starts) - 1


def _flip_in_last_batch(data: bytearray, starts: list[int]) -> tuple[bytes, int]:
    data[-3] ^= 0xFF  # inside the last record's value
    return bytes(data), len(starts) - 1


def _flip_in_middle_batch(data: bytearray, starts: list[int]) -> tuple[bytes, int]:
    # Recovery stops at the first invalid batch: the valid ones after it go too, as in Kafka.
    data[starts[2] + 70] ^= 0xFF
    return bytes(data), 2


DAMAGE = {
    "cut-tail": _cut_tail,
    "flip-byte-in-last-batch": _flip_in_last_batch,
    "flip-byte-in-middle-batch": _flip_in_middle_batch,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_segment_tail_is_recovered_to_the_last_valid_batch(
    broker: BrokerProcess, damage: str
) -> None:
    topic = f"damaged-{damage}"
    batches = [
        encode_batch([RecordSpec(key=b"k", value=b"b%d-r%d" % (i, j)) for j in range(4)]) for i in range(5)
    ]
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
        assert [wire.produce_ok(topic, b) for b in batches] == [0, 4, 8, 12, 16]
    broker.kill9()
    assert not (broker.data_dir / CLEAN_SHUTDOWN_FILE).exists()

    segment = segment_files(broker, topic)[-1]
    data = bytearray(segment.read_bytes())
    assert len(data) == sum(map(len, batches))
    starts = [sum(map(len, batches[:i])) for i in range(len(batches))]
    damaged, valid = DAMAGE[damage](data, starts)
    segment.write_bytes(damaged)
    end = 4 * valid

    broker.start()
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.list_offset(topic, LATEST) == end
        expected = [b"b%d-r%d" % (i, j) for i in range(valid) for j in range(4)]
        assert [r.value for r in read_all(wire, topic, 0, end)] == expected
        at_end = wire.fetch(topic, end)
        assert at_end.error_code == ErrorCode.none and not at_end.records
        new = encode_batch([RecordSpec(key=b"k", value=b"new-r%d" % j) for j in range(4)])
        assert wire.produce_ok(topic, new) == end
        # The new batch follows the last valid one directly: nothing of the damage is left between.
        assert segment.stat().st_size == sum(map(len, batches[:valid])) + len(new)

    broker.restart(crash=True)
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.list_offset(topic, LATEST) == end + 4
        records = read_all(wire, topic, 0, end + 4)
        assert [r.offset for r in records] == list(range(end + 4))
        assert [r.value for r in records] == expected + [b"new-r%d" % j for j in range(4)]


def test_kill9_with_several_segments_recovers_the_newest_and_rebuilds_its_indexes(
    broker: BrokerProcess, wire: KafkaWire
) -> None:
    topic = "several-segments"
    # Roughly ten 100 kB batches fill a 1 MiB segment (the smallest segment.bytes Kafka 4 allows).
    assert wire.create_topic(topic, configs={"segment.bytes": str(1 << 20)}) == ErrorCode.none
    base_timestamp = int(time.time() * 1000) - 60_000
    count = 25
    for i in range(count):
        record = RecordSpec(key=b"%d" % i, value=bytes([65 + i]) * 100_000, timestamp=base_timestamp + 10 * i)
        assert wire.produce_ok(topic, encode_batch([record])) == i
    broker.kill9()

    segments = segment_files(broker, topic)
    assert len(segments) >= 3, segments
    newest = segments[-1]
    with newest.open("r+b") as f:
        f.truncate(newest.stat().st_size - 50)  # the last batch loses its tail
    # Indexes of the segment recovery rescans must be rebuilt from the log, whatever they hold.
    for suffix in (".index", ".timeindex"):
        newest.with_suffix(suffix).write_bytes(bytes(range(256)) * 16)
    end = count - 1

    broker.start()
    with KafkaWire.connect(broker.bootstrap) as fresh:
        assert fresh.list_offset(topic, LATEST) == end
        for i in range(end):
            # max_bytes=1 still returns the first batch whole: exactly the one at offset i.
            records = [
                r for b in decode_batches(fresh.fetch(topic, i, max_bytes=1).records) for r in b.records
            ]
            assert [(r.offset, r.key, r.value) for r in records] == [
                (i, b"%d" % i, bytes([65 + i]) * 100_000)
            ]
            assert fresh.list_offset(topic, base_timestamp + 10 * i - 5) == i
        assert fresh.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"new")])) == end


def alter_configs(wire: KafkaWire, topic: str, configs: dict[str, str]) -> None:
    """Legacy AlterConfigs: replaces every topic config with ``configs``."""
    response = wire.request(
        alter_configs2.AlterConfigsRequest(
            resources=(
                alter_configs2.AlterConfigsResource(
                    resource_type=TOPIC_RESOURCE,
                    resource_name=topic,
                    configs=tuple(
                        alter_configs2.AlterableConfig(name=k, value=v) for k, v in configs.items()
                    ),
                ),
            ),
            validate_only=False,
        )
    )
    assert response.responses[0].error_code == ErrorCode.none, response


def topic_configs(wire: KafkaWire, topic: str, names: tuple[str, ...]) -> dict[str, str | None]:
    response = wire.request(
        describe_configs4.DescribeConfigsRequest(
            resources=(
                describe_configs4.DescribeConfigsResource(
                    resource_type=TOPIC_RESOURCE, resource_name=topic, configuration_keys=names
                ),
            ),
        )
    )
    result = response.results[0]
    assert result.error_code == ErrorCode.none, result
    return {c.name: c.value for c in result.configs}


def wait_for_checkpoint(path: Path, line: str, timeout: float = 10.0) -> None:
    # Kafka writes log start offsets to disk asynchronously, once per checkpoint interval.
    deadline = time.monotonic() + timeout
    while not (path.exists() and line in path.read_text().splitlines()):
        assert time.monotonic() < deadline, f"{line!r} never appeared in {path}"
        time.sleep(0.1)


@pytest.mark.parametrize("shutdown", ["sigterm", "kill9"])
def test_delete_records_configs_and_producer_state_survive_restart(
    broker: BrokerProcess, shutdown: str
) -> None:
    topic = f"state-{shutdown}"
    altered = {"retention.ms": "3600000", "segment.ms": "7200000", "max.message.bytes": "200000"}

    def idempotent_batch(sequence: int, count: int) -> bytes:
        records = [RecordSpec(key=None, value=b"seq-%d" % (sequence + i)) for i in range(count)]
        return encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=sequence)

    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic(topic) == ErrorCode.none
        legacy = {k: altered[k] for k in ("retention.ms", "segment.ms")}
        alter_configs(wire, topic, legacy)
        assert (
            wire.incremental_alter_configs(topic, {"max.message.bytes": altered["max.message.bytes"]})
            == ErrorCode.none
        )
        assert topic_configs(wire, topic, tuple(altered)) == altered

        init = wire.request(
            InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60))
        )
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        assert wire.produce_ok(topic, idempotent_batch(0, 3)) == 0
        last_batch = idempotent_batch(3, 3)
        assert wire.produce_ok(topic, last_batch) == 3
        assert wire.delete_records(topic, 2) == (ErrorCode.none, 2)
    wait_for_checkpoint(broker.data_dir / "log-start-offset-checkpoint", f"{topic} 0 2")

    if shutdown == "sigterm":
        assert broker.stop() == 0
        assert (broker.data_dir / CLEAN_SHUTDOWN_FILE).exists()
    else:
        assert broker.kill9() == -9
        assert not (broker.data_dir / CLEAN_SHUTDOWN_FILE).exists()
    broker.start()

    with KafkaWire.connect(broker.bootstrap) as wire:
        assert topic_configs(wire, topic, tuple(altered)) == altered
        assert (wire.list_offset(topic, EARLIEST), wire.list_offset(topic, LATEST)) == (2, 6)
        assert wire.fetch(topic, 1).error_code == ErrorCode.offset_out_of_range

        # A retry of the last batch is a duplicate: acknowledged with its original offset, not appended.
        retry = wire.produce(topic, last_batch)
        assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 3)
        assert wire.list_offset(topic, LATEST) == 6
        # The producer's next sequence is 6: a gap is refused.
        gap = wire.produce(topic, idempotent_batch(10, 1))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        assert wire.produce_ok(topic, idempotent_batch(6, 2)) == 6

        records = [r for r in read_all(wire, topic, 2, 8) if r.offset >= 2]
        assert [(r.offset, r.value) for r in records] == [(n, b"seq-%d" % n) for n in range(2, 8)]
