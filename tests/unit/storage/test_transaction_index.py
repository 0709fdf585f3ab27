"""TransactionIndex: Kafka's .txnindex layout, range collection, truncation, damage."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from strom.storage.transaction_index import ENTRY_SIZE, AbortedTxn, TransactionIndex


def index_at(tmp_path: Path, base: int = 100) -> TransactionIndex:
    return TransactionIndex(tmp_path / f"{base:020d}.txnindex", base, exists=False)


def test_entries_are_kafkas_34_byte_layout(tmp_path: Path) -> None:
    index = index_at(tmp_path)
    assert not index.path.exists()  # created by the first abort only
    index.append(AbortedTxn(producer_id=7, first_offset=90, last_offset=105, last_stable_offset=106))
    index.append(AbortedTxn(8, 101, 110, 111))
    data = index.path.read_bytes()
    assert ENTRY_SIZE == 34 and len(data) == 68
    # version int16 0, producer id, first offset, last offset, last stable offset: int64s, big-endian.
    assert data[:34] == struct.pack(">hqqqq", 0, 7, 90, 105, 106)
    assert data[:2] == b"\x00\x00" and data[2:10] == (7).to_bytes(8, "big")
    reopened = TransactionIndex(index.path, 100)
    assert reopened.damaged is None
    assert reopened.all() == [AbortedTxn(7, 90, 105, 106), AbortedTxn(8, 101, 110, 111)]


def test_appends_must_increase_by_last_offset(tmp_path: Path) -> None:
    index = index_at(tmp_path)
    index.append(AbortedTxn(1, 100, 105, 106))
    with pytest.raises(ValueError):
        index.append(AbortedTxn(2, 100, 105, 106))
    with pytest.raises(ValueError):
        index.append(AbortedTxn(2, 100, 104, 106))
    assert len(index) == 1 and index.path.stat().st_size == 34


def test_collect_returns_overlapping_transactions_and_says_when_complete(tmp_path: Path) -> None:
    index = index_at(tmp_path, 0)
    entries = [AbortedTxn(1, 0, 10, 11), AbortedTxn(2, 5, 20, 12), AbortedTxn(3, 12, 30, 31)]
    for entry in entries:
        index.append(entry)
    found: list[AbortedTxn] = []
    # [11, 12): transactions ending before 11 are out; 3 starts at 12, past the range. Entry 3's
    # LSO (31) reaches the bound: no later segment can hold more.
    assert index.collect(11, 12, found) is True
    assert found == [entries[1]]
    found = []
    assert index.collect(0, 100, found) is False  # no LSO reaches 100: go on to later segments
    assert found == entries
    found = []
    # An earlier entry's LSO beyond the bound answers without looking further.
    assert index.collect(25, 5, found) is True and found == []
    found = []
    assert index.collect(31, 40, found) is False and found == []


def test_truncate_drops_markers_at_or_after_the_offset(tmp_path: Path) -> None:
    index = index_at(tmp_path, 0)
    for entry in (AbortedTxn(1, 0, 10, 11), AbortedTxn(2, 5, 20, 21), AbortedTxn(3, 12, 30, 31)):
        index.append(entry)
    index.truncate_to(21)
    assert [t.producer_id for t in index.all()] == [1, 2]
    assert index.path.stat().st_size == 68
    index.truncate_to(20)
    assert [t.producer_id for t in index.all()] == [1]
    index.truncate_to(500)  # nothing at or after it
    assert len(index) == 1
    # Appends continue after the truncation point.
    index.append(AbortedTxn(4, 15, 16, 17))
    assert TransactionIndex(index.path, 0).all() == [AbortedTxn(1, 0, 10, 11), AbortedTxn(4, 15, 16, 17)]
    index.reset()
    assert index.is_empty and not index.path.exists()


@pytest.mark.parametrize(
    "content",
    [
        struct.pack(">hqqqq", 0, 1, 0, 150, 151)[:-3],  # not whole entries
        struct.pack(">hqqqq", 1, 1, 0, 150, 151),  # unknown version
        struct.pack(">hqqqq", 0, 1, 0, 50, 51),  # a marker below the segment's base offset
        struct.pack(">hqqqq", 0, 1, 0, 150, 151) * 2,  # last offsets not increasing
    ],
)
def test_damaged_file_is_reported_not_used_and_kept(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "00000000000000000100.txnindex"
    path.write_bytes(content)
    index = TransactionIndex(path, 100)
    assert index.damaged is not None and index.is_empty
    # Derived data: the file stays until recovery rebuilds it.
    assert path.read_bytes() == content


def test_rename_and_delete(tmp_path: Path) -> None:
    index = index_at(tmp_path)
    assert index.rename_to(".deleted") is None  # no file, nothing to rename
    index.append(AbortedTxn(1, 100, 101, 102))
    index.flush()
    renamed = index.rename_to(".deleted")
    assert renamed is not None and renamed.name == "00000000000000000100.txnindex.deleted"
    assert renamed.exists() and not index.path.exists()
    other = index_at(tmp_path, 200)
    other.append(AbortedTxn(1, 200, 201, 202))
    other.delete()
    assert not other.path.exists()
