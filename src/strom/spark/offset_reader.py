"""The driver's view of the topics a source reads: which partitions exist and their offsets.

Spark's Kafka connector has a KafkaOffsetReader for the same job. This one is an
AdminClient made on first use, never pickled with the reader that owns it (Spark ships
readers to executors, which have no use for it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from strom.client.admin import AdminClient, OffsetSpec
from strom.client.cluster import TopicPartition
from strom.client.errors import KafkaException
from strom.spark.offsets import EARLIEST, LATEST, OffsetRangeLimit, PartitionOffsets
from strom.spark.options import Assign, SourceOptions, Subscribe


class OffsetLookupError(KafkaException):
    """A starting timestamp with no offset at or after it, under the "error" strategy."""


class OffsetReader:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: AdminClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_admin": None}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.options.client_config("admin"))
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def partitions(self) -> set[TopicPartition]:
        """The partitions the source reads now: assigned ones, or every partition of the
        subscribed topics (that exist) or of the topics matching the pattern."""
        strategy = self.options.strategy
        if isinstance(strategy, Assign):
            return set(strategy.partitions)
        existing = set(self.admin.list_topics())
        if isinstance(strategy, Subscribe):
            topics = [t for t in strategy.topics if t in existing]
        else:
            pattern = re.compile(strategy.pattern)
            topics = sorted(t for t in existing if pattern.fullmatch(t))
        if not topics:
            return set()
        try:
            descriptions = self.admin.describe_topics(topics)
        except KafkaException:
            # A topic deleted between the two calls: the next trigger looks again.
            return set()
        return {
            TopicPartition(name, info.partition)
            for name, description in descriptions.items()
            for info in description.partitions
        }

    def earliest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list(dict.fromkeys(partitions, OffsetSpec.earliest()))

    def latest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        """End offsets: the high watermark, or the last stable offset under read_committed."""
        return self._list(dict.fromkeys(partitions, OffsetSpec.latest()))

    def resolve(
        self, limit: OffsetRangeLimit, partitions: Iterable[TopicPartition], *, starting: bool
    ) -> PartitionOffsets:
        """Offsets for ``partitions`` per a starting or ending spec.

        Partitions a specific-offsets spec does not name start at the earliest offset
        (end at the latest), as in Spark's connector.
        """
        wanted = sorted(set(partitions))
        if limit.kind == "earliest":
            return self.earliest(wanted)
        if limit.kind == "latest":
            return self.latest(wanted)
        if limit.kind == "offsets":
            given = dict(limit.offsets)
            default = EARLIEST if starting else LATEST
            specs = {tp: given.get(tp, default) for tp in wanted}
            out = {tp: offset for tp, offset in specs.items() if offset >= 0}
            earliest = [tp for tp, offset in specs.items() if offset == EARLIEST]
            latest = [tp for tp, offset in specs.items() if offset == LATEST]
            out.update(self.earliest(earliest))
            out.update(self.latest(latest))
            return out
        if limit.kind == "timestamp":
            timestamps = dict.fromkeys(wanted, limit.timestamp)
            out = {}
        else:
            given = dict(limit.timestamps)
            missing = [tp for tp in wanted if tp not in given]
            if missing and starting:
                names = ", ".join(map(str, missing))
                raise OffsetLookupError(f"startingOffsetsByTimestamp names no timestamp for {names}")
            timestamps = {tp: given[tp] for tp in wanted if tp in given}
            out = self.latest(missing)  # ending: partitions without a timestamp read to the end
        results = self.admin.list_offsets(
            {tp: OffsetSpec.for_timestamp(ts) for tp, ts in timestamps.items()},
            isolation_level=self._isolation,
        )
        unmatched = [tp for tp, result in results.items() if result.offset < 0]
        if unmatched and limit.strategy == "error":
            names = ", ".join(f"{tp} (timestamp {timestamps[tp]})" for tp in unmatched)
            raise OffsetLookupError(
                f"no offset matched the starting timestamp for {names}: no record at or after it. "
                "Set startingOffsetsByTimestampStrategy to 'latest' to start such partitions at the end"
            )
        out.update({tp: result.offset for tp, result in results.items() if result.offset >= 0})
        out.update(self.latest(unmatched))
        return out

    @property
    def _isolation(self) -> str:
        return "read_committed" if self.options.read_committed else "read_uncommitted"

    def _list(self, specs: Mapping[TopicPartition, OffsetSpec]) -> PartitionOffsets:
        if not specs:
            return {}
        results = self.admin.list_offsets(specs, isolation_level=self._isolation)
        return {tp: result.offset for tp, result in results.items()}
