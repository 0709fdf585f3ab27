"""Times and durations as the groups, pipelines and transactions pages show them."""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from strom.client.cluster import TopicPartition


def duration(ms: float | None) -> str:
    """850 ms, 3 s, 4 min 10 s, 2 h 5 min; a dash for none."""
    if ms is None or ms < 0:
        return "—"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = int(ms // 1000)
    if seconds < 60:
        return f"{ms / 1000:.1f} s" if seconds < 10 else f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def utc(ms: int | None) -> str:
    """A time in ms since the epoch as UTC, to the second; a dash for none."""
    if ms is None or ms < 0:
        return "—"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def partitions_text(partitions: Iterable[TopicPartition]) -> str:
    """orders [0, 1], payments [3]"""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t} [{', '.join(str(p) for p in sorted(ps))}]" for t, ps in sorted(by_topic.items()))
