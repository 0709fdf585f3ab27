"""Loading a coordinator's state from its partition of an internal topic without stalling the loop.

A broker that becomes leader of a ``__consumer_offsets`` partition replays the whole partition
(about 7 µs a record in Python; 200,000 records would hold the event loop for over a second).
``CoordinatorLoader`` reads the partition on the event loop in slices of ``LOAD_SLICE_BYTES`` (a
read costs what a consumer's fetch does, and the log's segments belong to the loop's thread, see
storage.local_log) and decodes and replays each slice on a worker thread of its own, which pauses
briefly every couple of milliseconds so the loop takes the GIL back at once. The caller's
``is_current`` (the coordinator still expects this load: same partition, same leader epoch) is
checked on the loop before every slice and before the result is handed back; a stale load stops
and returns None, so the caller adopts only what the current leadership loaded. Meanwhile the
caller answers COORDINATOR_LOAD_IN_PROGRESS for the partition. The group coordinator uses it for
``__consumer_offsets``; the transaction coordinator will for ``__transaction_state``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from strom.records.batch import iter_headers
from strom.records.codec import decode_batch
from strom.records.control import ControlRecordType, batch_end_txn_marker
from strom.storage.log_io import lower_thread_priority

if TYPE_CHECKING:
    from strom.broker.partition import Partition

# Bytes read on the loop per slice (at least one batch); replaying a slice of small offset
# commits takes the worker ~70 ms.
LOAD_SLICE_BYTES = 1024 * 1024
# The worker steps off the CPU for GIL_PAUSE_S after every GIL_SLICE_S of replay (as the cleaner).
GIL_SLICE_S = 0.002
GIL_PAUSE_S = 0.0002

_T = TypeVar("_T")

# Replays one record (key, value, offset) into the caller's state, on the worker thread.
Replay = Callable[[bytes | None, bytes | None, int], None]


class TransactionListener(Protocol):
    """A replay that follows transactions (the group coordinator's: transactional offset commits
    count only once their COMMIT marker is replayed)."""

    def start_batch(self, producer_id: int, offset: int) -> None:
        """The records that follow are a batch of ``producer_id``'s transaction (-1: not transactional)."""

    def end_transaction(self, producer_id: int, committed: bool, offset: int) -> None:
        """``producer_id``'s COMMIT (or ABORT) marker, at ``offset``."""


@dataclass(frozen=True, slots=True)
class LoadStats:
    records: int
    slices: int
    millis: int


def replay_records(
    data: bytes,
    replay: Replay,
    pause: Callable[[], None] = lambda: None,
    transactions: TransactionListener | None = None,
) -> tuple[int, int]:
    """Replay every record of the data batches in ``data`` in offset order; control batches are
    skipped, or given to ``transactions`` as the transaction markers they are. Returns (the
    offset after the last batch, records replayed)."""
    next_offset = -1
    records = 0
    for header in iter_headers(data):
        next_offset = header.last_offset + 1
        if header.is_control:
            if transactions is not None and header.producer_id >= 0:
                marker = batch_end_txn_marker(memoryview(data)[header.position : header.position + header.size])
                if marker is not None:
                    transactions.end_transaction(
                        header.producer_id, marker.type == ControlRecordType.COMMIT, header.base_offset
                    )
            continue
        if transactions is not None:
            transactions.start_batch(header.producer_id if header.is_transactional else -1, header.base_offset)
        # One batch at a time, so the worker can pause between any two.
        for record in decode_batch(data, header.position).records:
            replay(record.key, record.value, record.offset)
            records += 1
        pause()
    return next_offset, records


class CoordinatorLoader:
    """Loads coordinator partitions one slice at a time on its own worker thread (not asyncio's
    default executor, which ZooKeeper calls occupy)."""

    def __init__(self, slice_bytes: int = LOAD_SLICE_BYTES) -> None:
        self._slice_bytes = slice_bytes
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix="strom-coordinator-load", initializer=lower_thread_priority
        )
        self._slice_started = 0.0

    def _pause(self) -> None:
        now = time.monotonic()
        if now - self._slice_started >= GIL_SLICE_S:
            time.sleep(GIL_PAUSE_S)
            self._slice_started = time.monotonic()

    def _replay_slice(
        self, data: bytes, replay: Replay, transactions: TransactionListener | None
    ) -> tuple[int, int]:
        self._slice_started = time.monotonic()
        return replay_records(data, replay, self._pause, transactions)

    async def run(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the load worker (e.g. building the loaded state's objects)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def load(
        self,
        partition: Partition,
        replay: Replay,
        is_current: Callable[[], bool],
        transactions: TransactionListener | None = None,
    ) -> LoadStats | None:
        """Replay ``partition`` from its log start to its log end (as Kafka loads: a new leader's
        log is the partition's truth) through ``replay`` on the worker; None if ``is_current``
        turned false (the load is stale: its result must not be adopted)."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        offset = partition.log_start_offset
        records = slices = 0
        while True:
            if not is_current():
                return None
            if offset >= partition.log_end_offset:
                break
            data = partition.read_records(
                offset, self._slice_bytes, min_one_batch=True, up_to_log_end=True
            ).records
            if not data:
                break
            next_offset, replayed = await loop.run_in_executor(
                self._executor, self._replay_slice, data, replay, transactions
            )
            if next_offset <= offset:
                break  # no whole batch: nothing more to read
            offset = next_offset
            records += replayed
            slices += 1
        return LoadStats(records, slices, int((time.monotonic() - started) * 1000))

    def shutdown(self) -> None:
        """Stop the worker; a load in progress stops at its next slice (its caller is stopping)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
