"""ProducerStateManager: idempotent-producer sequence state per producer id, transactions, and
``.snapshot`` files.

Each producer keeps its epoch and the metadata of its last five batches, so a
retried batch is recognised and answered with its original offsets. The state
is rebuilt on startup from the latest ``<offset>.snapshot`` (state of all
batches below ``offset``) plus a replay of the batches after it.

Transactions (Kafka's ProducerStateManager): a producer's first transactional batch begins one at
its offset; a COMMIT or ABORT marker ends it. Ongoing transactions are kept by first offset
(``_ongoing_txns``), and ended ones until the high watermark passes their marker
(``_unreplicated_txns``): the smallest first offset among both is the first unstable offset, below
which the last stable offset (LSO) stays. With no transaction both are empty, and the check every
fetch makes is two truth tests.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from strom.records import batch as rb
from strom.records.control import ControlRecordType, EndTxnMarker
from strom.storage.append_origin import AppendOrigin
from strom.storage.checkpoint import fsync, fsync_dir, write_fully
from strom.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
# Kafka's NUM_BATCHES_TO_RETAIN: retries of any of the last five batches are recognised.
NUM_BATCHES_TO_RETAIN = 5
SNAPSHOT_VERSION = 1
INT32_MAX = 0x7FFFFFFF

_SNAPSHOT_HEADER = struct.Struct(">hIi")  # version, crc, entry count
# producer id, epoch, last sequence, last offset, offset delta, timestamp, coordinator epoch,
# first offset of the ongoing transaction.
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
_TRANSACTIONAL = rb.TRANSACTIONAL_FLAG
# An enum member looked up through its class costs ~100 ns on CPython 3.11: once, here.
_CLIENT = AppendOrigin.CLIENT


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended: ``last_offset`` is the marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    # The epoch of the coordinator that wrote the producer's last marker (-1: none yet).
    coordinator_epoch: int = -1
    # First offset of the producer's ongoing transaction (-1: none).
    current_txn_first_offset: int = -1
    # Timestamp of the producer's last marker: a marker is activity too (expiration).
    last_marker_timestamp: int = rb.NO_TIMESTAMP

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else rb.NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_timestamp(self) -> int:
        last = self.batches[-1].timestamp if self.batches else rb.NO_TIMESTAMP
        return max(last, self.last_marker_timestamp)

    def find_duplicate(self, header: rb.BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.producer_epoch:
            return None
        for metadata in self.batches:
            if metadata.first_seq == header.base_sequence and metadata.last_seq == header.last_sequence:
                return metadata
        return None

    def add(self, epoch: int, metadata: BatchMetadata) -> None:
        if epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = epoch
        self.batches.append(metadata)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def snapshot_path(dir: Path, offset: int) -> Path:
    return dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(dir: Path) -> list[int]:
    """Offsets of the snapshot files in ``dir``, ascending."""
    offsets = []
    for path in dir.glob(f"*{SNAPSHOT_SUFFIX}"):
        stem = path.name[: -len(SNAPSHOT_SUFFIX)]
        if stem.isdigit():
            offsets.append(int(stem))
    return sorted(offsets)


class ProducerStateManager:
    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self._producers: dict[int, ProducerStateEntry] = {}
        # first offset -> producer id of each ongoing transaction, in ascending first offset: a
        # transaction begins at the log end, above every ongoing one (loading sorts).
        self._ongoing_txns: dict[int, int] = {}
        # marker offset -> first offset of each ended transaction whose marker the high watermark
        # has not passed yet, in ascending marker offset (markers are appended at the log end).
        self._unreplicated_txns: dict[int, int] = {}
        # State covers every batch below this offset.
        self.map_end_offset = 0
        # The snapshot last loaded, and the one known to be on disk durably (written with sync,
        # or loaded after a clean shutdown): a sync snapshot at that offset again is skipped.
        self._loaded_snapshot: int | None = None
        self._durable_snapshot: int | None = None

    # --- queries ------------------------------------------------------------------

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    @property
    def active_producers(self) -> dict[int, ProducerStateEntry]:
        return dict(self._producers)

    def __len__(self) -> int:
        return len(self._producers)

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest transaction that is ongoing, or ended with a marker the
        high watermark has not passed; None when there is none."""
        ongoing, unreplicated = self._ongoing_txns, self._unreplicated_txns
        if not unreplicated:
            return next(iter(ongoing)) if ongoing else None
        # Few: only markers above the high watermark.
        first = min(unreplicated.values())
        return min(first, next(iter(ongoing))) if ongoing else first

    @property
    def ongoing_transactions(self) -> list[tuple[int, int]]:
        """(first offset, producer id) of each ongoing transaction, oldest first."""
        return list(self._ongoing_txns.items())

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Transactions whose markers are now below the high watermark no longer hold the LSO."""
        unreplicated = self._unreplicated_txns
        while unreplicated:
            marker = next(iter(unreplicated))
            if marker >= high_watermark:
                break
            del unreplicated[marker]

    # --- the append path ------------------------------------------------------------

    def check_append(
        self, headers: Iterable[rb.BatchHeader], origin: AppendOrigin = AppendOrigin.CLIENT
    ) -> BatchMetadata | None:
        """Validate a leader's append, writing nothing; return the original batch when a client's
        is a retry of one.

        Raises InvalidProducerEpochError for a fenced (older) epoch, OutOfOrderSequenceError for
        a gap (CLIENT only: a coordinator's batches carry no sequences), and InvalidTxnStateError
        for a non-transactional batch, or one of another epoch, while the producer's transaction
        is ongoing. As in Kafka since KIP-360, a producer with no state here (new, or expired)
        may start at any sequence.
        """
        client = origin is _CLIENT
        # producer id -> (epoch, last sequence, in a transaction) after the batches checked so far.
        pending: dict[int, tuple[int, int, bool]] = {}
        for header in headers:
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            entry = self._producers.get(producer_id)
            if producer_id in pending:
                epoch, last_seq, in_txn = pending[producer_id]
            elif entry is not None:
                if client:
                    duplicate = entry.find_duplicate(header)
                    if duplicate is not None:
                        return duplicate
                epoch, last_seq = entry.producer_epoch, entry.last_seq
                in_txn = entry.current_txn_first_offset >= 0
            else:
                epoch, last_seq, in_txn = rb.NO_PRODUCER_EPOCH, rb.NO_SEQUENCE, False
            if client:
                self._check(header, epoch, last_seq)
            elif header.producer_epoch < epoch:
                raise InvalidProducerEpochError(
                    f"epoch {header.producer_epoch} of producer {producer_id} is older than "
                    f"the current epoch {epoch}"
                )
            transactional = header.attributes & _TRANSACTIONAL
            if in_txn and (not transactional or header.producer_epoch != epoch):
                raise InvalidTxnStateError(
                    f"producer {producer_id} has a transaction ongoing at epoch {epoch}: "
                    + (
                        f"a batch of epoch {header.producer_epoch} cannot join it"
                        if transactional
                        else "a non-transactional batch cannot join it"
                    )
                )
            pending[producer_id] = (header.producer_epoch, header.last_sequence, in_txn or transactional > 0)
        return None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Validate a coordinator's COMMIT/ABORT marker for ``producer_id`` before it is written.

        Raises InvalidProducerEpochError for an epoch older than the producer's (a fenced
        producer's transaction) and TransactionCoordinatorFencedError for a coordinator epoch
        older than the last marker's. A producer with no state here passes: its marker is written
        anyway (how a hanging or unknown transaction is aborted).
        """
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"marker epoch {producer_epoch} of producer {producer_id} is older than "
                f"the current epoch {entry.producer_epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch {coordinator_epoch}, "
                f"older than the current coordinator epoch {entry.coordinator_epoch}"
            )

    @staticmethod
    def _check(header: rb.BatchHeader, epoch: int, last_seq: int) -> None:
        producer_id, first_seq = header.producer_id, header.base_sequence
        if header.producer_epoch < epoch:
            raise InvalidProducerEpochError(
                f"epoch {header.producer_epoch} of producer {producer_id} is older than "
                f"the current epoch {epoch}"
            )
        if header.producer_epoch != epoch:
            if first_seq != 0 and epoch != rb.NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"invalid sequence {first_seq} for new epoch {header.producer_epoch} of producer "
                    f"{producer_id}: a new epoch must start at sequence 0"
                )
        elif epoch != rb.NO_PRODUCER_EPOCH and not _in_sequence(last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"out of order sequence for producer {producer_id} at epoch {epoch}: "
                f"{first_seq} (incoming) after {last_seq} (last appended)"
            )

    def update(self, header: rb.BatchHeader, first_offset: int, timestamp: int) -> None:
        """Record an appended (or replayed) data batch; ``first_offset`` is its assigned base
        offset. A producer's transactional batch outside a transaction begins one there."""
        producer_id = header.producer_id
        if producer_id >= 0:
            entry = self._producers.get(producer_id)
            if entry is None:
                entry = self._producers[producer_id] = ProducerStateEntry(producer_id, header.producer_epoch)
            entry.add(
                header.producer_epoch,
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    first_offset,
                    first_offset + header.last_offset_delta,
                    timestamp,
                ),
            )
            if header.attributes & _TRANSACTIONAL and entry.current_txn_first_offset < 0:
                entry.current_txn_first_offset = first_offset
                self._ongoing_txns[first_offset] = producer_id
        self.map_end_offset = first_offset + header.last_offset_delta + 1

    def update_marker(self, header: rb.BatchHeader, marker: EndTxnMarker) -> CompletedTxn | None:
        """Record the COMMIT/ABORT marker batch ``header`` (its offsets assigned): the producer's
        epoch and coordinator epoch. Returns the transaction it ends, None if none was ongoing; the
        caller indexes an aborted one, then ``complete_txn``s it (Kafka's order)."""
        producer_id = header.producer_id
        self.map_end_offset = header.next_offset
        if producer_id < 0:
            return None
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerStateEntry(producer_id, header.producer_epoch)
        elif header.producer_epoch != entry.producer_epoch:
            entry.batches.clear()
            entry.producer_epoch = header.producer_epoch
        entry.coordinator_epoch = marker.coordinator_epoch
        entry.last_marker_timestamp = header.max_timestamp
        first_offset = entry.current_txn_first_offset
        if first_offset < 0:
            return None
        entry.current_txn_first_offset = -1
        return CompletedTxn(
            producer_id, first_offset, header.base_offset, marker.type is ControlRecordType.ABORT
        )

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO once ``completed`` is no longer ongoing (for its transaction index entry): the
        first offset of the oldest other ongoing transaction, else just after its marker."""
        for first_offset, producer_id in self._ongoing_txns.items():
            if producer_id != completed.producer_id:
                return first_offset
        return completed.last_offset + 1

    def complete_txn(self, completed: CompletedTxn) -> None:
        """``completed`` is no longer ongoing; it holds the LSO until the high watermark passes
        its marker (``on_high_watermark_updated``)."""
        self._ongoing_txns.pop(completed.first_offset, None)
        self._unreplicated_txns[completed.last_offset] = completed.first_offset

    def advance_map_end_offset(self, offset: int) -> None:
        self.map_end_offset = max(self.map_end_offset, offset)

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> int:
        expired = [
            pid
            for pid, entry in self._producers.items()
            if entry.current_txn_first_offset < 0 and now_ms - entry.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self._producers[pid]
        return len(expired)

    # --- snapshots ------------------------------------------------------------------

    def take_snapshot(self, sync: bool = False) -> Path:
        """Write ``<map end offset>.snapshot``; sync=False leaves durability to a later flush.

        As Kafka, no offset appended since the last durable snapshot means no new one (an idle
        log's close writes nothing); the state may differ only by expired producers."""
        path = snapshot_path(self.dir, self.map_end_offset)
        if sync and self._durable_snapshot == self.map_end_offset and path.exists():
            return path
        # A producer whose last write was a marker may have no batch: last offset -1, as Kafka.
        entries = b"".join(
            _SNAPSHOT_ENTRY.pack(
                entry.producer_id,
                entry.producer_epoch,
                last.last_seq if last is not None else rb.NO_SEQUENCE,
                last.last_offset if last is not None else -1,
                last.last_offset - last.first_offset if last is not None else 0,
                entry.last_timestamp,
                entry.coordinator_epoch,
                entry.current_txn_first_offset,
            )
            for entry in self._producers.values()
            for last in (entry.batches[-1] if entry.batches else None,)
        )
        count = len(entries) // _SNAPSHOT_ENTRY.size
        body = struct.pack(">i", count) + entries
        crc = crc32c.crc32c(body)
        data = struct.pack(">hI", SNAPSHOT_VERSION, crc) + body
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_fully(fd, data)
            if sync:
                fsync(fd)
        finally:
            os.close(fd)
        self._durable_snapshot = None
        os.replace(tmp, path)
        if sync:
            fsync_dir(self.dir)  # (deferred to the caller within deferred_dir_syncs)
            self._durable_snapshot = self.map_end_offset
        return path

    def mark_snapshot_durable(self) -> None:
        """The snapshot just loaded is on disk durably (the log dir was shut down cleanly)."""
        self._durable_snapshot = self._loaded_snapshot

    def load(self, log_start_offset: int, log_end_offset: int) -> int:
        """Load the newest valid snapshot at or below the log end; returns the offset to replay from.

        Snapshots beyond the log end (their data was lost or truncated) and unreadable
        ones are deleted.
        """
        self._producers = {}
        self._ongoing_txns = {}
        # Kafka clears these too: the log end after a truncation is at most the high watermark.
        self._unreplicated_txns = {}
        self.map_end_offset = log_start_offset
        self._loaded_snapshot = self._durable_snapshot = None
        for offset in reversed(snapshot_offsets(self.dir)):
            path = snapshot_path(self.dir, offset)
            if offset > log_end_offset:
                path.unlink(missing_ok=True)
                continue
            if offset < log_start_offset:
                break
            try:
                self._producers = read_snapshot(path)
            except (OSError, ValueError) as e:
                log.warning("deleting unreadable producer snapshot %s: %s", path, e)
                path.unlink(missing_ok=True)
                continue
            self.map_end_offset = self._loaded_snapshot = offset
            # The transactions the snapshot's producers had open are ongoing again.
            self._ongoing_txns = {
                entry.current_txn_first_offset: entry.producer_id
                for entry in sorted(self._producers.values(), key=lambda e: e.current_txn_first_offset)
                if entry.current_txn_first_offset >= 0
            }
            break
        return self.map_end_offset

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int) -> int:
        """After a truncation: drop snapshots outside [start, end] and reload from the rest."""
        self.delete_snapshots_before(log_start_offset)
        return self.load(log_start_offset, log_end_offset)

    def delete_snapshots_before(self, offset: int) -> None:
        for snapshot in snapshot_offsets(self.dir):
            if snapshot < offset:
                snapshot_path(self.dir, snapshot).unlink(missing_ok=True)

    def delete_snapshot(self, offset: int) -> None:
        snapshot_path(self.dir, offset).unlink(missing_ok=True)

    def latest_snapshot_offset(self) -> int | None:
        offsets = snapshot_offsets(self.dir)
        return offsets[-1] if offsets else None


def read_snapshot(path: Path) -> dict[int, ProducerStateEntry]:
    """The producers of a snapshot file; ValueError when it is not a valid snapshot."""
    data = path.read_bytes()
    if len(data) < _SNAPSHOT_HEADER.size:
        raise ValueError("snapshot shorter than its header")
    version, crc, count = _SNAPSHOT_HEADER.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported snapshot version {version}")
    if crc32c.crc32c(memoryview(data)[6:]) != crc:
        raise ValueError("snapshot CRC mismatch")
    if len(data) != _SNAPSHOT_HEADER.size + count * _SNAPSHOT_ENTRY.size:
        raise ValueError("snapshot length does not match its entry count")
    producers = {}
    for (
        pid,
        epoch,
        last_seq,
        last_offset,
        delta,
        timestamp,
        coordinator_epoch,
        txn_first,
    ) in _SNAPSHOT_ENTRY.iter_unpack(memoryview(data)[_SNAPSHOT_HEADER.size :]):
        entry = ProducerStateEntry(
            pid, epoch, coordinator_epoch=coordinator_epoch, current_txn_first_offset=txn_first
        )
        if last_offset >= 0:
            first_seq = (last_seq - delta) % (INT32_MAX + 1) if last_seq >= 0 else rb.NO_SEQUENCE
            entry.batches.append(
                BatchMetadata(first_seq, last_seq, last_offset - delta, last_offset, timestamp)
            )
        else:
            entry.last_marker_timestamp = timestamp
        producers[pid] = entry
    return producers
