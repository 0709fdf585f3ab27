"""The APIs Strom serves and their version ranges (Apache Kafka 4.1's, for every API implemented).

An API is listed here only once a handler implements it: ApiVersions advertises
exactly this table, so a client never sees an API it cannot use.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import load_payload_module, load_response_schema
from kio.static.constants import EntityType


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75


@dataclass(frozen=True, slots=True)
class VersionRange:
    min: int
    max: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.min <= version <= self.max


# Kafka 4.1's advertised ranges for the APIs Strom implements.
SUPPORTED_VERSIONS: dict[ApiKey, VersionRange] = {
    ApiKey.PRODUCE: VersionRange(0, 13),
    ApiKey.FETCH: VersionRange(4, 18),
    ApiKey.LIST_OFFSETS: VersionRange(1, 10),
    ApiKey.METADATA: VersionRange(0, 13),
    ApiKey.OFFSET_COMMIT: VersionRange(2, 9),
    ApiKey.OFFSET_FETCH: VersionRange(1, 9),
    ApiKey.FIND_COORDINATOR: VersionRange(0, 6),
    ApiKey.JOIN_GROUP: VersionRange(0, 9),
    ApiKey.HEARTBEAT: VersionRange(0, 4),
    ApiKey.LEAVE_GROUP: VersionRange(0, 5),
    ApiKey.SYNC_GROUP: VersionRange(0, 5),
    ApiKey.DESCRIBE_GROUPS: VersionRange(0, 6),
    ApiKey.LIST_GROUPS: VersionRange(0, 5),
    ApiKey.API_VERSIONS: VersionRange(0, 4),
    ApiKey.CREATE_TOPICS: VersionRange(2, 7),
    ApiKey.DELETE_TOPICS: VersionRange(1, 6),
    ApiKey.DELETE_RECORDS: VersionRange(0, 2),
    ApiKey.INIT_PRODUCER_ID: VersionRange(0, 5),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: VersionRange(2, 4),
    # Transactions as Kafka 4.1 runs the classic protocol: AddPartitionsToTxn up to the brokers'
    # verify-only batch (v4), EndTxn and AddOffsetsToTxn capped at v4 (v5 would mean KIP-890
    # part 2, whose transaction.version feature Strom does not advertise), TxnOffsetCommit too,
    # WriteTxnMarkers v1.
    ApiKey.ADD_PARTITIONS_TO_TXN: VersionRange(0, 4),
    ApiKey.ADD_OFFSETS_TO_TXN: VersionRange(0, 4),
    ApiKey.END_TXN: VersionRange(0, 4),
    ApiKey.TXN_OFFSET_COMMIT: VersionRange(0, 4),
    ApiKey.WRITE_TXN_MARKERS: VersionRange(1, 1),
    ApiKey.DESCRIBE_PRODUCERS: VersionRange(0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: VersionRange(0, 0),
    ApiKey.LIST_TRANSACTIONS: VersionRange(0, 1),
    ApiKey.DESCRIBE_CONFIGS: VersionRange(1, 4),
    ApiKey.ALTER_CONFIGS: VersionRange(0, 2),
    ApiKey.DESCRIBE_LOG_DIRS: VersionRange(1, 4),
    ApiKey.CREATE_PARTITIONS: VersionRange(0, 3),
    ApiKey.DELETE_GROUPS: VersionRange(0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: VersionRange(0, 1),
    ApiKey.OFFSET_DELETE: VersionRange(0, 0),
    ApiKey.DESCRIBE_CLUSTER: VersionRange(0, 2),
    ApiKey.LIST_CONFIG_RESOURCES: VersionRange(0, 1),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: VersionRange(0, 0),
    ApiKey.ALTER_REPLICA_LOG_DIRS: VersionRange(1, 2),
    ApiKey.ELECT_LEADERS: VersionRange(0, 2),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: VersionRange(0, 1),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: VersionRange(0, 0),
}

# Versions advertised for compatibility but refused before decoding (KIP-896: Kafka 4
# removed Produce v0-v2, yet older librdkafka needs v0 listed to pick a version at all).
REJECTED_VERSIONS: dict[ApiKey, VersionRange] = {
    ApiKey.PRODUCE: VersionRange(0, 2),
}


@cache
def request_module(api_key: int, version: int) -> ModuleType:
    """kio's generated module with the request entities of this API version."""
    module: ModuleType = load_payload_module(api_key, version, EntityType.request)
    return module


@cache
def response_module(api_key: int, version: int) -> ModuleType:
    """kio's generated module with the response entities of this API version."""
    module: ModuleType = load_payload_module(api_key, version, EntityType.response)
    return module


@cache
def request_entity(api_key: int, version: int) -> Any:
    """kio's top-level request class of this API version."""
    for value in vars(request_module(api_key, version)).values():
        if isinstance(value, type) and getattr(value, "__type__", None) == EntityType.request:
            return value
    raise LookupError(f"no request entity for api {api_key} v{version}")


@cache
def response_entity(api_key: int, version: int) -> Any:
    """kio's top-level response class of this API version."""
    return load_response_schema(api_key, version)


def is_flexible(api_key: int, version: int) -> bool:
    """Flexible versions use compact encodings and tagged fields, and header v2/v1."""
    return bool(request_entity(api_key, version).__flexible__)


def is_supported(api_key: int, version: int) -> bool:
    try:
        return version in SUPPORTED_VERSIONS[ApiKey(api_key)]
    except ValueError:
        return False
