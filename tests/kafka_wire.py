"""A minimal blocking Kafka protocol client for tests that need exact control over the bytes.

Requests are kio entities; the header version follows the request's flexibility, as
real clients do. ``send_raw`` writes arbitrary bytes for hostile-input tests. The
convenience methods below send one request about one topic and return the part of the
answer a test reads, usually the single partition's result.
"""

from __future__ import annotations

import datetime
import io
import socket
import struct
import uuid
from collections.abc import Mapping
from typing import Any

from kio.index import load_response_schema
from kio.schema.create_topics.v7 import request as create_topics7
from kio.schema.delete_records.v2 import request as delete_records2
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.incremental_alter_configs.v1 import request as incremental_alter_configs1
from kio.schema.list_offsets.v7 import request as list_offsets7
from kio.schema.metadata.v12 import request as metadata12
from kio.schema.produce.v9 import request as produce9
from kio.serial import entity_reader, entity_writer

from strom.protocol.apis import is_flexible

# ListOffsets timestamps that ask for the log end offset and the log start offset.
LATEST, EARLIEST = -1, -2
REQUEST_TIMEOUT = datetime.timedelta(seconds=5)
TOPIC_RESOURCE = 2
CONFIG_SET = 0
ZERO_UUID = uuid.UUID(int=0)


def produce_request(topic: str, batches: Mapping[int, bytes], *, acks: int = 1) -> Any:
    """A Produce v9 request carrying one record set per partition of ``topic``."""
    return produce9.ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=REQUEST_TIMEOUT,
        topic_data=(
            produce9.TopicProduceData(
                name=topic,
                partition_data=tuple(
                    produce9.PartitionProduceData(index=p, records=records) for p, records in batches.items()
                ),
            ),
        ),
    )


class KafkaWire:
    def __init__(self, host: str, port: int, client_id: str = "strom-tests", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.client_id = client_id
        self._correlation_id = 0

    @classmethod
    def connect(cls, bootstrap: str) -> KafkaWire:
        """A connection to a ``host:port`` bootstrap address."""
        host, port = bootstrap.split(":")
        return cls(host, int(port))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode(self, request: Any, correlation_id: int | None = None) -> tuple[bytes, int]:
        api_key, version = request.__api_key__, request.__version__
        if correlation_id is None:
            self._correlation_id += 1
            correlation_id = self._correlation_id
        buf = io.BytesIO()
        client_id = self.client_id.encode()
        buf.write(struct.pack(">hhih", api_key, version, correlation_id, len(client_id)))
        buf.write(client_id)
        if is_flexible(api_key, version):
            buf.write(b"\0")
        entity_writer(type(request))(buf, request)
        body = buf.getvalue()
        return struct.pack(">i", len(body)) + body, correlation_id

    def send(self, request: Any) -> int:
        frame, correlation_id = self.encode(request)
        self.sock.sendall(frame)
        return correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self._recv_exactly(4))[0]
        return self._recv_exactly(size)

    def _recv_exactly(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self.sock.recv(n - len(chunks))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            chunks += chunk
        return bytes(chunks)

    def receive(self, request_type: type[Any], expected_correlation_id: int) -> Any:
        frame = self.recv_frame()
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        assert correlation_id == expected_correlation_id, (correlation_id, expected_correlation_id)
        api_key, version = request_type.__api_key__, request_type.__version__
        offset = 4
        if is_flexible(api_key, version) and api_key != 18:
            offset += 1  # response header v1: empty tagged fields
        response_type = load_response_schema(api_key, version)
        value, _ = entity_reader(response_type)(frame, offset)
        return value

    def request(self, request: Any) -> Any:
        return self.receive(type(request), self.send(request))

    def is_closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closed this connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    # -- one request, one topic ---------------------------------------------------------------

    def produce_partitions(
        self, topic: str, batches: Mapping[int, bytes], *, acks: int = 1
    ) -> dict[int, Any]:
        """Produce v9 of one record set per partition; each partition's response by partition index.

        ``acks`` must not be 0: the broker does not answer those (send ``produce_request`` instead).
        """
        response = self.request(produce_request(topic, batches, acks=acks))
        return {p.index: p for p in response.responses[0].partition_responses}

    def produce(self, topic: str, records: bytes, *, partition: int = 0, acks: int = 1) -> Any:
        """Produce v9 of one record set; the partition's response (error_code, base_offset, ...)."""
        return self.produce_partitions(topic, {partition: records}, acks=acks)[partition]

    def produce_ok(self, topic: str, records: bytes, *, partition: int = 0) -> int:
        """Produce v9 of one record set that must succeed; the base offset it was given."""
        result = self.produce(topic, records, partition=partition)
        assert result.error_code == ErrorCode.none, result
        offset: int = result.base_offset
        return offset

    def fetch(
        self, topic: str, offset: int, *, partition: int = 0, max_bytes: int = 1 << 20, max_wait_ms: int = 0
    ) -> Any:
        """Fetch v12 from one partition, ``max_bytes`` being its partition_max_bytes; the partition's data."""
        response = self.request(
            fetch12.FetchRequest(
                max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                min_bytes=1,
                topics=(
                    fetch12.FetchTopic(
                        topic=topic,
                        partitions=(
                            fetch12.FetchPartition(
                                partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes
                            ),
                        ),
                    ),
                ),
                forgotten_topics_data=(),
            )
        )
        (data,) = response.responses[0].partitions
        return data

    def list_offset(self, topic: str, timestamp: int, *, partition: int = 0) -> int:
        """ListOffsets v7 (LATEST, EARLIEST or a timestamp) that must succeed; the offset it names."""
        response = self.request(
            list_offsets7.ListOffsetsRequest(
                replica_id=-1,
                isolation_level=0,
                topics=(
                    list_offsets7.ListOffsetsTopic(
                        name=topic,
                        partitions=(
                            list_offsets7.ListOffsetsPartition(
                                partition_index=partition, timestamp=timestamp
                            ),
                        ),
                    ),
                ),
            )
        )
        result = response.topics[0].partitions[0]
        assert result.error_code == ErrorCode.none, result
        offset: int = result.offset
        return offset

    def create_topic(
        self, name: str, *, partitions: int = 1, configs: Mapping[str, str] | None = None
    ) -> int:
        """CreateTopics v7 of one topic with replication factor 1; the topic's error code."""
        response = self.request(
            create_topics7.CreateTopicsRequest(
                topics=(
                    create_topics7.CreatableTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=1,
                        assignments=(),
                        configs=tuple(
                            create_topics7.CreatableTopicConfig(name=k, value=v)
                            for k, v in (configs or {}).items()
                        ),
                    ),
                ),
                timeout=REQUEST_TIMEOUT,
            )
        )
        error: int = response.topics[0].error_code
        return error

    def incremental_alter_configs(self, topic: str, configs: Mapping[str, str]) -> int:
        """IncrementalAlterConfigs v1 setting each of ``configs`` on a topic; the resource's error code."""
        response = self.request(
            incremental_alter_configs1.IncrementalAlterConfigsRequest(
                resources=(
                    incremental_alter_configs1.AlterConfigsResource(
                        resource_type=TOPIC_RESOURCE,
                        resource_name=topic,
                        configs=tuple(
                            incremental_alter_configs1.AlterableConfig(
                                name=k, config_operation=CONFIG_SET, value=v
                            )
                            for k, v in configs.items()
                        ),
                    ),
                ),
                validate_only=False,
            )
        )
        error: int = response.responses[0].error_code
        return error

    def delete_records(self, topic: str, offset: int, *, partition: int = 0) -> tuple[int, int]:
        """DeleteRecords v2 up to ``offset`` (-1: the high watermark); (error code, low watermark)."""
        response = self.request(
            delete_records2.DeleteRecordsRequest(
                topics=(
                    delete_records2.DeleteRecordsTopic(
                        name=topic,
                        partitions=(
                            delete_records2.DeleteRecordsPartition(partition_index=partition, offset=offset),
                        ),
                    ),
                ),
                timeout=REQUEST_TIMEOUT,
            )
        )
        result = response.topics[0].partitions[0]
        return result.error_code, result.low_watermark

    def metadata(self, *topics: str) -> Any:
        """Metadata v12 for the named topics, which the broker may auto-create; the whole response."""
        return self.request(
            metadata12.MetadataRequest(
                topics=tuple(metadata12.MetadataRequestTopic(topic_id=ZERO_UUID, name=n) for n in topics),
                allow_auto_topic_creation=True,
                include_topic_authorized_operations=False,
            )
        )
