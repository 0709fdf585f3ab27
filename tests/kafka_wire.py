"""A minimal blocking Kafka protocol client for tests that need exact control over the bytes.

Requests are kio entities; the header version follows the request's flexibility, as
real clients do. ``send_raw`` writes arbitrary bytes for hostile-input tests. The
convenience methods below send one request about one topic and return the part of the
answer a test reads, usually the single partition's result.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import socket
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
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
    def __init__(
        self,
        host: str,
        port: int,
        client_id: str = "strom-tests",
        timeout: float = 10.0,
        *,
        local_host: str | None = None,
    ) -> None:
        """``local_host``: the address to connect from (e.g. a broker's, to pose as it)."""
        source = (local_host, 0) if local_host is not None else None
        self.sock = socket.create_connection((host, port), timeout=timeout, source_address=source)
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

    def list_offset(self, topic: str, timestamp: int, *, partition: int = 0, isolation_level: int = 0) -> int:
        """ListOffsets v7 (LATEST, EARLIEST or a timestamp) that must succeed; the offset it names
        (LATEST with isolation level 1, read_committed, is the LSO)."""
        response = self.request(
            list_offsets7.ListOffsetsRequest(
                replica_id=-1,
                isolation_level=isolation_level,
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


# -- any version of an API -------------------------------------------------------------------


def kio_request(api: str, version: int) -> ModuleType:
    """kio's request module of ``api`` (its snake_case name, as in ``kio.schema``) at ``version``."""
    return importlib.import_module(f"kio.schema.{api}.v{version}.request")


def build_entity(entity_type: type[Any], **fields: Any) -> Any:
    """A kio entity from the fields its version has; the fields it lacks are left out.

    This lets one call describe a request for every version of an API: older versions
    simply do not carry the newer fields (a member's group_instance_id, say).
    """
    names = {f.name for f in dataclasses.fields(entity_type)}
    return entity_type(**{k: v for k, v in fields.items() if k in names})


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


class GroupWire(KafkaWire):
    """KafkaWire plus the group coordinator's APIs, each at any version kio knows.

    Every method sends one request and returns the whole response, except ``start``, which
    sends without waiting: JoinGroup and SyncGroup block in the broker until the rebalance
    step completes, so a test drives each member through its own connection.
    """

    def __enter__(self) -> GroupWire:
        return self

    def start(self, request: Any) -> Callable[[], Any]:
        """Send ``request`` now; the returned function waits for and decodes its response."""
        correlation_id = self.send(request)
        return lambda: self.receive(type(request), correlation_id)

    def find_coordinator(self, *keys: str, version: int = 6, key_type: int = 0) -> Any:
        """FindCoordinator for ``keys`` (v0-v3 take exactly one key; v4+ batch them)."""
        m = kio_request("find_coordinator", version)
        if version >= 4:
            return self.request(m.FindCoordinatorRequest(key_type=key_type, coordinator_keys=keys))
        (key,) = keys
        return self.request(build_entity(m.FindCoordinatorRequest, key=key, key_type=key_type))

    @staticmethod
    def join_group_request(
        group_id: str,
        member_id: str,
        protocols: Sequence[tuple[str, bytes]],
        *,
        version: int = 9,
        session_timeout_ms: int = 10000,
        rebalance_timeout_ms: int = 10000,
        group_instance_id: str | None = None,
        protocol_type: str = "consumer",
    ) -> Any:
        m = kio_request("join_group", version)
        return build_entity(
            m.JoinGroupRequest,
            group_id=group_id,
            session_timeout=_ms(session_timeout_ms),
            rebalance_timeout=_ms(rebalance_timeout_ms),
            member_id=member_id,
            group_instance_id=group_instance_id,
            protocol_type=protocol_type,
            protocols=tuple(m.JoinGroupRequestProtocol(name=n, metadata=md) for n, md in protocols),
        )

    def join_group(
        self, group_id: str, member_id: str, protocols: Sequence[tuple[str, bytes]], **kw: Any
    ) -> Any:
        """JoinGroup that the test expects to be answered without waiting for other members."""
        return self.request(self.join_group_request(group_id, member_id, protocols, **kw))

    @staticmethod
    def sync_group_request(
        group_id: str,
        generation_id: int,
        member_id: str,
        assignments: Mapping[str, bytes] | None = None,
        *,
        version: int = 5,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> Any:
        m = kio_request("sync_group", version)
        return build_entity(
            m.SyncGroupRequest,
            group_id=group_id,
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=group_instance_id,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignments=tuple(
                m.SyncGroupRequestAssignment(member_id=k, assignment=v)
                for k, v in (assignments or {}).items()
            ),
        )

    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        *,
        version: int = 4,
        group_instance_id: str | None = None,
    ) -> int:
        """Heartbeat; its error code."""
        m = kio_request("heartbeat", version)
        response = self.request(
            build_entity(
                m.HeartbeatRequest,
                group_id=group_id,
                generation_id=generation_id,
                member_id=member_id,
                group_instance_id=group_instance_id,
            )
        )
        error: int = response.error_code
        return error

    def leave_group(self, group_id: str, *members: tuple[str, str | None], version: int = 5) -> Any:
        """LeaveGroup of (member id, group instance id) pairs (v0-v2 take exactly one member id)."""
        m = kio_request("leave_group", version)
        if version < 3:
            ((member_id, _),) = members
            return self.request(m.LeaveGroupRequest(group_id=group_id, member_id=member_id))
        identities = tuple(
            build_entity(m.MemberIdentity, member_id=mid, group_instance_id=iid, reason=None)
            for mid, iid in members
        )
        return self.request(m.LeaveGroupRequest(group_id=group_id, members=identities))

    def offset_commit(
        self,
        group_id: str,
        offsets: Mapping[tuple[str, int], tuple[int, str | None]],
        *,
        version: int = 9,
        generation_id: int = -1,
        member_id: str = "",
        group_instance_id: str | None = None,
        retention_time_ms: int = -1,
        leader_epoch: int = -1,
    ) -> dict[tuple[str, int], int]:
        """OffsetCommit of {(topic, partition): (offset, metadata)}; each partition's error code."""
        m = kio_request("offset_commit", version)
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), (offset, metadata) in offsets.items():
            by_topic.setdefault(topic, []).append(
                build_entity(
                    m.OffsetCommitRequestPartition,
                    partition_index=partition,
                    committed_offset=offset,
                    committed_leader_epoch=leader_epoch,
                    committed_metadata=metadata,
                )
            )
        response = self.request(
            build_entity(
                m.OffsetCommitRequest,
                group_id=group_id,
                generation_id_or_member_epoch=generation_id,
                member_id=member_id,
                group_instance_id=group_instance_id,
                retention_time=_ms(retention_time_ms),
                topics=tuple(
                    m.OffsetCommitRequestTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
                ),
            )
        )
        return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}

    def offset_fetch(
        self,
        groups: Mapping[str, Mapping[str, Sequence[int]] | None],
        *,
        version: int = 9,
        require_stable: bool = False,
    ) -> Any:
        """OffsetFetch of {group: {topic: partitions} or None for all}; v1-v7 take exactly one group."""
        m = kio_request("offset_fetch", version)
        if version >= 8:
            request_groups = tuple(
                build_entity(
                    m.OffsetFetchRequestGroup,
                    group_id=group_id,
                    topics=None
                    if topics is None
                    else tuple(
                        m.OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps))
                        for t, ps in topics.items()
                    ),
                )
                for group_id, topics in groups.items()
            )
            return self.request(m.OffsetFetchRequest(groups=request_groups, require_stable=require_stable))
        ((group_id, topics),) = groups.items()
        return self.request(
            build_entity(
                m.OffsetFetchRequest,
                group_id=group_id,
                topics=None
                if topics is None
                else tuple(
                    m.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps)) for t, ps in topics.items()
                ),
                require_stable=require_stable,
            )
        )

    def describe_groups(self, *group_ids: str, version: int = 6) -> Any:
        m = kio_request("describe_groups", version)
        return self.request(
            build_entity(m.DescribeGroupsRequest, groups=group_ids, include_authorized_operations=False)
        )

    def list_groups(self, *, version: int = 5, states: Sequence[str] = (), types: Sequence[str] = ()) -> Any:
        m = kio_request("list_groups", version)
        return self.request(
            build_entity(m.ListGroupsRequest, states_filter=tuple(states), types_filter=tuple(types))
        )

    def delete_groups(self, *group_ids: str, version: int = 2) -> dict[str, int]:
        """DeleteGroups; each group's error code."""
        m = kio_request("delete_groups", version)
        response = self.request(m.DeleteGroupsRequest(groups_names=group_ids))
        return {r.group_id: r.error_code for r in response.results}

    def offset_delete(self, group_id: str, partitions: Mapping[str, Sequence[int]]) -> Any:
        m = kio_request("offset_delete", 0)
        return self.request(
            m.OffsetDeleteRequest(
                group_id=group_id,
                topics=tuple(
                    m.OffsetDeleteRequestTopic(
                        name=t,
                        partitions=tuple(m.OffsetDeleteRequestPartition(partition_index=p) for p in ps),
                    )
                    for t, ps in partitions.items()
                ),
            )
        )
