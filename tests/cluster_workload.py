"""Traffic for the cluster tests: a keyed producer and a consumer that run in threads while
brokers fail, a watcher of leader epochs, and the checks of Kafka's replication tests.

Records are ``key`` -> ``key:seq`` with seq counting per key, and each key has a fixed partition,
so a log shows at a glance whether a record is missing, doubled or out of order.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKPartition

from cluster_harness import Cluster, ClusterError
from strom.client import Producer as StromProducer

ProducerClient = Literal["confluent", "kafka-python", "strom"]
PRODUCER_CLIENTS: tuple[ProducerClient, ...] = ("confluent", "kafka-python", "strom")


@dataclass(frozen=True, order=True)
class Record:
    partition: int
    # None in an acknowledgement without an offset: librdkafka's idempotent producer acknowledges
    # a request that failed uncertainly (timed out, connection lost) once a later one on the
    # partition succeeds (rd_kafka_dr_implicit_ack), and then knows no offset.
    offset: int | None
    key: bytes
    value: bytes


class KeyedProducer:
    """An idempotent ``acks=all`` producer sending ``rate`` records per second over ``keys`` keys
    (key i always to partition i % partitions) until stopped; keeps what was acknowledged."""

    def __init__(
        self,
        client: ProducerClient,
        bootstrap: str,
        topic: str,
        *,
        partitions: int = 3,
        keys: int = 6,
        rate: float = 100.0,
        acks: str = "all",
    ) -> None:
        self.client = client
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.keys = keys
        self.rate = rate
        self.acks = acks
        self.acked: list[Record] = []
        self.failed: list[tuple[bytes, bytes, str]] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer-{client}", daemon=True)
        self._error: BaseException | None = None

    def _ack(self, key: bytes, value: bytes, partition: int, offset: int) -> None:
        with self._lock:
            self.acked.append(Record(partition, offset, key, value))

    def _fail(self, key: bytes, value: bytes, error: object) -> None:
        with self._lock:
            self.failed.append((key, value, str(error)))

    def _sender(self) -> tuple[Callable[[bytes, bytes, int], None], Callable[[], None]]:
        """(send(key, value, partition), close()) for this client."""
        if self.client == "confluent":
            ck = CKProducer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "enable.idempotence": True,
                    "acks": self.acks,
                    "linger.ms": 5,
                    "topic.metadata.refresh.interval.ms": 1000,
                }
            )

            def send_ck(key: bytes, value: bytes, partition: int) -> None:
                def report(err: Any, msg: Any) -> None:
                    if err is None:
                        self._ack(key, value, msg.partition(), msg.offset())
                    else:
                        self._fail(key, value, err)

                ck.produce(self.topic, value, key, partition=partition, on_delivery=report)
                ck.poll(0)

            def close_ck() -> None:
                ck.flush(60)

            return send_ck, close_ck
        if self.client == "kafka-python":
            kp = kafka.KafkaProducer(
                bootstrap_servers=self.bootstrap.split(","),
                acks="all" if self.acks == "all" else int(self.acks),
                enable_idempotence=True,
                linger_ms=5,
                metadata_max_age_ms=1000,
            )

            def send_kp(key: bytes, value: bytes, partition: int) -> None:
                future = kp.send(self.topic, value=value, key=key, partition=partition)
                future.add_callback(lambda md: self._ack(key, value, md.partition, md.offset))
                future.add_errback(lambda exc: self._fail(key, value, exc))

            def close_kp() -> None:
                kp.flush(60)
                kp.close(10)

            return send_kp, close_kp
        sp = StromProducer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": self.acks,
                "linger.ms": 5,
                "metadata.max.age.ms": 1000,
            }
        )

        def send_sp(key: bytes, value: bytes, partition: int) -> None:
            def report(metadata: Any, exc: Exception | None) -> None:
                if exc is None:
                    self._ack(key, value, metadata.partition, metadata.offset)
                else:
                    self._fail(key, value, exc)

            sp.send(self.topic, value, key, partition=partition, callback=report)

        def close_sp() -> None:
            sp.flush(60)
            sp.close(10)

        return send_sp, close_sp

    def _run(self) -> None:
        try:
            send, close = self._sender()
            seqs = [0] * self.keys
            i = 0
            started = time.monotonic()
            while not self._stop.is_set():
                k = i % self.keys
                key = f"k{k}".encode()
                send(key, f"k{k}:{seqs[k]}".encode(), k % self.partitions)
                seqs[k] += 1
                i += 1
                self.sent = i
                delay = started + i / self.rate - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
            close()
        except BaseException as exc:
            self._error = exc

    def count(self, partition: int | None = None) -> int:
        with self._lock:
            if partition is None:
                return len(self.acked)
            return sum(1 for r in self.acked if r.partition == partition)

    def wait_for_progress(self, cluster: Cluster, records: int = 10, timeout: float = 15.0) -> float:
        """Until every partition has ``records`` more acknowledgements than now; the seconds it took."""
        start = time.monotonic()
        goals = {p: self.count(p) + records for p in range(self.partitions)}
        cluster.wait_for(
            lambda: all(self.count(p) >= goal for p, goal in goals.items()) or self._error is not None,
            f"{self.client} producer acknowledged {records} more records on every partition "
            f"(acked {self.count()}, failed {len(self.failed)}: {self.failed[-3:]})",
            timeout,
        )
        if self._error is not None:
            raise self._error
        return time.monotonic() - start

    def start(self) -> KeyedProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> KeyedProducer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class TailingConsumer:
    """A confluent-kafka consumer reading every partition from the beginning, throughout."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = 3) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "cluster-tests-tail",  # never joined: partitions are assigned
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.consumer.assign([CKPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.records: list[Record] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailing-consumer", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self.consumer.consume(500, 0.2):
                if msg.error() is not None:
                    self.errors.append(str(msg.error()))
                    continue
                with self._lock:
                    self.records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value()))
        self.consumer.close()

    def missing(self, acked: Iterable[Record]) -> list[Record]:
        """The acknowledged records not consumed: where they were acknowledged, or anywhere in
        their partition when acknowledged without an offset."""
        with self._lock:
            at = {(r.partition, r.offset) for r in self.records}
            values = {(r.partition, r.value) for r in self.records}
        return [
            r
            for r in acked
            if (
                (r.partition, r.offset) not in at
                if r.offset is not None
                else (r.partition, r.value) not in values
            )
        ]

    def wait_for(self, cluster: Cluster, acked: Iterable[Record], timeout: float = 30.0) -> None:
        """Until every acknowledged record has been consumed."""
        wanted = list(acked)
        try:
            cluster.wait_for(lambda: not self.missing(wanted), "every acknowledged record consumed", timeout)
        except Exception as exc:
            raise AssertionError(f"{exc}; missing {self.missing(wanted)[:10]}") from exc

    def start(self) -> TailingConsumer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def __enter__(self) -> TailingConsumer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def check_delivery(acked: Iterable[Record], consumed: Iterable[Record]) -> None:
    """Kafka's replication test: every acknowledged record was consumed where it was acknowledged,
    no record is in the log twice, and each key's records are in the order they were sent."""
    log: dict[tuple[int, int | None], Record] = {}
    for record in consumed:
        earlier = log.setdefault((record.partition, record.offset), record)
        # The same offset read twice (a refetch after a failover) must hold the same record.
        assert earlier == record, f"offset {record.partition}/{record.offset} held {earlier} and {record}"
    by_value = {(r.partition, r.value): r for r in log.values()}
    for record in acked:
        if record.offset is None:  # acknowledged without an offset: in its partition, somewhere
            found = by_value.get((record.partition, record.value))
            assert found is not None and found.key == record.key, f"acknowledged {record}, consumed {found}"
            continue
        found = log.get((record.partition, record.offset))
        assert found == record, f"acknowledged {record}, consumed {found}"
    values: dict[bytes, tuple[int, int]] = {}
    last_seq: dict[bytes, int] = defaultdict(lambda: -1)
    for (partition, offset), record in sorted(log.items()):
        twice = values.setdefault(record.value, (partition, offset))
        assert twice == (partition, offset), f"{record.value!r} at {twice} and at {(partition, offset)}"
        seq = int(record.value.rsplit(b":", 1)[1])
        assert seq > last_seq[record.key], (
            f"{record.key!r}: seq {seq} after {last_seq[record.key]} (order broken)"
        )
        last_seq[record.key] = seq


class EpochWatcher:
    """Samples every partition's state znode; ``check`` asserts leader epochs never went back and
    every change of leader came with a higher epoch."""

    def __init__(self, cluster: Cluster, topic: str, partitions: int = 3, interval: float = 0.1) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.interval = interval
        self.samples: dict[int, list[tuple[int, int]]] = {p: [] for p in range(partitions)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-watcher", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for p in range(self.partitions):
                try:
                    state = self.cluster.partition_state(self.topic, p)
                except Exception:  # the test's own ZooKeeper session may blink under load
                    continue
                if state is not None:
                    sample = (state.leader_epoch, state.leader)
                    if not self.samples[p] or self.samples[p][-1] != sample:
                        self.samples[p].append(sample)

    def check(self) -> None:
        for p, samples in self.samples.items():
            for (epoch_a, leader_a), (epoch_b, leader_b) in itertools.pairwise(samples):
                if epoch_b < epoch_a or (leader_b != leader_a and epoch_b == epoch_a):
                    raise ClusterError(f"{self.topic}-{p}: leader epochs went {samples}")

    def __enter__(self) -> EpochWatcher:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)
