"""The request path's counters (strom.broker.metrics.stats): histogram buckets, error codes found in
kio responses, a Fetch response's bytes per topic, and a connection's request times."""

from __future__ import annotations

import asyncio
import struct
import uuid

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from strom.broker.metrics.collectors import request_families, request_histograms_text
from strom.broker.metrics.stats import (
    CURRENT_REQUEST,
    DelayedOperations,
    Histogram,
    ListenerStats,
    RequestStats,
    RequestWait,
    count_errors,
    count_fetch,
    delayed_fetch,
    error_name,
    request_name,
)
from strom.broker.network import ConnectionQuotas, KafkaConnection, NetworkLimits, RequestMemory
from strom.broker.slices import SLICE_SIZE, ArrayBuilder
from strom.protocol.apis import ApiKey, response_module
from strom.protocol.errors import ErrorCode
from strom.protocol.framing import EncodedArray
from strom.protocol.messages import build


def test_histogram_buckets_are_upper_inclusive_and_cumulative() -> None:
    histogram = Histogram((1.0, 10.0))
    for value in (0.5, 1.0, 1.5, 10.0, 11.0):
        histogram.observe(value)
    assert histogram.cumulative() == [("1", 2), ("10", 4), ("+Inf", 5)]
    assert histogram.count == 5
    assert histogram.sum == 24.0


def test_names_are_kafkas() -> None:
    assert request_name(ApiKey.LIST_OFFSETS) == "ListOffsets"
    assert request_name(ApiKey.OFFSET_FOR_LEADER_EPOCH) == "OffsetForLeaderEpoch"
    assert error_name(ErrorCode.not_leader_or_follower) == "NOT_LEADER_OR_FOLLOWER"
    assert error_name(31_000) == "UNKNOWN_31000"


def test_count_errors_walks_nested_responses_and_leaves_none_out() -> None:
    r = response_module(ApiKey.PRODUCE, 9)
    partitions = tuple(
        build(
            r.PartitionProduceResponse,
            index=i,
            error_code=code,
            base_offset=-1,
            log_start_offset=-1,
            record_errors=(),
        )
        for i, code in enumerate(
            (ErrorCode.none, ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_or_partition)
        )
    )
    response = build(
        r.ProduceResponse,
        responses=(build(r.TopicProduceResponse, name="t", partition_responses=partitions),),
    )
    errors: dict[int, int] = {}
    count_errors(response, errors)
    assert errors == {ErrorCode.unknown_topic_or_partition: 2}


def test_count_fetch_sums_record_bytes_per_topic_by_name_or_id() -> None:
    for version, by_id in ((12, False), (13, True)):
        r = response_module(ApiKey.FETCH, version)
        topic_id = uuid.uuid4()

        def data(index: int, code: ErrorCode, records: bytes, r: object = r) -> object:
            return build(
                r.PartitionData,  # type: ignore[attr-defined]
                partition_index=index,
                error_code=code,
                high_watermark=0,
                last_stable_offset=0,
                log_start_offset=0,
                aborted_transactions=None,
                records=records,
            )

        topic_key = {"topic_id": topic_id} if by_id else {"topic": "t"}
        response = build(
            r.FetchResponse,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(
                build(
                    r.FetchableTopicResponse,
                    partitions=(
                        data(0, ErrorCode.none, b"x" * 70),
                        data(1, ErrorCode.none, b"y" * 30),
                        data(2, ErrorCode.not_leader_or_follower, b""),
                    ),
                    **topic_key,
                ),
            ),
        )
        errors: dict[int, int] = {}
        sizes: dict[object, int] = {}
        count_fetch(response, by_id, errors, sizes)
        assert errors == {ErrorCode.not_leader_or_follower: 1}
        assert sizes == {(topic_id if by_id else "t"): 100}


def test_a_delayed_fetch_counts_in_purgatory_and_as_its_requests_remote_time() -> None:
    async def run() -> None:
        delayed = DelayedOperations()
        wait = RequestWait(delayed)
        CURRENT_REQUEST.set(wait)
        with delayed_fetch():
            assert delayed.fetch == 1
            await asyncio.sleep(0.05)
        assert delayed.fetch == 0
        assert wait.seconds >= 0.04

    asyncio.run(run())
    with delayed_fetch():  # outside a request's task: nothing to count in
        pass


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def get_extra_info(self, name: str) -> object:
        return ("10.0.0.1", 1) if name == "peername" else None

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def writelines(self, parts: list[bytes]) -> None:
        self.written.append(b"".join(parts))

    def close(self) -> None: ...

    def abort(self) -> None: ...


def test_a_connection_times_each_request_and_counts_itself_in_its_listener() -> None:
    stats = RequestStats("Produce")
    listener = ListenerStats("PLAINTEXT")

    async def run() -> None:
        async def handle(connection: KafkaConnection, frame: memoryview) -> list[bytes]:
            connection.request_stats = stats
            with delayed_fetch():
                await asyncio.sleep(0.02)
            return [b"answer"]

        shared = NetworkLimits(1 << 20, 4, RequestMemory(0), ConnectionQuotas(10, 10))
        connection = KafkaConnection(handle, shared, listener=listener)
        transport = _Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        assert listener.connections == 1 and listener.created == 1
        connection.data_received(struct.pack(">i", 3) + b"abc")
        while not transport.written:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)
        connection.close()
        assert listener.connections == 0 and listener.closed == 1

    asyncio.run(run())
    assert stats.total.count == stats.local.count == stats.remote.count == stats.send.count == 1
    assert stats.remote.sum >= 15  # the delayed fetch's wait, in ms
    assert stats.response_bytes.sum == len(b"answer")


def test_request_metrics_format_as_prometheus_text() -> None:
    stats = RequestStats("Fetch")
    stats.received(12, 100)
    stats.errors[ErrorCode.not_leader_or_follower] = 3
    stats.responded(0.0, 0.001, 0.002, 0.402, 0.402, 0.403, 0.0, 2048)
    unused = RequestStats("Metadata")  # never called: no series

    class Collector:
        def collect(self) -> object:
            return request_families([stats, unused])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())  # type: ignore[arg-type]
    text = generate_latest(registry).decode() + "".join(request_histograms_text([stats, unused]))
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert (
        samples[("kafka_network_requestmetrics_requests_total", (("request", "Fetch"), ("version", "12")))]
        == 1
    )
    errors = (("error", "NOT_LEADER_OR_FOLLOWER"), ("request", "Fetch"))
    assert samples[("kafka_network_requestmetrics_errors_total", errors)] == 3
    remote = "kafka_network_requestmetrics_remotetimems"
    assert samples[(remote + "_bucket", (("le", "500"), ("request", "Fetch")))] == 1
    assert samples[(remote + "_bucket", (("le", "250"), ("request", "Fetch")))] == 0
    assert samples[(remote + "_bucket", (("le", "+Inf"), ("request", "Fetch")))] == 1
    assert samples[(remote + "_count", (("request", "Fetch"),))] == 1
    assert 399 < samples[(remote + "_sum", (("request", "Fetch"),))] < 401
    assert samples[("strom_network_requestmetrics_responsebytes_sum", (("request", "Fetch"),))] == 2048
    assert "Metadata" not in text


def test_counts_of_a_response_encoded_in_slices() -> None:
    """A response array larger than a slice is encoded as it is built (strom.broker.slices): its
    error codes and record bytes are tallied then, and counted as if it were walked."""
    r = response_module(ApiKey.FETCH, 13)

    def data(index: int) -> object:
        return build(
            r.PartitionData,
            partition_index=index,
            error_code=ErrorCode.not_leader_or_follower if index % 100 == 0 else ErrorCode.none,
            high_watermark=0,
            last_stable_offset=0,
            log_start_offset=0,
            aborted_transactions=None,
            records=b"" if index % 100 == 0 else b"r" * 10,
        )

    async def built(element_type: type, elements: list[object]) -> object:
        builder = ArrayBuilder(element_type)
        for element in elements:
            await builder.add(element)
        return builder.value()

    wide = uuid.uuid4()
    partitions = asyncio.run(built(r.PartitionData, [data(i) for i in range(SLICE_SIZE + 500)]))
    assert isinstance(partitions, EncodedArray)
    many = [uuid.uuid4() for _ in range(SLICE_SIZE + 1)]
    topics = [build(r.FetchableTopicResponse, topic_id=wide, partitions=partitions)]
    topics += [build(r.FetchableTopicResponse, topic_id=t, partitions=(data(1),)) for t in many]
    response = build(
        r.FetchResponse,
        error_code=ErrorCode.none,
        session_id=0,
        responses=asyncio.run(built(r.FetchableTopicResponse, topics)),
    )
    errors: dict[int, int] = {}
    sizes: dict[object, int] = {}
    count_fetch(response, True, errors, sizes)
    assert errors == {ErrorCode.not_leader_or_follower: (SLICE_SIZE + 500) // 100}
    assert sizes[wide] == 10 * (SLICE_SIZE + 500 - (SLICE_SIZE + 500) // 100)
    assert all(sizes[t] == 10 for t in many) and len(sizes) == len(many) + 1

    described = response_module(ApiKey.DESCRIBE_GROUPS, 5)
    groups = [
        build(
            described.DescribedGroup,
            error_code=ErrorCode.coordinator_not_available if i % 2 else ErrorCode.none,
            group_id=f"g{i}",
            group_state="",
            protocol_type="",
            protocol_data="",
            members=(),
            authorized_operations=-2147483648,
        )
        for i in range(SLICE_SIZE + 2)
    ]
    group_errors: dict[int, int] = {}
    count_errors(
        build(described.DescribeGroupsResponse, groups=asyncio.run(built(described.DescribedGroup, groups))),
        group_errors,
    )
    assert group_errors == {ErrorCode.coordinator_not_available: (SLICE_SIZE + 2) // 2}


def test_fetch_is_the_sum_of_its_consumer_and_follower_parts() -> None:
    consumer, follower = RequestStats("FetchConsumer"), RequestStats("FetchFollower")
    consumer.received(12, 100)
    follower.received(12, 80)
    consumer.responded(0.0, 0.001, 0.002, 0.002, 0.002, 0.003, 0.0, 50)
    follower.errors[ErrorCode.not_leader_or_follower] = 2
    fetch = RequestStats.sum_of("Fetch", (consumer, follower))
    assert (consumer.versions, follower.versions, fetch.versions) == ({12: 1}, {12: 1}, {12: 2})
    assert (consumer.total.count, follower.total.count, fetch.total.count) == (1, 0, 1)
    assert fetch.request_bytes.sum == 180 and fetch.response_bytes.sum == 50
    assert follower.errors == fetch.errors == {ErrorCode.not_leader_or_follower: 2}
    assert consumer.errors == {}
