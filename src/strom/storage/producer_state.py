"""ProducerStateManager: idempotent-producer sequence state per producer id, with ``.snapshot`` files.

Each producer keeps its epoch and the metadata of its last five batches, so a
retried batch is recognised and answered with its original offsets. The state
is rebuilt on startup from the latest ``<offset>.snapshot`` (state of all
batches below ``offset``) plus a replay of the batches after it.
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
from strom.storage.checkpoint import fsync, fsync_dir, write_fully
from strom.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError

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


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else rb.NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_timestamp(self) -> int:
        return self.batches[-1].timestamp if self.batches else rb.NO_TIMESTAMP

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

    # --- the append path ------------------------------------------------------------

    def check_append(self, headers: Iterable[rb.BatchHeader]) -> BatchMetadata | None:
        """Validate a client append; return the original batch when it is a retry of one.

        Raises InvalidProducerEpochError for a fenced (older) epoch and
        OutOfOrderSequenceError for a gap. As in Kafka since KIP-360, a producer with
        no state here (new, or expired) may start at any sequence.
        """
        pending: dict[int, tuple[int, int]] = {}
        for header in headers:
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            entry = self._producers.get(producer_id)
            if producer_id in pending:
                epoch, last_seq = pending[producer_id]
            elif entry is not None:
                duplicate = entry.find_duplicate(header)
                if duplicate is not None:
                    return duplicate
                epoch, last_seq = entry.producer_epoch, entry.last_seq
            else:
                epoch, last_seq = rb.NO_PRODUCER_EPOCH, rb.NO_SEQUENCE
            self._check(header, epoch, last_seq)
            pending[producer_id] = (header.producer_epoch, header.last_sequence)
        return None

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
        """Record an appended (or replayed) batch; ``first_offset`` is its assigned base offset."""
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
        self.map_end_offset = first_offset + header.last_offset_delta + 1

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
        entries = b"".join(
            _SNAPSHOT_ENTRY.pack(
                entry.producer_id,
                entry.producer_epoch,
                last.last_seq,
                last.last_offset,
                last.last_offset - last.first_offset,
                last.timestamp,
                entry.coordinator_epoch,
                entry.current_txn_first_offset,
            )
            for entry in self._producers.values()
            if (last := entry.batches[-1] if entry.batches else None) is not None
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
        first_seq = (last_seq - delta) % (INT32_MAX + 1) if last_seq >= 0 else rb.NO_SEQUENCE
        entry.batches.append(
            BatchMetadata(first_seq, last_seq, last_offset - delta, last_offset, timestamp)
        )
        producers[pid] = entry
    return producers
