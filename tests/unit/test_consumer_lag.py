"""The consumer lag monitor's pure parts: Burrow-style status rules (a table), the group's worst
status, the record timestamp read from a batch header of a real log, and the pipeline progress
carried in offset metadata (round trip, size cap, foreign metadata)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strom.broker.metrics.lag import (
    PIPELINE_GROUP,
    HighWatermarkHistory,
    LagStatus,
    Observation,
    group_status,
    partition_status,
    record_timestamp,
)
from strom.protocol.pipeline_progress import MARKER, PipelineProgress
from strom.storage import LogConfig, UnifiedLog
from unit.storage.storage_batches import make_batch

WINDOW = 4
INTERVAL = 1000  # ms between samples


def window(
    committed: list[int],
    high_watermarks: list[int],
    *,
    commit_times: list[int] | None = None,
    invalid_last: bool = False,
) -> list[Observation]:
    """Samples INTERVAL apart from t=100000; by default each commit happened at its sample's time."""
    times = [100_000 + i * INTERVAL for i in range(len(committed))]
    commits = commit_times if commit_times is not None else times
    return [
        Observation(t, c, ct, hw, invalid=invalid_last and i == len(committed) - 1)
        for i, (t, c, ct, hw) in enumerate(zip(times, committed, commits, high_watermarks, strict=True))
    ]


OLD = [50_000] * 4  # every sample sees a commit made long before the window

STATUS_TABLE = [
    # (case, committed, high watermarks, commit times, has members, expected)
    ("caught up", [10, 10, 10, 10], [10, 10, 10, 10], None, True, LagStatus.OK),
    ("caught up, stopped long ago", [10, 10, 10, 10], [10, 10, 10, 10], OLD, False, LagStatus.OK),
    ("moving, lag shrinking", [10, 20, 30, 40], [50, 50, 50, 50], None, True, LagStatus.OK),
    ("moving, lag steady", [10, 20, 30, 40], [20, 30, 40, 50], None, True, LagStatus.OK),
    ("moving, lag growing", [10, 20, 30, 40], [20, 35, 50, 65], None, True, LagStatus.WARNING),
    ("growing but dipped", [10, 20, 30, 40], [20, 35, 32, 65], None, True, LagStatus.OK),
    ("lag was 0 in the window", [10, 10, 10, 10], [10, 12, 14, 16], None, True, LagStatus.OK),
    ("not moving, members", [10, 10, 10, 10], [20, 20, 25, 30], OLD, True, LagStatus.STALLED),
    ("not moving, still committing", [10, 10, 10, 10], [20, 20, 20, 20], None, False, LagStatus.STALLED),
    ("no members, commits stopped", [10, 10, 10, 10], [20, 20, 20, 20], OLD, False, LagStatus.STOPPED),
    ("stopped, though caught up earlier", [10, 10, 10, 10], [10, 20, 20, 20], OLD, False, LagStatus.STOPPED),
    ("stopped, window not full", [10, 10, 10], [20, 20, 20], OLD[:3], False, LagStatus.OK),
    ("window not full", [10, 10, 10], [20, 20, 20], None, True, LagStatus.OK),
    ("rewound", [10, 20, 5, 15], [30, 30, 30, 30], None, True, LagStatus.ERROR),
    ("rewound, now caught up", [10, 20, 5, 30], [30, 30, 30, 30], None, True, LagStatus.ERROR),
]


@pytest.mark.parametrize(
    ("committed", "high_watermarks", "commit_times", "has_members", "expected"),
    [case[1:] for case in STATUS_TABLE],
    ids=[case[0] for case in STATUS_TABLE],
)
def test_partition_status_rules(
    committed: list[int],
    high_watermarks: list[int],
    commit_times: list[int] | None,
    has_members: bool,
    expected: LagStatus,
) -> None:
    samples = window(committed, high_watermarks, commit_times=commit_times)
    assert partition_status(samples, has_members=has_members, window_size=WINDOW) is expected


def test_gone_or_beyond_the_log_end_is_an_error_even_at_zero_lag() -> None:
    samples = window([10, 10, 10, 10], [10, 10, 10, 10], invalid_last=True)
    assert partition_status(samples, has_members=True, window_size=WINDOW) is LagStatus.ERROR


def test_a_commit_older_than_the_window_span_with_members_is_stalled_not_stopped() -> None:
    # Members heartbeat but do not commit: Burrow's STOPPED needs the group gone as well.
    samples = window([10, 10, 10, 10], [20, 20, 20, 20], commit_times=OLD)
    assert partition_status(samples, has_members=True, window_size=WINDOW) is LagStatus.STALLED
    assert partition_status(samples, has_members=False, window_size=WINDOW) is LagStatus.STOPPED


def test_the_group_takes_its_worst_partition() -> None:
    assert group_status([]) is LagStatus.OK
    assert group_status([LagStatus.OK, LagStatus.WARNING, LagStatus.OK]) is LagStatus.WARNING
    assert group_status([LagStatus.STALLED, LagStatus.WARNING]) is LagStatus.STALLED
    assert group_status([LagStatus.STALLED, LagStatus.STOPPED]) is LagStatus.STOPPED
    assert group_status([LagStatus.STOPPED, LagStatus.ERROR, LagStatus.OK]) is LagStatus.ERROR


def test_pipeline_groups_are_recognised_by_name() -> None:
    match = PIPELINE_GROUP.fullmatch("strom-spark-weblog.parse_lines")
    assert match is not None and match.groups() == ("weblog", "parse_lines")
    assert PIPELINE_GROUP.fullmatch("strom-spark-weblog") is None
    assert PIPELINE_GROUP.fullmatch("my-app") is None


def test_record_timestamp_comes_from_the_batch_holding_the_offset(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig())
    try:
        log.append_as_leader(make_batch(count=3, timestamps=[1_000, 1_005, 1_010]), 0)  # offsets 0-2
        log.append_as_leader(make_batch(count=2, timestamps=[2_000, 2_003]), 0)  # offsets 3-4
        assert record_timestamp(log, 0) == 1_000
        # Within a batch: its first record's timestamp, older by at most the batch's span.
        assert record_timestamp(log, 2) == 1_000
        assert record_timestamp(log, 3) == 2_000
        assert record_timestamp(log, 4) == 2_000
        assert record_timestamp(log, 5) is None  # the log end: no record yet
    finally:
        log.close()


def test_record_timestamp_over_rolled_segments(tmp_path: Path) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", LogConfig(segment_bytes=200))
    try:
        for i in range(6):
            log.append_as_leader(
                make_batch(count=2, value_size=60, timestamps=[10_000 * i, 10_000 * i + 1]), 0
            )
        assert log.num_segments > 1
        assert [record_timestamp(log, offset) for offset in range(0, 12, 2)] == [10_000 * i for i in range(6)]
    finally:
        log.close()


def test_remote_partitions_date_records_by_when_the_high_watermark_passed_them() -> None:
    history = HighWatermarkHistory()
    for time_ms, high_watermark in [(1_000, 10), (2_000, 10), (3_000, 30), (4_000, 30), (5_000, 40)]:
        history.add(time_ms, high_watermark)
    assert [run[0] for run in history.runs] == [10, 30, 40]  # one run per HW value
    # Offsets 10..29 became readable between 2 s (HW still 10) and 3 s (HW 30): linear in between.
    assert history.readable_since(10) == 2_050
    assert history.readable_since(19) == 2_500
    assert history.readable_since(29) == 3_000
    assert history.readable_since(35) == 4_600
    # Readable before the first sample: its time is a lower bound of the age.
    assert history.readable_since(3) == 1_000
    assert history.readable_since(40) is None  # not written yet
    history.add(6_000, 20)  # the HW went back (truncation): the history starts over
    assert [run[0] for run in history.runs] == [20] and history.readable_since(5) == 6_000


# -- pipeline progress in offset metadata -------------------------------------------------------

PROGRESS = PipelineProgress(
    pipeline="weblog",
    stage="parse",
    batch_id=7,
    rows=1200,
    input_rows_per_second=480.5,
    processed_rows_per_second=2400.0,
    batch_duration_ms=500,
    batch_end_ms=1_790_000_000_123,
    sources=("access_log",),
    sinks=("pageloads",),
)


def test_progress_round_trips_through_metadata() -> None:
    text = PROGRESS.to_metadata()
    assert text.isascii() and len(text) <= 4096
    assert json.loads(text)[MARKER] == 1
    assert PipelineProgress.from_metadata(text) == PROGRESS


def test_progress_with_a_non_finite_rate_is_written_as_zero() -> None:
    progress = PipelineProgress("p", "s", 0, 0, float("nan"), float("inf"), 0, 0)
    back = PipelineProgress.from_metadata(progress.to_metadata())
    assert back is not None and (back.input_rows_per_second, back.processed_rows_per_second) == (0.0, 0.0)


def test_progress_fits_the_metadata_limit_by_dropping_topic_lists() -> None:
    many = tuple(f"topic-{i:03d}-" + "x" * 200 for i in range(30))
    wide = PipelineProgress("p", "s", 1, 2, 3.0, 4.0, 5, 6, sources=many[:10], sinks=many)
    text = wide.to_metadata()
    back = PipelineProgress.from_metadata(text)
    assert len(text) <= 4096 and back is not None
    assert back.sources == many[:10] and back.sinks == ()  # sinks go first
    tiny = wide.to_metadata(max_bytes=100)
    assert tiny == ""  # not even the numbers fit: no metadata rather than a refused commit


def test_a_later_version_with_more_fields_is_read() -> None:
    data = json.loads(PROGRESS.to_metadata())
    data[MARKER] = 2
    data["watermark"] = "2026-01-01T00:00:00Z"
    assert PipelineProgress.from_metadata(json.dumps(data)) == PROGRESS


FOREIGN = [
    None,
    "",
    "consumer-1 was here",
    "{",
    "{not json}",
    "[1, 2, 3]",
    '{"pipeline": "p", "stage": "s"}',  # no marker
    json.dumps({**json.loads(PROGRESS.to_metadata()), MARKER: 0}),
    json.dumps({**json.loads(PROGRESS.to_metadata()), MARKER: "1"}),
    json.dumps({**json.loads(PROGRESS.to_metadata()), MARKER: True}),
    json.dumps({**json.loads(PROGRESS.to_metadata()), "rows": "12"}),
    json.dumps({**json.loads(PROGRESS.to_metadata()), "batchId": 1.5}),
    json.dumps({**json.loads(PROGRESS.to_metadata()), "processedRowsPerSecond": None}),
    json.dumps({**json.loads(PROGRESS.to_metadata()), "sinks": "pageloads"}),
    json.dumps({**json.loads(PROGRESS.to_metadata()), "sources": [1]}),
    json.dumps({key: value for key, value in json.loads(PROGRESS.to_metadata()).items() if key != "stage"}),
    '{"strom.pipeline.progress": 1, "inputRowsPerSecond": NaN}',
    "[" * 100_000 + "]" * 100_000,
]


@pytest.mark.parametrize("metadata", FOREIGN, ids=range(len(FOREIGN)))
def test_foreign_metadata_is_none_never_an_exception(metadata: str | None) -> None:
    assert PipelineProgress.from_metadata(metadata) is None
