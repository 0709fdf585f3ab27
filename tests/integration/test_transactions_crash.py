"""kill -9 of a single node's transaction coordinator at each phase of a transaction's end.

The phases are held open on purpose with min.insync.replicas above what one node has (a marker
or a transaction log write is refused with NOT_ENOUGH_REPLICAS, and the coordinator retries it):
- after Prepare: no partition has its marker yet;
- between markers: one topic's partition has its marker, the other's does not;
- before Complete: every marker is written, the Complete state is not.
The broker is killed there and started again; once the configs let the writes through, the
coordinator that loaded the Prepare state finishes the transaction. Every transaction ends the
same way on all its partitions, and read_committed consumers see each committed record once and
no aborted one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer, TopicPartition

from brokerproc import BrokerProcess
from integration.clients_util import confluent_consumer, create_topic, poll_confluent
from kafka_wire import KafkaWire, kio_request
from strom.protocol.errors import ErrorCode

pytestmark = pytest.mark.usefixtures("running_broker")

BROKER_CONFIG = {
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.num.partitions": "3",
}
TXN_TOPIC = "__transaction_state"


def _set_min_isr(bootstrap: str, topic: str, value: int) -> None:
    with KafkaWire.connect(bootstrap) as wire:
        assert wire.incremental_alter_configs(topic, {"min.insync.replicas": str(value)}) == ErrorCode.none


def _state(bootstrap: str, transactional_id: str) -> str:
    with KafkaWire.connect(bootstrap) as wire:
        describe = kio_request("describe_transactions", 0)
        (state,) = wire.request(
            describe.DescribeTransactionsRequest(transactional_ids=(transactional_id,))
        ).transaction_states
        return "" if state.error_code != ErrorCode.none else str(state.transaction_state)


def _wait_for_state(bootstrap: str, transactional_id: str, expected: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        try:
            state = _state(bootstrap, transactional_id)
        except OSError:
            state = "unreachable"
        if state == expected:
            return
        time.sleep(0.1)
    raise AssertionError(f"{transactional_id} is {state!r}, not {expected!r}")


def _read_committed(bootstrap: str, topics: list[str], count: int, timeout: float) -> list[bytes]:
    consumer = confluent_consumer(bootstrap, **{"isolation.level": "read_committed", "group.id": uuid.uuid4().hex})
    try:
        consumer.assign([TopicPartition(t, 0, 0) for t in topics])
        return sorted(c.value for c in poll_confluent(consumer, count, timeout) if c.value is not None)
    finally:
        consumer.close()


def _held_transaction(
    broker: BrokerProcess, topics: list[str], commit: bool, hold: Callable[[], None]
) -> tuple[str, list[bytes]]:
    """A transaction over ``topics`` whose end ``hold`` keeps from completing; its id and values."""
    bootstrap = broker.bootstrap
    transactional_id = f"crash-{uuid.uuid4().hex[:8]}"
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 2}
    )
    producer.init_transactions(15)
    producer.begin_transaction()
    values = [f"{transactional_id}-{t}-{i}".encode() for t in topics for i in range(5)]
    for value in values:
        producer.produce(_topic_of(value, topics), value=value)
    producer.flush(10)
    hold()
    if commit:
        producer.commit_transaction(15)  # answered once PrepareCommit is written
    else:
        producer.abort_transaction(15)
    return transactional_id, values


def _topic_of(value: bytes, topics: list[str]) -> str:
    return next(t for t in topics if f"-{t}-".encode() in value)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_kill_after_prepare(broker: BrokerProcess, commit: bool) -> None:
    topic = f"after-prepare-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic)
    transactional_id, values = _held_transaction(
        broker, [topic], commit, lambda: _set_min_isr(broker.bootstrap, topic, 2)
    )
    time.sleep(0.3)
    assert _state(broker.bootstrap, transactional_id) == ("PrepareCommit" if commit else "PrepareAbort")
    broker.kill9()
    broker.start()
    _set_min_isr(broker.bootstrap, topic, 1)
    _wait_for_state(broker.bootstrap, transactional_id, "CompleteCommit" if commit else "CompleteAbort")
    expected = sorted(values) if commit else []
    assert _read_committed(broker.bootstrap, [topic], len(values) + 1, timeout=4) == expected


def test_kill_between_markers(broker: BrokerProcess) -> None:
    marked, unmarked = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("marked", "unmarked"))
    for topic in (marked, unmarked):
        create_topic(broker.bootstrap, topic)
    transactional_id, values = _held_transaction(
        broker, [marked, unmarked], True, lambda: _set_min_isr(broker.bootstrap, unmarked, 2)
    )
    # The marked topic's COMMIT is in: its records are readable, the other topic's are not yet.
    marked_values = sorted(v for v in values if _topic_of(v, [marked, unmarked]) == marked)
    assert _read_committed(broker.bootstrap, [marked, unmarked], len(values), timeout=3) == marked_values
    assert _state(broker.bootstrap, transactional_id) == "PrepareCommit"
    broker.kill9()
    broker.start()
    _set_min_isr(broker.bootstrap, unmarked, 1)
    _wait_for_state(broker.bootstrap, transactional_id, "CompleteCommit")
    assert _read_committed(broker.bootstrap, [marked, unmarked], len(values) + 1, timeout=4) == sorted(values)


def test_kill_before_complete(broker: BrokerProcess) -> None:
    topic = f"before-complete-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic)

    def hold() -> None:
        _set_min_isr(broker.bootstrap, topic, 2)

    transactional_id, values = _held_transaction(broker, [topic], True, hold)
    # Prepare is written; now hold the Complete write and let the markers through.
    _set_min_isr(broker.bootstrap, TXN_TOPIC, 2)
    _set_min_isr(broker.bootstrap, topic, 1)
    assert _read_committed(broker.bootstrap, [topic], len(values), timeout=10) == sorted(values)
    assert _state(broker.bootstrap, transactional_id) == "PrepareCommit"
    broker.kill9()
    broker.start()
    _set_min_isr(broker.bootstrap, TXN_TOPIC, 1)
    _wait_for_state(broker.bootstrap, transactional_id, "CompleteCommit")
    # The markers written again after the restart commit nothing twice.
    assert _read_committed(broker.bootstrap, [topic], len(values) + 1, timeout=3) == sorted(values)
