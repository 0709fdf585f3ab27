"""A partition hosted by this broker: its log plus leadership state (leader epoch, ISR, HW).

On a single node every partition is led here with ISR = {this node}; the high
watermark therefore moves to the log end offset with every append, and the
invariant HW <= LEO holds by construction. Consumers are served only below HW.
"""

from __future__ import annotations

from typing import NamedTuple

from strom.protocol.errors import ErrorCode
from strom.storage import FetchDataInfo, Log, LogAppendInfo, OffsetOutOfRangeError, TimestampAndOffset
from strom.storage.log_validator import ValidatedRecords


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class NotEnoughReplicasError(Exception):
    error_code = 19


class Partition:
    def __init__(self, tp: TopicPartition, log: Log, leader_epoch: int, isr: list[int]) -> None:
        self.tp = tp
        self.log = log
        self.leader_epoch = leader_epoch
        self.isr = isr
        self.high_watermark = log.log_end_offset
        if log.leader_epoch_cache.latest_epoch is None or log.leader_epoch_cache.latest_epoch < leader_epoch:
            try:
                log.leader_epoch_cache.assign(leader_epoch, log.log_end_offset)
            except OSError as e:  # its checkpoint file could not be written
                raise log.log_dir_failed("recording the leader epoch", e) from e

    def leader_epoch_error(self, current_leader_epoch: int) -> ErrorCode | None:
        """Kafka's check of a client's view of the leader epoch (-1: the client does not know it)."""
        if current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch:
            return None
        if current_leader_epoch > self.leader_epoch:
            return ErrorCode.unknown_leader_epoch  # the client is ahead: retry after metadata catches up
        return ErrorCode.fenced_leader_epoch

    @property
    def offline(self) -> bool:
        """The log's dir failed an I/O operation (Kafka then answers KAFKA_STORAGE_ERROR)."""
        return self.log.offline

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        # No transactions yet: every record below the HW is stable.
        return self.high_watermark

    def append_records_to_leader(
        self, records: bytes | memoryview, required_acks: int, validated: ValidatedRecords | None = None
    ) -> LogAppendInfo:
        min_isr = self.log.config.min_insync_replicas
        if required_acks == -1 and len(self.isr) < min_isr:
            raise NotEnoughReplicasError(
                f"The size of the current ISR {self.isr} is insufficient to satisfy "
                f"the min.isr requirement of {min_isr} for partition {self.tp}"
            )
        info = self.log.append_as_leader(records, self.leader_epoch, validated)
        self._maybe_increment_high_watermark()
        return info

    def _maybe_increment_high_watermark(self) -> None:
        # The HW is the minimum LEO over the ISR; with ISR = {leader} that is the leader's LEO.
        self.high_watermark = self.log.log_end_offset

    def read_records(self, fetch_offset: int, max_bytes: int, min_one_batch: bool) -> FetchDataInfo:
        if fetch_offset > self.high_watermark and fetch_offset <= self.log.log_end_offset:
            # Between HW and LEO: nothing visible yet, but not out of range.
            return FetchDataInfo(fetch_offset, b"")
        return self.log.read(fetch_offset, max_bytes, self.high_watermark, min_one_batch)

    def fetch_offset_for_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        found = self.log.fetch_offset_by_timestamp(timestamp)
        if timestamp == -1:
            # "latest" means the high watermark for consumers, not the LEO.
            return TimestampAndOffset(-1, self.high_watermark, self.leader_epoch)
        if timestamp >= 0 and found is not None and found.offset >= self.high_watermark:
            # A lookup by time never answers with an offset consumers cannot read yet.
            return None
        return found

    def delete_records_on_leader(self, offset: int) -> int:
        """Advance the log start offset to ``offset`` (-1 = the high watermark); returns the new low watermark."""
        if offset == -1:
            offset = self.high_watermark
        if offset < 0 or offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"Cannot increment the log start offset to {offset} of partition {self.tp} "
                f"since it is larger than the high watermark {self.high_watermark}"
            )
        return self.log.delete_records(offset)
