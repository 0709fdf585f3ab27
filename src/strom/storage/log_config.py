"""Per-topic log configuration (Kafka's topic-level configs, e.g. ``segment.bytes``)."""

from __future__ import annotations

from dataclasses import dataclass, field

LONG_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The effective configuration of one log. Attribute = Kafka topic config name with '.' -> '_'."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    file_delete_delay_ms: int = 60000
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = 3600000
    compression_type: str = "producer"
    cleanup_policy: tuple[str, ...] = field(default=("delete",))
    min_insync_replicas: int = 1
    preallocate: bool = False
