"""A leader change that truncated records a Spark task already read is reported like data loss."""

from __future__ import annotations

import logging

import pytest

from strom.client.cluster import TopicPartition
from strom.client.consumer.structs import LogTruncationError, OffsetAndMetadata
from strom.spark.partition_reader import DataLossError, OffsetRangePartition, _report_truncation

TP = TopicPartition("events", 2)


def part(fail_on_data_loss: bool) -> OffsetRangePartition:
    return OffsetRangePartition("events", 2, 100, 200, fail_on_data_loss=fail_on_data_loss)


def test_fail_on_data_loss_fails_the_task_naming_the_divergent_offset() -> None:
    error = LogTruncationError({TP: 150}, {TP: OffsetAndMetadata(140, "", 3)})
    with pytest.raises(DataLossError, match=r"events-2.*diverges at 140.*from offset 140"):
        _report_truncation(part(True), error, 150)


def test_without_fail_on_data_loss_the_read_goes_on_from_its_position(caplog: pytest.LogCaptureFixture) -> None:
    error = LogTruncationError({TP: 150}, {})
    with caplog.at_level(logging.WARNING, logger="strom.spark"):
        assert _report_truncation(part(False), error, 150) == 150
    assert "where is unknown" in caplog.text and "from offset 100" in caplog.text
