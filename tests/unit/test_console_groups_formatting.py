"""How the groups, pipelines and transactions pages write times, durations and partitions."""

from __future__ import annotations

from strom.client.cluster import TopicPartition
from strom.console.formatting import duration, partitions_text, utc


def test_durations() -> None:
    assert [
        duration(ms) for ms in (None, -1, 0, 850, 2049, 12_000, 61_000, 120_000, 3_725_000, 7_200_000)
    ] == [
        "—",
        "—",
        "0 ms",
        "850 ms",
        "2.0 s",
        "12 s",
        "1 min 1 s",
        "2 min",
        "1 h 2 min",
        "2 h",
    ]


def test_times_and_partitions() -> None:
    assert utc(0) == "1970-01-01 00:00:00 UTC" and utc(None) == "—"
    parts = [TopicPartition("b", 2), TopicPartition("a", 1), TopicPartition("b", 0)]
    assert partitions_text(parts) == "a [1], b [0, 2]"
