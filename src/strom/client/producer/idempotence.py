"""Idempotent producer state: producer id and epoch, and sequence numbers per partition.

This follows the idempotent (non-transactional) half of Kafka's TransactionManager. A
batch gets its partition's next sequence when it is first drained and keeps it across
retries, so a retry the broker already appended is recognised as a duplicate. Batches in
flight per partition are tracked in sequence order: after a retriable error the broker
rejects every later batch as out of order, those are retried too, and the drain rule
(``should_stop_drain``) sends a retried batch only when it is the first one in flight,
which keeps the log in send order with up to five requests in flight.

When the sequence of a partition can no longer be trusted (a batch failed for good
after it was sent, OUT_OF_ORDER_SEQUENCE_NUMBER for the next expected batch,
UNKNOWN_PRODUCER_ID after the broker dropped the producer's state), the epoch is bumped
locally and that partition's sequences restart at 0; the broker accepts a higher epoch
starting at sequence 0.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from strom.client.cluster import TopicPartition
from strom.client.producer.accumulator import ProducerBatch
from strom.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
_MAX_EPOCH = 0x7FFF
_MAX_SEQUENCE = 0x7FFFFFFF


def increment_sequence(sequence: int, increment: int) -> int:
    """Sequences wrap from Int32.MAX_VALUE to 0, as DefaultRecordBatch.incrementSequence does."""
    if sequence > _MAX_SEQUENCE - increment:
        return increment - (_MAX_SEQUENCE - sequence) - 1
    return sequence + increment


@dataclass(slots=True)
class _PartitionEntry:
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    next_sequence: int = 0
    last_acked_sequence: int = -1
    # In-flight batches ordered by base sequence, with their sequences alongside for bisect.
    in_flight: list[ProducerBatch] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)

    def add(self, batch: ProducerBatch) -> None:
        index = bisect.bisect_left(self.sequences, batch.base_sequence)
        self.sequences.insert(index, batch.base_sequence)
        self.in_flight.insert(index, batch)

    def remove(self, batch: ProducerBatch) -> None:
        for index, candidate in enumerate(self.in_flight):
            if candidate is batch:
                del self.in_flight[index]
                del self.sequences[index]
                return


class IdempotenceManager:
    def __init__(self) -> None:
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self._partitions: dict[TopicPartition, _PartitionEntry] = {}
        # Partitions whose batches expired after being sent: their sequence state is unknown.
        self._unresolved: dict[TopicPartition, int] = {}
        self._rewrite_on_bump: set[TopicPartition] = set()
        self.epoch_bump_required = False

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    def set_producer_id_and_epoch(self, producer_id: int, producer_epoch: int) -> None:
        log.info("producer id %d, epoch %d", producer_id, producer_epoch)
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch

    def _entry(self, tp: TopicPartition) -> _PartitionEntry:
        entry = self._partitions.get(tp)
        if entry is None:
            entry = self._partitions[tp] = _PartitionEntry()
        return entry

    # -- draining --------------------------------------------------------------------------

    def should_stop_drain(self, first: ProducerBatch) -> bool:
        """Whether the partition's front batch must wait (Java's shouldStopDrainBatchesForPartition)."""
        if not self.has_producer_id:
            return True
        tp = first.tp
        entry = self._entry(tp)
        if not first.has_sequence:
            if entry.in_flight and self._is_stale(entry):
                # Batches of the old epoch are still out: sequence 0 of the new one would overtake them.
                return True
            if tp in self._unresolved:
                return True
        # A retried batch goes only when it is the first in flight: in effect one request at a time.
        return bool(entry.in_flight) and first.has_sequence and first.base_sequence != entry.sequences[0]

    def assign_sequence(self, batch: ProducerBatch) -> None:
        tp = batch.tp
        entry = self._entry(tp)
        if self._is_stale(entry) and not entry.in_flight:
            self._start_sequences_at_beginning(tp, entry)
        batch.set_producer_state(self.producer_id, self.producer_epoch, entry.next_sequence)
        entry.next_sequence = increment_sequence(entry.next_sequence, batch.record_count)
        entry.add(batch)

    def split(self, batch: ProducerBatch, parts: list[ProducerBatch]) -> None:
        """The parts of a split batch take its place in flight, with its sequence range divided."""
        entry = self._entry(batch.tp)
        entry.remove(batch)
        if not batch.has_sequence:
            return
        sequence = batch.base_sequence
        for part in parts:
            part.set_producer_state(batch.producer_id, batch.producer_epoch, sequence)
            sequence = increment_sequence(sequence, part.record_count)
            entry.add(part)

    def _is_stale(self, entry: _PartitionEntry) -> bool:
        return (entry.producer_id, entry.producer_epoch) != (self.producer_id, self.producer_epoch)

    def _start_sequences_at_beginning(self, tp: TopicPartition, entry: _PartitionEntry) -> None:
        sequence = 0
        for batch in entry.in_flight:
            batch.reset_producer_state(self.producer_id, self.producer_epoch, sequence)
            sequence = increment_sequence(sequence, batch.record_count)
        entry.sequences = [batch.base_sequence for batch in entry.in_flight]
        entry.producer_id = self.producer_id
        entry.producer_epoch = self.producer_epoch
        entry.next_sequence = sequence
        entry.last_acked_sequence = -1

    # -- outcomes --------------------------------------------------------------------------

    def handle_completed_batch(self, batch: ProducerBatch) -> None:
        entry = self._entry(batch.tp)
        if batch.last_sequence > entry.last_acked_sequence:
            entry.last_acked_sequence = batch.last_sequence
        entry.remove(batch)

    def handle_failed_batch(
        self, batch: ProducerBatch, error: ErrorCode | None, adjust_sequences: bool, exception: Exception | None = None
    ) -> None:
        """A batch failed for good with ``exception`` (the broker's ``error``, if it sent one).

        ``adjust_sequences``: it was certainly not appended. The exception matters to the
        transactional subclass only: it fails the transaction.
        """
        tp = batch.tp
        entry = self._partitions.get(tp)
        if entry is not None:
            entry.remove(batch)
        if not batch.has_sequence:
            return
        if error == ErrorCode.out_of_order_sequence_number:
            self.request_epoch_bump(tp)
        elif error == ErrorCode.unknown_producer_id:
            # The broker has no state for us and accepts any sequence: start this partition afresh.
            self._partitions.pop(tp, None)
            self._unresolved.pop(tp, None)
        elif adjust_sequences:
            self.request_epoch_bump(tp)

    def can_retry(self, error: ErrorCode, log_start_offset: int, batch: ProducerBatch) -> bool:
        """Java's TransactionManager.canRetry for an idempotent producer."""
        tp = batch.tp
        if error == ErrorCode.unknown_producer_id:
            if log_start_offset == -1 or batch.sequence_reset:
                return True
            # The log's head (and with it our producer state) was removed, or the state was lost:
            # either way a new epoch starting at sequence 0 is accepted.
            self.request_epoch_bump(tp)
            return True
        if error == ErrorCode.out_of_order_sequence_number:
            unresolved = tp in self._unresolved
            if not unresolved and (batch.sequence_reset or not self._is_next_sequence(tp, batch.base_sequence)):
                # Not the next batch the broker expects: an earlier one failed and is being retried.
                return True
            if not unresolved or self._unresolved.get(tp) == batch.base_sequence:
                # A real gap in the sequence: bump the epoch.
                self.request_epoch_bump(tp)
            return True
        return bool(error.retriable)

    def _is_next_sequence(self, tp: TopicPartition, sequence: int) -> bool:
        return sequence - self._entry(tp).last_acked_sequence == 1

    def request_epoch_bump(self, tp: TopicPartition) -> None:
        self.epoch_bump_required = True
        self._rewrite_on_bump.add(tp)

    def mark_sequence_unresolved(self, batch: ProducerBatch) -> None:
        next_sequence = batch.last_sequence + 1
        self._unresolved[batch.tp] = max(self._unresolved.get(batch.tp, next_sequence), next_sequence)

    def maybe_resolve_sequences(self) -> None:
        """Once no batch of an unresolved partition is in flight: fine if the acks caught up, else bump."""
        for tp in list(self._unresolved):
            entry = self._entry(tp)
            if entry.in_flight:
                continue
            if not self._is_next_sequence(tp, entry.next_sequence):
                log.info("%s: batches expired unacknowledged; bumping the epoch to reset its sequences", tp)
                self.request_epoch_bump(tp)
            del self._unresolved[tp]

    def bump_epoch_if_needed(self) -> None:
        """Apply a requested epoch bump (a new producer id once the epoch is exhausted)."""
        if not self.epoch_bump_required:
            return
        if self.producer_epoch >= _MAX_EPOCH:
            self.producer_id = NO_PRODUCER_ID
            self.producer_epoch = NO_PRODUCER_EPOCH
        else:
            self.producer_epoch += 1
            log.info("bumped producer epoch to %d", self.producer_epoch)
        for tp in self._rewrite_on_bump:
            entry = self._partitions.get(tp)
            if entry is not None:
                self._start_sequences_at_beginning(tp, entry)
            self._unresolved.pop(tp, None)
        self._rewrite_on_bump.clear()
        self.epoch_bump_required = False
