"""An I/O error on a log dir takes it offline once (one error line), its logs answer
KAFKA_STORAGE_ERROR and write nothing more, and a restart recovers every record appended before.

The I/O errors are injected by replacing os functions inside the one storage module under test.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from strom.storage import CLEAN_SHUTDOWN_FILE, KafkaStorageError, LogConfig, LogManager, UnifiedLog
from strom.storage import checkpoint as checkpoint_module
from strom.storage import index as index_module
from strom.storage import log_segment as log_segment_module
from strom.storage.log_dir_failure import LogDirOfflineError
from unit.storage.storage_batches import batch_offsets, make_batch

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def enospc(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def offline_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is offline after an I/O error" in r.getMessage()]


def read_all(log: UnifiedLog) -> list[tuple[int, int]]:
    offset, seen = 0, []
    while offset < log.log_end_offset:
        batches = batch_offsets(log.read(offset, 1 << 20).records)
        seen.extend(batches)
        offset = batches[-1][1] + 1
    return seen


def test_append_failure_takes_the_dir_offline_and_a_restart_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", CONFIG)
    for _ in range(20):
        log.append_as_leader(make_batch(count=2, value_size=40), 0)
    end = log.log_end_offset
    with monkeypatch.context() as patch, caplog.at_level(logging.ERROR):
        patch.setattr(log_segment_module.os, "pwrite", enospc)
        patch.setattr(log_segment_module.os, "pwritev", enospc)  # a leader append of bytes
        for _ in range(3):
            with pytest.raises(LogDirOfflineError) as raised:
                log.append_as_leader(make_batch(count=2, value_size=40), 0)
            assert raised.value.error_code == 56
    assert log.offline and log.log_end_offset == end
    lines = offline_lines(caplog)
    assert len(lines) == 1 and str(tmp_path) in lines[0] and "No space left on device" in lines[0]
    # Reads, retention and flushes refuse too; close never raises and writes nothing.
    with pytest.raises(KafkaStorageError):
        log.read(0, 1000)
    with pytest.raises(KafkaStorageError):
        log.delete_retention_segments()
    assert not log.flush_due(0)
    log.close()
    assert log.closed
    recovered = UnifiedLog.open(tmp_path / "t-0", CONFIG)
    assert read_all(recovered) == [(i * 2, i * 2 + 1) for i in range(end // 2)]
    recovered.close()


def test_index_write_failure_is_a_storage_error_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", CONFIG)
    log.append_as_leader(make_batch(count=2, value_size=40), 0)
    index = log.active_segment.offset_index
    entries = index.entries
    with monkeypatch.context() as patch:
        patch.setattr(index_module.os, "pwrite", enospc)
        with pytest.raises(LogDirOfflineError):
            for _ in range(10):  # past index.interval.bytes: the next append writes an entry
                log.append_as_leader(make_batch(count=2, value_size=40), 0)
    assert index.entries == entries  # a failed entry never becomes visible
    log.close()


def test_roll_failure_takes_the_dir_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = UnifiedLog.open(tmp_path / "t-0", CONFIG)
    log.append_as_leader(make_batch(count=2, value_size=40), 0)
    with monkeypatch.context() as patch:
        # Producer snapshot, new segment files: whatever the roll opens first fails.
        patch.setattr(log_segment_module.os, "open", enospc)
        with pytest.raises(LogDirOfflineError):
            log.roll()
    assert log.offline
    log.close()


def test_log_manager_checkpoint_failure_marks_the_dir_and_skips_its_clean_shutdown_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    manager = LogManager([good, bad])
    manager.startup(lambda _topic: CONFIG)
    logs = [manager.get_or_create_log("t", p, CONFIG) for p in range(2)]
    assert {lg.log_dir for lg in logs} == {good, bad}
    for lg in logs:
        lg.append_as_leader(make_batch(), 0)
    real_write = checkpoint_module.write_atomically

    def failing_in_bad(path: Path, content: bytes) -> None:
        if path.parent == bad:
            enospc()
        real_write(path, content)

    with caplog.at_level(logging.ERROR):
        monkeypatch.setattr(checkpoint_module, "write_atomically", failing_in_bad)
        manager.checkpoint()  # the scheduler's job: logged, not raised
        manager.checkpoint()
        manager.flush_dirty_logs()
    assert len(offline_lines(caplog)) == 1
    bad_log = next(lg for lg in logs if lg.log_dir == bad)
    good_log = next(lg for lg in logs if lg.log_dir == good)
    assert bad_log.offline and not good_log.offline
    good_log.append_as_leader(make_batch(), 0)  # the other dir keeps working
    # No new partition goes to the offline dir.
    assert manager.get_or_create_log("t", 2, CONFIG).log_dir == good
    manager.shutdown()
    assert (good / CLEAN_SHUTDOWN_FILE).exists() and not (bad / CLEAN_SHUTDOWN_FILE).exists()


def test_log_manager_starts_when_a_dir_fails_to_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = LogManager([tmp_path / "d"])
    manager.startup(lambda _topic: CONFIG)
    manager.get_or_create_log("t", 0, CONFIG).append_as_leader(make_batch(), 0)
    manager.shutdown()

    restarted = LogManager([tmp_path / "d"])
    with monkeypatch.context() as patch:
        patch.setattr(log_segment_module.os, "open", enospc)
        restarted.startup(lambda _topic: CONFIG)
    assert restarted.log_dir_failure_channel.is_offline(tmp_path / "d")
    # Its partition is not replaced by a fresh, empty log.
    with pytest.raises(LogDirOfflineError):
        restarted.get_or_create_log("t", 0, CONFIG)
    restarted.shutdown()
    assert (tmp_path / "d" / "t-0" / "00000000000000000000.log").stat().st_size > 0


def test_an_append_that_meets_its_deleted_log_leaves_the_dir_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follower's append runs on the log's I/O executor; the topic's deletion closes the files
    # meanwhile (found by the cluster wire fuzz: EBADF took a broker's only log dir offline).
    log = UnifiedLog.open(tmp_path / "t-0", CONFIG)
    log.append_as_leader(make_batch(count=2), 0)
    analyzed = log.analyze_follower_records(make_batch(count=2, base_offset=log.log_end_offset))
    assert analyzed is not None
    segment = log.active_segment
    should_roll = segment.should_roll

    def deleted_meanwhile(*args: Any) -> bool:
        log.delete()  # between the append's open check and its write
        return should_roll(*args)

    monkeypatch.setattr(segment, "should_roll", deleted_meanwhile)
    with pytest.raises(KafkaStorageError) as raised:
        log.append_analyzed_as_follower(analyzed)
    assert not isinstance(raised.value, LogDirOfflineError)
    assert not log.offline and not log.log_dir_failure_channel.offline_dirs()
