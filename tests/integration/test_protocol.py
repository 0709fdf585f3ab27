"""Wire-level behaviour real clients depend on, checked byte by byte with a raw socket."""

from __future__ import annotations

import datetime
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v13 import request as fetch13
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v0.request import InitProducerIdRequest
from kio.schema.metadata.v10 import request as metadata10
from kio.schema.metadata.v12 import request as metadata12
from kio.schema.produce.v9 import request as produce9
from kio.schema.produce.v13 import request as produce13

from brokerproc import BrokerProcess
from kafka_wire import ZERO_UUID, KafkaWire, produce_request
from strom.protocol.apis import SUPPORTED_VERSIONS, ApiKey
from strom.records.codec import RecordSpec, decode_batches, encode_batch

TIMEOUT = datetime.timedelta(seconds=5)


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[KafkaWire]:
    with KafkaWire.connect(broker.bootstrap) as conn:
        yield conn


def test_api_versions_lists_exactly_the_supported_table(wire: KafkaWire) -> None:
    response = wire.request(ApiVersionsRequestV3(client_software_name="t", client_software_version="1"))
    assert response.error_code == ErrorCode.none
    advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert advertised == {int(k): (v.min, v.max) for k, v in SUPPORTED_VERSIONS.items()}
    assert advertised[ApiKey.PRODUCE] == (0, 13)


def test_api_versions_response_header_is_v0_and_has_no_tagged_fields(wire: KafkaWire) -> None:
    correlation_id = wire.send(ApiVersionsRequestV3(client_software_name="t", client_software_version="1"))
    frame = wire.recv_frame()
    assert struct.unpack_from(">i", frame)[0] == correlation_id
    # Header v0 is just the correlation id; the body starts with error_code int16 = 0.
    assert struct.unpack_from(">h", frame, 4)[0] == 0
    # Tagged fields at their defaults are not written: the body ends with throttle(4) + 0 tags.
    assert frame[-5:] == b"\0\0\0\0\0"


def test_unsupported_api_versions_version_gets_v0_error_35(wire: KafkaWire) -> None:
    # ApiVersions v99 with a v2 header: the broker cannot parse it, yet must answer in v0 layout.
    body = struct.pack(">hhih", 18, 99, 7, 1) + b"x" + b"\0" + b"\0\0"
    wire.send_raw(struct.pack(">i", len(body)) + body)
    frame = wire.recv_frame()
    correlation_id, error = struct.unpack_from(">ih", frame)
    assert (correlation_id, error) == (7, ErrorCode.unsupported_version)
    (count,) = struct.unpack_from(">i", frame, 6)
    entries = [struct.unpack_from(">hhh", frame, 10 + 6 * i) for i in range(count)]
    assert (18, 0, 4) in entries


def test_api_versions_v0_works(wire: KafkaWire) -> None:
    response = wire.request(ApiVersionsRequestV0())
    assert response.error_code == ErrorCode.none
    assert any(k.api_key == ApiKey.FETCH for k in response.api_keys)


def test_trailing_bytes_after_a_request_body_are_tolerated(wire: KafkaWire) -> None:
    frame, correlation_id = wire.encode(ApiVersionsRequestV0())
    body = frame[4:] + b"trailing-garbage"
    wire.send_raw(struct.pack(">i", len(body)) + body)
    response = wire.receive(ApiVersionsRequestV0, correlation_id)
    assert response.error_code == ErrorCode.none


def test_responses_come_in_request_order(wire: KafkaWire) -> None:
    wire.metadata("ordering")
    batch = encode_batch([RecordSpec(key=b"k", value=b"v")])
    requests = []
    for i in range(20):
        if i % 2:
            requests.append(ApiVersionsRequestV0())
        else:
            requests.append(produce_request("ordering", {0: batch}))
    ids = [wire.send(r) for r in requests]  # pipelined: all sent before any answer is read
    offsets = []
    for request, correlation_id in zip(requests, ids, strict=True):
        response = wire.receive(type(request), correlation_id)
        if isinstance(request, produce9.ProduceRequest):
            offsets.append(response.responses[0].partition_responses[0].base_offset)
    assert offsets == list(range(offsets[0], offsets[0] + 10))


def test_acks_zero_gets_no_response(wire: KafkaWire) -> None:
    wire.metadata("acks0")
    batch = encode_batch([RecordSpec(key=None, value=b"fire-and-forget")])
    wire.send(produce_request("acks0", {0: batch}, acks=0))
    # The next answer on the wire must be the ApiVersions one, not a produce response.
    response = wire.request(ApiVersionsRequestV0())
    assert response.error_code == ErrorCode.none


def test_failed_acks_zero_produce_closes_the_connection(wire: KafkaWire) -> None:
    wire.metadata("acks0-bad")
    bad = bytearray(encode_batch([RecordSpec(key=None, value=b"x")]))
    bad[-1] ^= 0xFF  # breaks the CRC
    wire.send(produce_request("acks0-bad", {0: bytes(bad)}, acks=0))
    assert wire.is_closed_by_peer()


def test_produce_v2_is_advertised_but_refused(wire: KafkaWire) -> None:
    body = struct.pack(">hhih", 0, 2, 5, 1) + b"x" + struct.pack(">hii", 1, 1000, 0)
    wire.send_raw(struct.pack(">i", len(body)) + body)
    assert wire.is_closed_by_peer()


def test_topic_ids_in_metadata_produce_v13_and_fetch_v13(wire: KafkaWire) -> None:
    response = wire.metadata("by-id")
    topic = response.topics[0]
    assert topic.error_code == ErrorCode.none and topic.topic_id != ZERO_UUID
    batch = encode_batch([RecordSpec(key=b"id", value=b"addressed by topic id")])
    produced = wire.request(
        produce13.ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=TIMEOUT,
            topic_data=(
                produce13.TopicProduceData(
                    topic_id=topic.topic_id,
                    partition_data=(produce13.PartitionProduceData(index=0, records=batch),),
                ),
            ),
        )
    )
    assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none
    fetched = wire.request(fetch_request(topic.topic_id, 0))
    data = fetched.responses[0].partitions[0]
    assert fetched.responses[0].topic_id == topic.topic_id
    assert data.error_code == ErrorCode.none and data.high_watermark == 1
    assert decode_batches(data.records)[0].records[0].value == b"addressed by topic id"


@pytest.mark.parametrize("module", [metadata10, metadata12], ids=["v10", "v12"])
def test_metadata_topic_without_name_or_id_is_invalid_request(wire: KafkaWire, module: Any) -> None:
    """A null name is allowed in the request from v10, in the response only from v12: the answer
    must still be encodable, and the connection keeps serving."""
    request = module.MetadataRequest(
        topics=(module.MetadataRequestTopic(topic_id=ZERO_UUID, name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
        **({"include_cluster_authorized_operations": False} if module is metadata10 else {}),
    )
    response = wire.request(request)
    (topic,) = response.topics
    assert topic.error_code == ErrorCode.invalid_request
    assert topic.name == (None if module is metadata12 else "")
    assert wire.metadata("after-unnamed").topics[0].error_code == ErrorCode.none


def fetch_request(topic_id: uuid.UUID, offset: int) -> object:
    return fetch13.FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=10),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            fetch13.FetchTopic(
                topic_id=topic_id,
                partitions=(
                    fetch13.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def test_unknown_topic_id_gets_unknown_topic_id(wire: KafkaWire) -> None:
    fetched = wire.request(fetch_request(uuid.uuid4(), 0))
    assert fetched.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id


def test_init_producer_id_with_transactional_id_needs_its_coordinator(wire: KafkaWire) -> None:
    """Before FindCoordinator has created the transaction log nobody coordinates the id
    (NOT_COORDINATOR, retriable); then the id gets a producer id at epoch 0, and the next call
    the same producer id at epoch 1 (fencing the first)."""
    transactional_id = f"txn-{uuid.uuid4().hex[:8]}"
    request = InitProducerIdRequest(
        transactional_id=transactional_id, transaction_timeout=datetime.timedelta(seconds=10)
    )
    first = wire.request(request)
    if first.error_code == ErrorCode.not_coordinator:
        found = wire.request(FindCoordinatorRequest(key=transactional_id, key_type=1))
        assert found.error_code == ErrorCode.none
        deadline = time.monotonic() + 10
        while (first := wire.request(request)).error_code != ErrorCode.none and time.monotonic() < deadline:
            assert first.error_code in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress)
            time.sleep(0.05)
    assert (first.error_code, first.producer_epoch) == (ErrorCode.none, 0)
    second = wire.request(request)
    assert (second.error_code, second.producer_id, second.producer_epoch) == (
        ErrorCode.none,
        first.producer_id,
        1,
    )


def test_idempotent_producer_ids_are_distinct(wire: KafkaWire) -> None:
    request = InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(seconds=10))
    ids = {wire.request(request).producer_id for _ in range(3)}
    assert len(ids) == 3 and all(i >= 0 for i in ids)
