"""DescribeLogDirs (35) on a healthy broker: its one log dir, without error, with each partition's size,
in every version Kafka 4.1 serves (1-4); a topics filter narrows the answer. The offline case (error
KAFKA_STORAGE_ERROR) is in test_full_disk.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kio.schema.errors import ErrorCode

from brokerproc import BrokerProcess
from kafka_wire import KafkaWire, kio_request
from strom.records.codec import RecordSpec, encode_batch

TOPIC = "log-dirs"


@pytest.fixture(scope="module")
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        assert conn.create_topic(TOPIC, partitions=2) == ErrorCode.none
        conn.produce_ok(TOPIC, encode_batch([RecordSpec(key=None, value=b"v" * 1000)]), partition=1)
        yield conn


def partition_sizes(result: object) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.partition_size for t in result.topics for p in t.partitions}  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_describe_log_dirs_reports_the_dir_and_partition_sizes(
    wire: KafkaWire, broker: BrokerProcess, version: int
) -> None:
    module = kio_request("describe_log_dirs", version)
    response = wire.request(module.DescribeLogDirsRequest(topics=None))
    if version >= 3:
        assert response.error_code == ErrorCode.none
    (result,) = response.results
    assert result.error_code == ErrorCode.none
    assert Path(result.log_dir) == broker.data_dir.absolute()
    sizes = partition_sizes(result)
    assert sizes[(TOPIC, 0)] == 0 and sizes[(TOPIC, 1)] > 1000
    if version >= 4:
        assert 0 < result.usable_bytes <= result.total_bytes


def test_describe_log_dirs_filters_by_topic_and_partition(wire: KafkaWire) -> None:
    module = kio_request("describe_log_dirs", 4)
    request = module.DescribeLogDirsRequest(
        topics=(module.DescribableLogDirTopic(topic=TOPIC, partitions=(1,)),)
    )
    (result,) = wire.request(request).results
    assert list(partition_sizes(result)) == [(TOPIC, 1)]


def test_kafka_python_admin_describes_log_dirs(
    wire: KafkaWire, bootstrap: str, broker: BrokerProcess
) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        (answer,) = admin.describe_log_dirs()
    finally:
        admin.close()
    (log_dir,) = answer["log_dirs"]
    assert log_dir["error_code"] == 0 and Path(log_dir["log_dir"]) == broker.data_dir.absolute()
    topics = {t["name"]: t for t in log_dir["topics"]}
    assert {p["partition_index"] for p in topics[TOPIC]["partitions"]} == {0, 1}


def test_broker_starts_with_a_log_dir_that_fails_to_load_and_recovers_after_repair(tmp_path: Path) -> None:
    """An I/O error while loading (here EISDIR: a directory where a segment file should be) takes
    the log dir offline; the broker still starts, answers Metadata and KAFKA_STORAGE_ERROR, and
    serves every record again once the damage is repaired and it restarts."""
    topic = "load-failure"
    broker = BrokerProcess(tmp_path)
    try:
        broker.start()
        with KafkaWire.connect(broker.bootstrap) as conn:
            assert conn.create_topic(topic) == ErrorCode.none
            for i in range(5):
                assert conn.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"%d" % i)])) == i
        broker.stop()
        damage = broker.data_dir / f"{topic}-0" / "00000000000000099999.log"
        damage.mkdir()

        broker.start()
        with KafkaWire.connect(broker.bootstrap) as conn:
            (described,) = conn.metadata(topic).topics
            (partition,) = described.partitions
            assert partition.error_code == ErrorCode.leader_not_available and partition.leader_id == -1
            one = encode_batch([RecordSpec(key=None, value=b"x")])
            assert conn.produce(topic, one).error_code == ErrorCode.kafka_storage_error
            assert conn.fetch(topic, 0).error_code == ErrorCode.kafka_storage_error
            module = kio_request("describe_log_dirs", 4)
            (result,) = conn.request(module.DescribeLogDirsRequest(topics=None)).results
            assert result.error_code == ErrorCode.kafka_storage_error
        log_text = broker.log_path.read_text(errors="replace")
        assert log_text.count("is offline after an I/O error") == 1
        broker.stop()

        damage.rmdir()
        broker.start()
        with KafkaWire.connect(broker.bootstrap) as conn:
            assert conn.fetch(topic, 0).error_code == ErrorCode.none
            assert conn.produce_ok(topic, encode_batch([RecordSpec(key=None, value=b"5")])) == 5
        broker.stop()
    finally:
        if broker.running:
            broker.kill9()
