"""Transactional batches and markers for the storage tests of transactions."""

from __future__ import annotations

from pathlib import Path

from strom.records import batch as rb
from strom.records.control import ControlRecordType
from strom.storage import LogConfig, UnifiedLog
from unit.storage.storage_batches import make_batch

COMMIT = ControlRecordType.COMMIT
ABORT = ControlRecordType.ABORT


def txn(pid: int, seq: int, count: int = 2, epoch: int = 0, value_size: int = 10) -> bytes:
    """A transactional producer's batch."""
    return make_batch(
        count,
        value_size,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        attributes=rb.TRANSACTIONAL_FLAG,
    )


def idem(pid: int, seq: int, count: int = 2, epoch: int = 0) -> bytes:
    """An idempotent (non-transactional) producer's batch."""
    return make_batch(count, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def open_log(tmp_path: Path, name: str = "t-0", **config: object) -> UnifiedLog:
    return UnifiedLog.open(tmp_path / name, LogConfig(**config))  # type: ignore[arg-type]


def crash(log: UnifiedLog) -> None:
    """Drop the log without flushing, closing or snapshotting: what kill -9 leaves behind."""
    for segment in log.segments:
        segment.close_handles()
