"""Source offsets as Spark checkpoints them, and the starting/ending offset specs of the options.

A source offset is one position per topic partition, serialized as Spark's Kafka
connector does: ``{"topic": {"0": 42, "1": 17}}``. Spark compares serialized offsets as
strings to tell whether new data arrived, so the JSON must have one key order for equal
offsets: topics sorted by name, partitions by number (JSON object keys are strings, so
they come back from a checkpoint as "0", "1", ...).

A stream's offsets also say where they were taken: the cluster's id and each topic's id,
under keys no topic can have (``@`` is not a legal character of a topic name), so that a
checkpoint reused against another cluster, or a topic deleted and created again, is refused
(``check_origin``) instead of read as offsets that mean something else there.

The specs mirror the connector's options: ``earliest``, ``latest``, per-partition JSON
where -2 means earliest and -1 latest, and timestamps (one for every partition, or per
partition), resolved to offsets by the broker's ListOffsets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strom.client.cluster import TopicPartition

EARLIEST = -2
LATEST = -1

PartitionOffsets = dict[TopicPartition, int]


CLUSTER_KEY = "@cluster"
TOPIC_IDS_KEY = "@topicIds"


class OffsetsFormatError(ValueError):
    """An offsets option or checkpointed offset that is not ``{"topic": {"partition": n}}``."""


class CheckpointMismatchError(ValueError):
    """A query's checkpointed offsets were taken on another cluster, or on a topic that has
    since been deleted and created again."""


@dataclass(frozen=True)
class StreamOffset:
    """A stream's source offset: positions, and the cluster and topic ids they belong to
    (None and empty in a checkpoint written before offsets carried them)."""

    offsets: PartitionOffsets
    cluster_id: str | None = None
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(to_json_dict(self.offsets))
        if self.cluster_id is not None:
            out[CLUSTER_KEY] = self.cluster_id
        ids = {topic: self.topic_ids[topic] for topic in sorted(self.topic_ids)}
        if ids:
            out[TOPIC_IDS_KEY] = ids
        return out

    @classmethod
    def from_json_dict(cls, value: Any, what: str = "offsets") -> StreamOffset:
        value = _json_object(value, what)
        positions = {k: v for k, v in value.items() if k not in (CLUSTER_KEY, TOPIC_IDS_KEY)}
        cluster = value.get(CLUSTER_KEY)
        ids = value.get(TOPIC_IDS_KEY) or {}
        if not (cluster is None or isinstance(cluster, str)) or not isinstance(ids, dict):
            raise OffsetsFormatError(f"{what}: malformed {CLUSTER_KEY} or {TOPIC_IDS_KEY} ({value!r})")
        return cls(from_json_dict(positions, what), cluster, {str(k): str(v) for k, v in ids.items()})


def check_origin(checkpointed: StreamOffset, cluster_id: str | None, topic_ids: Mapping[str, str], where: str) -> None:
    """Refuse offsets taken on another cluster, or on an earlier topic of the same name.

    ``where`` names the cluster being read (its bootstrap servers). Offsets without ids (an
    older checkpoint) and a cluster that reports no id are taken as they are."""
    fix = (
        "Give the query a new checkpointLocation (or delete the old checkpoint) to start over, "
        "or point it at the cluster the checkpoint belongs to."
    )
    if checkpointed.cluster_id is not None and cluster_id and checkpointed.cluster_id != cluster_id:
        raise CheckpointMismatchError(
            f"the query's checkpoint was taken on Kafka cluster {checkpointed.cluster_id}, but {where} is "
            f"cluster {cluster_id}: its offsets mean nothing there. {fix}"
        )
    for topic, then in sorted(checkpointed.topic_ids.items()):
        now = topic_ids.get(topic)
        if now is not None and now != then:
            raise CheckpointMismatchError(
                f"topic {topic!r} was deleted and created again since the query's checkpoint was taken "
                f"(topic id {then} then, {now} now): its offsets mean nothing in the new topic. {fix}"
            )


def _json_object(value: Any, what: str) -> dict[str, Any]:
    """A JSON object, given as a dict or as its text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise OffsetsFormatError(f"{what} is not JSON: {error}") from error
    if not isinstance(value, dict):
        raise OffsetsFormatError(f'{what} must be a JSON object like {{"topic": {{"0": 23}}}}, got {value!r}')
    return value


def to_json_dict(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """The checkpoint form, in the stable key order."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def from_json_dict(value: Any, what: str = "offsets") -> PartitionOffsets:
    """Parse ``{"topic": {"partition": n}}`` (a dict, or its JSON text)."""
    value = _json_object(value, what)
    out: PartitionOffsets = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            raise OffsetsFormatError(f'{what} for topic {topic!r} must be an object like {{"0": 23}}')
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except ValueError as error:
                raise OffsetsFormatError(f"{what}: {partition!r} of topic {topic!r} is not a partition") from error
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise OffsetsFormatError(f"{what}: offset {offset!r} of {topic}-{number} is not an integer")
            out[TopicPartition(topic, number)] = offset
    return out


def assignment_from_json(text: str) -> list[TopicPartition]:
    """The ``assign`` option: ``{"topicA": [0, 1], "topicB": [2]}``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise OffsetsFormatError(f'option "assign" is not JSON: {error}') from error
    if not isinstance(value, dict) or not all(
        isinstance(parts, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in parts)
        for parts in value.values()
    ):
        raise OffsetsFormatError(f'option "assign" must be like {{"topicA": [0, 1], "topicB": [2]}}, got {text!r}')
    return sorted({TopicPartition(topic, p) for topic, parts in value.items() for p in parts})


@dataclass(frozen=True)
class OffsetRangeLimit:
    """Where a query starts or a batch read ends.

    ``kind`` is "earliest", "latest", "offsets" (``offsets`` per partition, -2/-1 for
    earliest/latest), "timestamps" (``timestamps`` per partition, in ms) or "timestamp"
    (``timestamp`` for every partition). ``strategy`` says what a timestamp with no
    offset at or after it resolves to: "error" fails, "latest" takes the end offset.
    """

    kind: str
    offsets: tuple[tuple[TopicPartition, int], ...] = ()
    timestamps: tuple[tuple[TopicPartition, int], ...] = ()
    timestamp: int = 0
    strategy: str = "error"

    @classmethod
    def earliest(cls) -> OffsetRangeLimit:
        return cls("earliest")

    @classmethod
    def latest(cls) -> OffsetRangeLimit:
        return cls("latest")

    @classmethod
    def specific(cls, offsets: Mapping[TopicPartition, int]) -> OffsetRangeLimit:
        return cls("offsets", offsets=tuple(sorted(offsets.items())))

    @classmethod
    def by_timestamp(cls, timestamps: Mapping[TopicPartition, int], strategy: str) -> OffsetRangeLimit:
        return cls("timestamps", timestamps=tuple(sorted(timestamps.items())), strategy=strategy)

    @classmethod
    def global_timestamp(cls, timestamp: int, strategy: str) -> OffsetRangeLimit:
        return cls("timestamp", timestamp=timestamp, strategy=strategy)
