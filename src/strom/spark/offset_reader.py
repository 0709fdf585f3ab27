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
        return self.describe()[0]

    def describe(self) -> tuple[set[TopicPartition], dict[str, str]]:
        """The partitions the source reads now, and the ids of the existing topics they are in."""
        strategy = self.options.strategy
        existing = set(self.admin.list_topics())
        if isinstance(strategy, Assign):
            topics = sorted({tp.topic for tp in strategy.partitions} & existing)
        elif isinstance(strategy, Subscribe):
            topics = [t for t in strategy.topics if t in existing]
        else:
            pattern = re.compile(strategy.pattern)
            topics = sorted(t for t in existing if pattern.fullmatch(t))
        try:
            descriptions = self.admin.describe_topics(topics) if topics else {}
        except KafkaException:
            # A topic deleted between the two calls: the next trigger looks again.
            descriptions = {}
        ids = {name: str(d.topic_id) for name, d in descriptions.items() if d.topic_id is not None}
        if isinstance(strategy, Assign):
            return set(strategy.partitions), ids
        partitions = {
            TopicPartition(name, info.partition)
            for name, description in descriptions.items()
            for info in description.partitions
        }
        return partitions, ids

    def cluster_id(self) -> str | None:
        return self.admin.describe_cluster().cluster_id

    def earliest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list(dict.fromkeys(partitions, OffsetSpec.earliest()))

    def latest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        """End offsets: the high watermark, or the last stable offset under read_committed."""
        return self._list(dict.fromkeys(partitions, OffsetSpec.latest()))

    def resolve(
        self, limit: OffsetRangeLimit, partitions: Iterable[TopicPartition], *, starting: bool
    ) -> PartitionOffsets:
        """Offsets for ``partitions`` per a starting or ending spec.

        A spec of offsets or timestamps per partition must name exactly the partitions the
        source reads, as in Spark's connector (-2 and -1 say earliest and latest).
        """
        wanted = sorted(set(partitions))
        if limit.kind in ("offsets", "timestamps"):
            given_tps = {tp for tp, _ in (limit.offsets if limit.kind == "offsets" else limit.timestamps)}
            if given_tps != set(wanted):
                raise OffsetLookupError(_not_all_partitions(limit.kind, starting, given_tps, wanted))
        if limit.kind == "earliest":
            return self.earliest(wanted)
        if limit.kind == "latest":
            return self.latest(wanted)
        if limit.kind == "offsets":
            specs = dict(limit.offsets)
            out = {tp: offset for tp, offset in specs.items() if offset >= 0}
            earliest = [tp for tp, offset in specs.items() if offset == EARLIEST]
            latest = [tp for tp, offset in specs.items() if offset == LATEST]
            out.update(self.earliest(earliest))
            out.update(self.latest(latest))
            return out
        timestamps = dict.fromkeys(wanted, limit.timestamp) if limit.kind == "timestamp" else dict(limit.timestamps)
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
        out = {tp: result.offset for tp, result in results.items() if result.offset >= 0}
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


def _not_all_partitions(
    kind: str, starting: bool, given: set[TopicPartition], assigned: list[TopicPartition]
) -> str:
    option = ("starting" if starting else "ending") + ("Offsets" if kind == "offsets" else "OffsetsByTimestamp")
    missing = sorted(set(assigned) - given)
    extra = sorted(given - set(assigned))
    what = "; ".join(
        part
        for part in (
            f"it does not name {', '.join(map(str, missing))}" if missing else "",
            f"the source does not read {', '.join(map(str, extra))}" if extra else "",
        )
        if part
    )
    hint = " Use -1 for latest, -2 for earliest." if kind == "offsets" else ""
    return (
        f"option '{option}' must name every partition the source reads, and no other ({what}).{hint} "
        f"Specified: {', '.join(map(str, sorted(given)))}; assigned: {', '.join(map(str, assigned)) or 'none'}"
    )
