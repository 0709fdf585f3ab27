"""A partition hosted by this broker: its log plus leadership state (leader epoch, ISR, HW).

On a single node every partition is led here with ISR = {this node}; the high watermark
therefore moves to the log end offset with every append. In a cluster (``replicated``) the
partition is Kafka's Partition: as leader it tracks each follower's log end offset (LEO) and
last caught-up time, moves the HW to the smallest LEO of the ISR (never back, and only while
the ISR has at least min.insync.replicas members: Kafka 4.x, KIP-966), proposes ISR shrinks and
expansions (the replica manager writes them, one at a time), and completes acks=all produces
waiting for the HW. As follower it only holds the log its fetcher appends to, with
HW = min(leader's HW, own LEO). Invariant: the HW is at most every ISR member's LEO.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import NamedTuple

from strom.broker.control_plane.metadata import PartitionState
from strom.protocol.errors import ErrorCode
from strom.records.control import ControlRecordType
from strom.storage import (
    FetchDataInfo,
    LogAppendInfo,
    OffsetOutOfRangeError,
    StorageError,
    TimestampAndOffset,
    UnifiedLog,
)
from strom.storage.append_origin import AppendOrigin
from strom.storage.log_validator import ValidatedRecords


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class NotEnoughReplicasError(Exception):
    error_code = 19


class NotLeaderOrFollowerError(StorageError):
    """A write or delete reached a replica that does not lead the partition (a StorageError so
    that every path answering storage errors by code answers this one too)."""

    error_code = 6


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower (Kafka's remote Replica)."""

    broker_id: int
    # -1 until the follower's first fetch in this leader epoch.
    log_end_offset: int = -1
    log_start_offset: int = -1
    last_fetch_leader_log_end_offset: int = -1
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int, lag_max_ms: int) -> bool:
        return (
            self.log_end_offset >= leader_log_end_offset or now_ms - self.last_caught_up_time_ms <= lag_max_ms
        )


class Partition:
    def __init__(
        self,
        tp: TopicPartition,
        log: UnifiedLog,
        leader_epoch: int,
        isr: list[int],
        *,
        local_id: int = 0,
        replicated: bool = False,
        high_watermark: int | None = None,
    ) -> None:
        self.tp = tp
        self.log = log
        self.leader_epoch = leader_epoch
        self.isr = isr
        self.local_id = local_id
        # In a cluster: HW rules of replication, and leadership comes from apply_partition_state.
        self.replicated = replicated
        self.leader_id = -1 if replicated else local_id
        self.replicas: list[int] = list(isr)
        self.partition_epoch = 0
        self._high_watermark = -1
        self.high_watermark = (
            log.log_end_offset if high_watermark is None else min(high_watermark, log.log_end_offset)
        )
        # The first offset of this leader's epoch: a follower rejoins the ISR only past it.
        self.leader_epoch_start_offset = log.log_end_offset
        self.followers: dict[int, FollowerState] = {}
        # The ISR of an AlterPartition in flight (one at a time), None when none is.
        self.pending_isr: list[int] | None = None
        # KIP-890: producer id -> the guard of a verification in flight for its transaction's first
        # write here; a marker for the producer drops it, so a stale verification cannot append.
        self._verification_guards: dict[int, object] = {}
        # acks=all produces: each one's future (completed with its error code) and the HW it needs.
        # A waiter leaves when its future is done, also when its produce times out (cancelled).
        self._produce_waiters: dict[asyncio.Future[ErrorCode], int] = {}
        latest_epoch = log.leader_epoch_cache.latest_epoch
        if not replicated and leader_epoch >= 0 and (latest_epoch is None or latest_epoch < leader_epoch):
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
    def is_leader(self) -> bool:
        return self.leader_id == self.local_id

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
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        self._high_watermark = value
        # Transactions decided below the HW stop holding the LSO (and the cleaner's limit), on
        # leaders and followers alike, whether or not anyone reads with read_committed.
        self.log.on_high_watermark_updated(value)

    @property
    def last_stable_offset(self) -> int:
        """The first offset of an open (or decided but not yet replicated) transaction, at most the
        HW: read_committed consumers read below it."""
        return self.log.last_stable_offset(self.high_watermark)

    @property
    def high_watermark_lags_epoch_start(self) -> bool:
        """A new leader whose HW is still below the start of its epoch (Kafka's lagging-HW state
        after an election): its HW is the one it had as a follower, maybe below the old leader's,
        until the ISR's followers fetch from it."""
        return self.replicated and self.is_leader and self.high_watermark < self.leader_epoch_start_offset

    @property
    def delayed_produces(self) -> int:
        """acks=all produces waiting for the ISR here (Kafka's Produce purgatory)."""
        return len(self._produce_waiters)

    @property
    def min_insync_replicas(self) -> int:
        return self.log.config.min_insync_replicas

    # -- leadership transitions (the replica manager drives them) --------------------------------

    def make_leader(self, state: PartitionState, now_ms: int) -> bool:
        """Lead ``state``'s epoch; the epoch cache already starts it at the LEO. Returns whether the
        HW moved (the followers' LEOs are unknown in a new epoch, so rarely)."""
        new_epoch = not self.is_leader or state.leader_epoch != self.leader_epoch
        self.leader_id = self.local_id
        self._set_state(state)
        if new_epoch:
            self.leader_epoch_start_offset = self.log.log_end_offset
            # As Kafka: ISR members count as caught up now, so none is dropped before it can fetch.
            self.followers = {
                r: FollowerState(r, last_caught_up_time_ms=now_ms if r in state.isr else 0)
                for r in state.replicas
                if r != self.local_id
            }
            self.pending_isr = None
        else:
            for r in state.replicas:
                if r != self.local_id and r not in self.followers:
                    self.followers[r] = FollowerState(r)
            for r in list(self.followers):
                if r not in state.replicas:
                    del self.followers[r]
        return self.maybe_increment_high_watermark()

    def make_follower(self, state: PartitionState) -> None:
        self.leader_id = state.leader
        self._set_state(state)
        self.followers = {}
        self.pending_isr = None
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)
        self.fail_delayed_produces(ErrorCode.not_leader_or_follower)

    def _set_state(self, state: PartitionState) -> None:
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = list(state.replicas)
        self.isr = list(state.isr)

    def commit_isr(self, state: PartitionState) -> bool:
        """A written ISR change of our own (same leader and epoch); returns whether the HW moved."""
        self.partition_epoch = state.partition_epoch
        self.isr = list(state.isr)
        self.pending_isr = None
        return self.maybe_increment_high_watermark()

    # -- the leader's view of its followers -------------------------------------------------------

    def update_follower_fetch_state(
        self, replica_id: int, fetch_offset: int, follower_log_start_offset: int, now_ms: int, leader_leo: int
    ) -> bool:
        """A follower fetched at ``fetch_offset`` (its LEO) when our LEO was ``leader_leo``
        (Kafka's updateFollowerFetchState). Returns whether the HW moved. False if it is not a
        replica of this partition."""
        follower = self.followers.get(replica_id)
        if follower is None:
            return False
        if fetch_offset >= leader_leo:
            follower.last_caught_up_time_ms = now_ms
        elif fetch_offset >= follower.last_fetch_leader_log_end_offset:
            # It reached what the leader had at its previous fetch: caught up as of then.
            follower.last_caught_up_time_ms = max(
                follower.last_caught_up_time_ms, follower.last_fetch_time_ms
            )
        follower.log_end_offset = fetch_offset
        follower.log_start_offset = follower_log_start_offset
        follower.last_fetch_leader_log_end_offset = leader_leo
        follower.last_fetch_time_ms = now_ms
        return self.maybe_increment_high_watermark()

    def isr_expansion(self, replica_id: int) -> list[int] | None:
        """The ISR with ``replica_id``, which just fetched, if it is out of the ISR and caught up to
        the HW within this leader's epoch (Kafka's maybeExpandIsr: only the fetching follower
        joins, never one whose last position merely happens to be high enough)."""
        if not self.is_leader or self.pending_isr is not None or replica_id in self.isr:
            return None
        follower = self.followers.get(replica_id)
        if follower is None:
            return None
        if (
            follower.log_end_offset >= self.high_watermark
            and follower.log_end_offset >= self.leader_epoch_start_offset
        ):
            return [*self.isr, replica_id]
        return None

    def isr_shrink(self, now_ms: int, lag_max_ms: int) -> list[int] | None:
        """The ISR without its members not caught up for ``lag_max_ms``, if any (never the leader)."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        leader_leo = self.log.log_end_offset
        lagging = {
            r
            for r in self.isr
            if r != self.local_id
            and (f := self.followers.get(r)) is not None
            and not f.is_caught_up(leader_leo, now_ms, lag_max_ms)
        }
        return [r for r in self.isr if r not in lagging] if lagging else None

    def _maximal_isr(self) -> set[int]:
        # While a change is in flight, the larger of both ISRs bounds the HW (Kafka's maximalIsr).
        return set(self.isr) | set(self.pending_isr or ())

    def maybe_increment_high_watermark(self) -> bool:
        """HW = min LEO over the (maximal) ISR, never backwards (an unknown LEO, -1, holds it); in a
        cluster only while the ISR holds min.insync.replicas. Completes delayed produces it lets
        through. Returns whether it moved."""
        if not self.is_leader:
            return False
        new_hw = self.log.log_end_offset
        if self.replicated:
            if len(self.isr) < self.min_insync_replicas:
                return False
            maximal = self._maximal_isr()
            for follower in self.followers.values():
                if follower.broker_id in maximal:
                    new_hw = min(new_hw, follower.log_end_offset)
        if new_hw <= self.high_watermark:
            return False
        self.high_watermark = new_hw
        self._complete_delayed_produces()
        return True

    # -- acks=all ------------------------------------------------------------------------------

    def wait_for_high_watermark(self, required_offset: int) -> asyncio.Future[ErrorCode]:
        """A future completed when the HW reaches ``required_offset`` (the last offset of an
        acks=all append + 1) with NONE or NOT_ENOUGH_REPLICAS_AFTER_APPEND, or with
        NOT_LEADER_OR_FOLLOWER when leadership is lost first (Kafka's DelayedProduce)."""
        future: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
        outcome = self._produce_outcome(required_offset)
        if outcome is not None:
            future.set_result(outcome)
        else:
            self._produce_waiters[future] = required_offset
            future.add_done_callback(self._forget_produce_waiter)
        return future

    def _forget_produce_waiter(self, future: asyncio.Future[ErrorCode]) -> None:
        self._produce_waiters.pop(future, None)

    @property
    def delayed_produce_count(self) -> int:
        """acks=all produces waiting for the HW (Kafka's delayed produce purgatory size)."""
        return len(self._produce_waiters)

    def _produce_outcome(self, required_offset: int) -> ErrorCode | None:
        if not self.is_leader:
            return ErrorCode.not_leader_or_follower
        if self.high_watermark < required_offset:
            return None
        if len(self.isr) < self.min_insync_replicas:
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    def _complete_delayed_produces(self) -> None:
        for future, required in list(self._produce_waiters.items()):
            outcome = self._produce_outcome(required)
            if outcome is not None and not future.done():
                future.set_result(outcome)
                del self._produce_waiters[future]

    def fail_delayed_produces(self, error: ErrorCode) -> None:
        waiters, self._produce_waiters = self._produce_waiters, {}
        for future in waiters:
            if not future.done():
                future.set_result(error)

    # -- reads and writes ---------------------------------------------------------------------

    def append_records_to_leader(
        self,
        records: bytes | memoryview,
        required_acks: int,
        validated: ValidatedRecords | None = None,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> LogAppendInfo:
        if not self.is_leader:
            raise NotLeaderOrFollowerError(f"this broker is not the leader of partition {self.tp}")
        min_isr = self.min_insync_replicas
        if required_acks == -1 and len(self.isr) < min_isr:
            raise NotEnoughReplicasError(
                f"The size of the current ISR {self.isr} is insufficient to satisfy "
                f"the min.isr requirement of {min_isr} for partition {self.tp}"
            )
        info = self.log.append_as_leader(records, self.leader_epoch, validated, origin)
        if self.replicated:
            # A leader alone in its ISR commits its own append (if min.insync allows).
            self.maybe_increment_high_watermark()
        else:
            # The HW is the minimum LEO over the ISR; with ISR = {leader} that is the leader's LEO.
            self.high_watermark = self.log.log_end_offset
        return info

    def start_verification(self, producer_id: int) -> object | None:
        """A guard for verifying the producer's first transactional write here with its
        coordinator; None when the producer already has a transaction open here (verified)."""
        entry = self.log.producer_state.last_entry(producer_id)
        if entry is not None and entry.current_txn_first_offset >= 0:
            return None
        guard = self._verification_guards[producer_id] = object()
        return guard

    def end_verification(self, producer_id: int, guard: object) -> bool:
        """Whether the verification ``guard`` still holds (no marker for the producer since);
        the guard is dropped either way."""
        if self._verification_guards.get(producer_id) is guard:
            del self._verification_guards[producer_id]
            return True
        entry = self.log.producer_state.last_entry(producer_id)
        return entry is not None and entry.current_txn_first_offset >= 0

    def append_marker_to_leader(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, marker: ControlRecordType
    ) -> LogAppendInfo:
        """A transaction coordinator's COMMIT or ABORT marker, written as acks=all writes are
        (Kafka appends markers with acks=-1): refused below min.insync.replicas."""
        if not self.is_leader:
            raise NotLeaderOrFollowerError(f"this broker is not the leader of partition {self.tp}")
        min_isr = self.min_insync_replicas
        if len(self.isr) < min_isr:
            raise NotEnoughReplicasError(
                f"The size of the current ISR {self.isr} is insufficient to satisfy "
                f"the min.isr requirement of {min_isr} for partition {self.tp}"
            )
        info = self.log.append_transaction_marker(
            producer_id, producer_epoch, coordinator_epoch, marker, self.leader_epoch
        )
        self._verification_guards.pop(producer_id, None)
        if self.replicated:
            self.maybe_increment_high_watermark()
        else:
            self.high_watermark = self.log.log_end_offset
        return info

    async def append_records_as_follower(self, records: bytes) -> LogAppendInfo | None:
        """Append the leader's batches: inline (a new leader epoch is recorded in memory, and
        written by the log's next flush), or on the log's I/O executor when a truncation is still
        queued there."""
        log_ = self.log
        if log_.io.busy:  # a truncation first: the records are checked against the log it leaves
            return await asyncio.wrap_future(log_.io.submit(log_.append_as_follower, records))
        analyzed = log_.analyze_follower_records(records)
        if analyzed is None:
            return None
        return log_.append_analyzed_as_follower(analyzed)

    def update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        """A follower's HW is the leader's, bounded by what it holds itself; it only moves up here
        (a new leader may answer with a HW it has not caught up to yet), down only by truncation."""
        self.high_watermark = max(self.high_watermark, min(leader_high_watermark, self.log.log_end_offset))

    async def truncate_to(self, offset: int) -> None:
        """Follower truncation (diverging epochs): the log and epoch cache end at ``offset``. It
        unlinks segments, fsyncs the epoch checkpoint and replays producer state: on the log's
        I/O executor."""
        await asyncio.wrap_future(self.log.io.submit(self.log.truncate_to, offset))
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    async def truncate_fully_and_start_at(self, offset: int) -> None:
        """Restart the log empty at ``offset`` (a follower behind its leader's log start), on
        the log's I/O executor."""
        await asyncio.wrap_future(self.log.io.submit(self.log.truncate_fully_and_start_at, offset))
        self.high_watermark = offset

    def diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """KIP-320 on the leader: where a follower's log, which ends at ``fetch_offset`` in
        ``last_fetched_epoch``, leaves ours: (epoch, end offset) when it does, else None."""
        if last_fetched_epoch < 0:
            return None
        epoch, end_offset = self.log.leader_epoch_cache.end_offset_for(
            last_fetched_epoch, self.log.log_end_offset
        )
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def read_records(
        self,
        fetch_offset: int,
        max_bytes: int,
        min_one_batch: bool,
        up_to_log_end: bool = False,
        read_committed: bool = False,
    ) -> FetchDataInfo:
        """Consumers read below the HW (read_committed ones below the LSO); followers
        (``up_to_log_end``) up to the LEO."""
        if up_to_log_end:
            return self.log.read(fetch_offset, max_bytes, None, min_one_batch)
        limit = self.last_stable_offset if read_committed else self.high_watermark
        if fetch_offset > limit and fetch_offset <= self.log.log_end_offset:
            # Between the limit and the LEO: nothing visible yet, but not out of range.
            return FetchDataInfo(fetch_offset, b"")
        return self.log.read(fetch_offset, max_bytes, limit, min_one_batch)

    def aborted_transactions(self, fetch_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read_committed read from
        ``fetch_offset`` may overlap: every one ending at or after it and starting below the LSO."""
        return [
            (txn.producer_id, txn.first_offset)
            for txn in self.log.collect_aborted_transactions(fetch_offset, self.last_stable_offset)
        ]

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
        if not self.is_leader:
            raise NotLeaderOrFollowerError(f"this broker is not the leader of partition {self.tp}")
        if offset == -1:
            offset = self.high_watermark
        if offset < 0 or offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"Cannot increment the log start offset to {offset} of partition {self.tp} "
                f"since it is larger than the high watermark {self.high_watermark}"
            )
        return self.log.delete_records(offset)
