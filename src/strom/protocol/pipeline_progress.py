"""A Spark pipeline stage's last micro-batch, carried in the metadata of its committed offsets.

Strom's ``OffsetCommitter`` commits each finished micro-batch's end offsets to the stage's group;
the metadata string of those offsets (OffsetCommit's ``committed_metadata``, at most
``offset.metadata.max.bytes``, 4096 by default) carries the batch's progress as versioned JSON, so
anything that can send OffsetFetch (the broker's lag monitor, the console, ``kafka-consumer-groups``)
sees the stage's rows/s, batch duration, source and sink topics without reaching Spark.

The metadata string belongs to whoever commits: other clients put their own text there.
``from_metadata`` returns None for anything that is not this JSON, never raises. Readers accept
any version >= 1 that has the version-1 fields with their types (later versions only add fields).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

# The key that marks the JSON as ours, and its version.
MARKER = "strom.pipeline.progress"
VERSION = 1
# offset.metadata.max.bytes' default: what a commit may carry unless the broker allows more.
DEFAULT_MAX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class PipelineProgress:
    pipeline: str
    stage: str
    batch_id: int
    rows: int  # the batch's input rows
    input_rows_per_second: float
    processed_rows_per_second: float
    batch_duration_ms: int
    batch_end_ms: int  # when the batch finished, ms since the epoch
    sources: tuple[str, ...] = ()  # the topics the batch read (its committed partitions' topics)
    sinks: tuple[str, ...] = ()  # the topics the stage writes, when the committer knows them

    def to_metadata(self, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
        """The JSON (ASCII, so its length in bytes and in Java chars agree). Topic lists that would
        pass ``max_bytes`` (the broker's ``offset.metadata.max.bytes``) are dropped, sinks first;
        an empty string if even that does not fit."""
        for sources, sinks in ((self.sources, self.sinks), (self.sources, ()), ((), ())):
            text = json.dumps(self._as_json(sources, sinks), separators=(",", ":"), allow_nan=False)
            if len(text) <= max_bytes:
                return text
        return ""

    def _as_json(self, sources: tuple[str, ...], sinks: tuple[str, ...]) -> dict[str, Any]:
        return {
            MARKER: VERSION,
            "pipeline": self.pipeline,
            "stage": self.stage,
            "batchId": self.batch_id,
            "rows": self.rows,
            "inputRowsPerSecond": _finite(self.input_rows_per_second),
            "processedRowsPerSecond": _finite(self.processed_rows_per_second),
            "batchDurationMs": self.batch_duration_ms,
            "batchEndMs": self.batch_end_ms,
            "sources": list(sources),
            "sinks": list(sinks),
        }

    @classmethod
    def from_metadata(cls, metadata: str | None) -> PipelineProgress | None:
        """The progress in an offset's metadata, or None when the metadata is not ours (any text,
        JSON of another shape, an unknown marker, a field of the wrong type)."""
        if not metadata or not metadata.startswith("{"):
            return None
        try:
            data = json.loads(metadata)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict):
            return None
        version = _int(data.get(MARKER))
        if version is None or version < 1:
            return None
        pipeline, stage = data.get("pipeline"), data.get("stage")
        batch_id, rows = _int(data.get("batchId")), _int(data.get("rows"))
        duration, end = _int(data.get("batchDurationMs")), _int(data.get("batchEndMs"))
        input_rate, processed_rate = (
            _rate(data.get("inputRowsPerSecond")),
            _rate(data.get("processedRowsPerSecond")),
        )
        sources, sinks = _topics(data.get("sources")), _topics(data.get("sinks"))
        if (
            not isinstance(pipeline, str)
            or not isinstance(stage, str)
            or batch_id is None
            or rows is None
            or duration is None
            or end is None
            or input_rate is None
            or processed_rate is None
            or sources is None
            or sinks is None
        ):
            return None
        return cls(pipeline, stage, batch_id, rows, input_rate, processed_rate, duration, end, sources, sinks)


def _finite(value: float) -> float:
    # Spark reports NaN or infinity for rates of an empty or instant batch; JSON has neither.
    return value if math.isfinite(value) else 0.0


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rate(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _topics(value: object) -> tuple[str, ...] | None:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(topic, str) for topic in value):
        return None
    return tuple(value)
