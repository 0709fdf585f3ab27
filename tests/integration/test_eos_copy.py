"""Exactly-once copy, as Kafka's ``transactions_test``: a consume-transform-produce loop
(tests/eos_copier.py) with ``send_offsets_to_transaction`` copies 100,000 records from an input
topic to an output topic while its process is killed with SIGKILL and its broker (the
transaction and group coordinator, and every partition's leader) is killed with SIGKILL and
started again. A read_committed consumer of the output then sees every input record exactly
once, in order per partition. Run with confluent-kafka (librdkafka), kafka-python and Strom's
client.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from brokerproc import BrokerProcess
from integration.clients_util import create_topic

pytestmark = pytest.mark.usefixtures("running_broker")

BROKER_CONFIG = {
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
}
RECORDS = 100_000
PARTITIONS = 3
COPIER = Path(__file__).parent.parent / "eos_copier.py"
SUFFIX = b"|copied"
DEADLINE_S = 180


def fill(bootstrap: str, topic: str, records: int = RECORDS, partitions: int = PARTITIONS) -> dict[int, list[bytes]]:
    """The input: ``records`` values spread round-robin over the partitions, each naming its place."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    values: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for i in range(records):
        p = i % partitions
        value = f"{p}-{len(values[p]):06d}".encode()
        values[p].append(value)
        while True:
            try:
                producer.produce(topic, value=value, partition=p)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    return values


class Copier:
    def __init__(self, client: str, bootstrap: str, source: str, sink: str, group: str, log: Path) -> None:
        self.args = [sys.executable, str(COPIER), client, bootstrap, source, sink, group, f"copier-{group}"]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
        self.starts += 1

    def transactions(self) -> int:
        """Transactions committed so far by every copier of this test (their "committed" lines)."""
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if line.startswith("committed "))

    def wait_for_transactions(self, count: int, deadline: float) -> None:
        """Until the copiers committed ``count`` transactions: progress measured at the copier,
        whatever the speed of the machine."""
        while self.transactions() < count:
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            self.ensure_running()
            time.sleep(0.05)

    def ensure_running(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.start()

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def committed(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> int:
    """Records the group's committed offsets cover (0 while its coordinator is unreachable)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=5)
        return sum(max(tp.offset, 0) for tp in offsets)
    except Exception:
        return 0
    finally:
        consumer.close()


def read_committed_output(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, list[bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    eof: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 60
        while len(eof) < partitions and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is not None:
                    eof.add(m.partition())  # _PARTITION_EOF: the LSO is reached
                else:
                    eof.discard(m.partition())
                    got[m.partition()].append(m.value())
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "strom"])
def test_exactly_once_copy_through_copier_and_broker_crashes(
    broker: BrokerProcess, client: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    source, sink, group = f"eos-in-{run}", f"eos-out-{run}", f"eos-{client}-{run}"
    create_topic(broker.bootstrap, source, partitions=PARTITIONS)
    create_topic(broker.bootstrap, sink, partitions=PARTITIONS)
    values = fill(broker.bootstrap, source)
    copier = Copier(client, broker.bootstrap, source, sink, group, tmp_path / "copier.log")
    copier.start()
    deadline = time.monotonic() + DEADLINE_S

    def wait_until(target: int) -> int:
        while (done := committed(broker.bootstrap, group, source)) < target:
            assert time.monotonic() < deadline, (done, copier.log.read_text()[-3000:])
            copier.ensure_running()  # a copier that exited (fenced, or stuck) is replaced
            time.sleep(0.1)
        return done

    try:
        copier.wait_for_transactions(20, deadline)  # 10,000 of 100,000 records copied
        copier.kill9()  # mid-transaction, most likely: its successor fences it and aborts it
        copier.start()
        copier.wait_for_transactions(copier.transactions() + 2, deadline)  # the successor copies
        broker.restart(crash=True)  # the coordinators and every leader, killed with SIGKILL
        wait_until(RECORDS)
    finally:
        copier.stop()
    got = read_committed_output(broker.bootstrap, sink)
    for p in range(PARTITIONS):
        expected = [v + SUFFIX for v in values[p]]
        assert len(got[p]) == len(expected), (p, len(got[p]), len(expected))
        assert got[p] == expected  # every record once, in order
