"""Kafka's Admin API: AdminClient (blocking) and AsyncAdminClient (asyncio), with their data classes."""

from strom.client.admin.client import AsyncAdminClient
from strom.client.admin.sync import AdminClient
from strom.client.admin.types import (
    AlterConfigOp,
    AlterConfigOpType,
    ClusterDescription,
    ConfigEntry,
    ConfigResource,
    ConfigResourceType,
    ConfigSource,
    ElectionType,
    GroupDescription,
    GroupListing,
    ListOffsetsResult,
    MemberDescription,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    PartitionInfo,
    PartitionReassignment,
    TopicDescription,
    TopicPartitionReplica,
)

__all__ = [
    "AdminClient",
    "AlterConfigOp",
    "AlterConfigOpType",
    "AsyncAdminClient",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigResource",
    "ConfigResourceType",
    "ConfigSource",
    "ElectionType",
    "GroupDescription",
    "GroupListing",
    "ListOffsetsResult",
    "MemberDescription",
    "NewPartitions",
    "NewTopic",
    "OffsetSpec",
    "PartitionInfo",
    "PartitionReassignment",
    "TopicDescription",
    "TopicPartitionReplica",
]
