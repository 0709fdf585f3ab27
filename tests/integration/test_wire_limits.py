"""The broker's wire limits, over TCP: request memory, connection quotas, fetch.max.bytes,
the per-request partition cap, InitProducerId and null arrays."""

from __future__ import annotations

import contextlib
import datetime
import socket
import struct
import time
from pathlib import Path

from kio.schema.create_partitions.v3 import request as create_partitions3
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.delete_topics.v6 import request as delete_topics6
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v13 import request as fetch13
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.metadata.v12 import request as metadata12
from kio.schema.produce.v13 import request as produce13

from brokerproc import BrokerProcess
from kafka_wire import REQUEST_TIMEOUT, KafkaWire
from strom.records.codec import RecordSpec, encode_batch

MAX_PER_IP = 12
FETCH_MAX_BYTES = 2048
REQUEST_MEMORY = 4 << 20
BROKER_CONFIG = {
    "max.connections.per.ip": str(MAX_PER_IP),
    "fetch.max.bytes": str(FETCH_MAX_BYTES),
    "queued.max.request.bytes": str(REQUEST_MEMORY),
    "socket.request.max.bytes": str(2 << 20),
}


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def create_topics(wire: KafkaWire, *topics: tuple[str, int]) -> list[tuple[int, str | None]]:
    response = wire.request(
        create_topics7.CreateTopicsRequest(
            topics=tuple(
                create_topics7.CreatableTopic(
                    name=name, num_partitions=partitions, replication_factor=1, assignments=(), configs=()
                )
                for name, partitions in topics
            ),
            timeout=REQUEST_TIMEOUT,
        )
    )
    return [(t.error_code, t.error_message) for t in response.topics]


def test_create_topics_with_millions_of_partitions_is_refused_at_once(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        started = time.monotonic()
        results = create_topics(wire, ("huge", 8_388_353), ("small-companion", 1))
        assert time.monotonic() - started < 1.0
        # Kafka refuses the whole request: every topic gets POLICY_VIOLATION.
        assert [code for code, _ in results] == [ErrorCode.policy_violation] * 2
        assert "Excessively large number of partitions" in (results[0][1] or "")
        # Together over the cap, each alone under it.
        results = create_topics(wire, ("half-a", 6000), ("half-b", 6000))
        assert {code for code, _ in results} == {ErrorCode.policy_violation}
        assert "huge" not in {t.name for t in wire.metadata().topics}
        assert create_topics(wire, ("normal", 3)) == [(ErrorCode.none, None)]


def test_create_partitions_beyond_the_cap_is_refused(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic("grows", partitions=1) == ErrorCode.none
        response = wire.request(
            create_partitions3.CreatePartitionsRequest(
                topics=(
                    create_partitions3.CreatePartitionsTopic(name="grows", count=2**31 - 1, assignments=None),
                ),
                timeout=REQUEST_TIMEOUT,
                validate_only=False,
            )
        )
        (result,) = response.results
        assert result.error_code == ErrorCode.policy_violation and result.error_message
        assert len(wire.metadata("grows").topics[0].partitions) == 1


def test_init_producer_id_without_transactional_id_always_hands_out_a_fresh_id(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        first = wire.request(
            InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=datetime.timedelta(seconds=10),
                producer_id=-1,
                producer_epoch=-1,
            )
        )
        assert first.error_code == ErrorCode.none and first.producer_epoch == 0
        # KIP-360: the producer sends its id and epoch back; Kafka still allocates a new id.
        again = wire.request(
            InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=datetime.timedelta(seconds=10),
                producer_id=first.producer_id,
                producer_epoch=first.producer_epoch,
            )
        )
        assert again.error_code == ErrorCode.none
        assert again.producer_id != first.producer_id and again.producer_epoch == 0


def test_list_offsets_with_null_topics_closes_only_that_connection(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        # ListOffsets v5 (not flexible): replica_id, isolation_level, topics = null (-1).
        body = struct.pack(">hhih", 2, 5, 1, 0) + struct.pack(">ibi", -1, 0, -1)
        wire.send_raw(struct.pack(">i", len(body)) + body)
        assert wire.is_closed_by_peer()
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.metadata().brokers
    log = broker.log_tail(400)
    assert "malformed LIST_OFFSETS v5 request: ListOffsetsRequest.topics: null length -1" in log
    assert "Traceback" not in log


def test_fetch_responses_are_capped_by_the_broker_fetch_max_bytes(broker: BrokerProcess) -> None:
    with KafkaWire.connect(broker.bootstrap) as wire:
        assert wire.create_topic("capped", partitions=2) == ErrorCode.none
        batch = encode_batch([RecordSpec(None, b"v" * 1000)])
        for partition in (0, 1):
            for _ in range(4):
                wire.produce_ok("capped", batch, partition=partition)
        response = wire.request(
            fetch12.FetchRequest(
                max_wait=datetime.timedelta(0),
                min_bytes=1,
                max_bytes=50 << 20,
                topics=(
                    fetch12.FetchTopic(
                        topic="capped",
                        partitions=tuple(
                            fetch12.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20)
                            for p in (0, 1)
                        ),
                    ),
                ),
                forgotten_topics_data=(),
            )
        )
        sizes = [len(p.records or b"") for p in response.responses[0].partitions]
        assert sizes[0] >= len(batch)  # the first partition with data gets at least one batch
        assert sum(sizes) <= FETCH_MAX_BYTES


def test_connections_over_max_connections_per_ip_are_closed_at_once(broker: BrokerProcess) -> None:
    held = [KafkaWire.connect(broker.bootstrap) for _ in range(MAX_PER_IP)]
    try:
        for wire in held:
            assert wire.metadata().brokers
        extra = KafkaWire.connect(broker.bootstrap)
        assert extra.is_closed_by_peer(timeout=3.0)
        extra.close()
        held.pop().close()
        deadline = time.monotonic() + 3.0
        while True:  # the broker learns of the close asynchronously
            with KafkaWire.connect(broker.bootstrap) as wire:
                try:
                    assert wire.metadata().brokers
                    break
                except ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
    finally:
        for wire in held:
            wire.close()
    assert "max.connections.per.ip=12" in broker.log_tail(400)


def test_request_memory_is_bounded_by_bytes_and_frees_when_senders_go(broker: BrokerProcess) -> None:
    assert broker.pid is not None
    time.sleep(0.3)  # let connections of earlier tests be reaped
    before = vm_rss_kib(broker.pid)
    senders = []
    chunk = b"\0" * (64 << 10)
    # Ten senders each stream 1.5 MiB of a 2 MiB request and stall: 15 MiB sent, 4 MiB admitted.
    for _ in range(10):
        sock = socket.create_connection(("127.0.0.1", broker.port))
        sock.setblocking(False)
        sock.send(struct.pack(">i", 2 << 20))
        senders.append(sock)
    deadline = time.monotonic() + 5.0
    sent = [0] * len(senders)
    while time.monotonic() < deadline and min(sent) < (3 << 19):
        for i, sock in enumerate(senders):
            if sent[i] < (3 << 19):
                with contextlib.suppress(BlockingIOError):
                    sent[i] += sock.send(chunk)
        time.sleep(0.01)
    grown = vm_rss_kib(broker.pid) - before
    # The broker stopped reading near the bound; what it holds is within the bound plus slack.
    assert grown < (REQUEST_MEMORY >> 10) + 8 * 1024, grown
    for sock in senders:
        sock.close()
    deadline = time.monotonic() + 5.0
    while True:
        try:
            with KafkaWire.connect(broker.bootstrap) as wire:
                assert wire.metadata().brokers
            break
        except (ConnectionError, TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_zero_topic_ids_and_null_names_get_kafka_errors(broker: BrokerProcess) -> None:
    """kio decodes the zero uuid as None: every by-id API must answer it, not fail on it."""
    with KafkaWire.connect(broker.bootstrap) as wire:
        fetch = wire.request(
            fetch13.FetchRequest(
                max_wait=datetime.timedelta(0),
                min_bytes=1,
                topics=(
                    fetch13.FetchTopic(
                        topic_id=None,
                        partitions=(
                            fetch13.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1024),
                        ),
                    ),
                ),
                forgotten_topics_data=(),
            )
        )
        assert fetch.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id
        metadata = wire.request(
            metadata12.MetadataRequest(
                topics=(metadata12.MetadataRequestTopic(topic_id=None, name=None),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        assert metadata.topics[0].error_code != ErrorCode.none
        deleted = wire.request(
            delete_topics6.DeleteTopicsRequest(
                topics=(delete_topics6.DeleteTopicState(name=None, topic_id=None),), timeout=REQUEST_TIMEOUT
            )
        )
        assert deleted.responses[0].error_code != ErrorCode.none
        produced = wire.request(
            produce13.ProduceRequest(
                transactional_id=None,
                acks=1,
                timeout=REQUEST_TIMEOUT,
                topic_data=(
                    produce13.TopicProduceData(
                        topic_id=None, partition_data=(produce13.PartitionProduceData(index=0, records=None),)
                    ),
                ),
            )
        )
        assert produced.responses[0].partition_responses[0].error_code != ErrorCode.none
    assert "Traceback" not in broker.log_tail(400)
