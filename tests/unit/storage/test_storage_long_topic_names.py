"""Issue 17 item 6: a legal topic name of 249 characters makes ``<topic>-<partition>.<id>-delete``
longer than a file name may be. Deleting (or setting aside) such a log must work, and a rename
that fails for deletion must not take the log dir offline."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

import pytest

from strom.storage import LogConfig, LogManager
from unit.storage.storage_batches import make_batch

LONG_TOPIC = "t" * 249  # Kafka's longest legal topic name
MAX_FILE_NAME_BYTES = 255


def _manager_with_log(tmp_path: Path, topic: str, partition: int = 0) -> LogManager:
    manager = LogManager([tmp_path])
    manager.startup(lambda _: LogConfig())
    log_ = manager.get_or_create_log(topic, partition, LogConfig(), uuid.uuid4())
    log_.append_as_leader(make_batch(count=3), 0)
    return manager


@pytest.mark.parametrize("partition", [0, 99999])
def test_deleting_a_log_of_a_249_character_topic(tmp_path: Path, partition: int) -> None:
    manager = _manager_with_log(tmp_path, LONG_TOPIC, partition)
    log_ = manager.get_log(LONG_TOPIC, partition)
    assert log_ is not None
    manager.delete_log(LONG_TOPIC, partition)
    assert not log_.dir.exists()
    assert list(tmp_path.glob("t*")) == []
    assert not manager.log_dir_failure_channel.offline_dirs()
    # The dir still takes new logs, and the broker restarts on it.
    manager.get_or_create_log("other", 0, LogConfig())
    manager.shutdown()
    again = LogManager([tmp_path])
    again.startup(lambda _: LogConfig())
    assert [(lg.topic, lg.partition) for lg in again.all_logs()] == [("other", 0)]
    again.shutdown()


def test_setting_aside_a_log_of_a_249_character_topic(tmp_path: Path) -> None:
    manager = _manager_with_log(tmp_path, LONG_TOPIC)
    (log_,) = manager.unregister_logs([(LONG_TOPIC, 0)])
    stray = manager.move_aside(log_, "test")
    assert stray.is_dir() and stray.name.endswith("-stray") and len(stray.name) <= MAX_FILE_NAME_BYTES
    assert (stray / "00000000000000000000.log").stat().st_size > 0  # kept, not deleted
    manager.shutdown()
    # Never loaded again, never removed.
    again = LogManager([tmp_path])
    again.startup(lambda _: LogConfig())
    assert again.all_logs() == [] and stray.is_dir()
    again.shutdown()


def test_a_failed_rename_for_deletion_is_no_failed_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = _manager_with_log(tmp_path, "short")
    log_ = manager.get_log("short", 0)
    assert log_ is not None

    def failing_rename(src: object, dst: object) -> None:
        raise OSError(errno.ENAMETOOLONG, "File name too long", str(dst))

    monkeypatch.setattr(os, "rename", failing_rename)
    manager.delete_log("short", 0)
    monkeypatch.undo()
    assert not log_.dir.exists()
    assert not manager.log_dir_failure_channel.offline_dirs()
    manager.shutdown()


def test_renamed_names_fit_a_file_name() -> None:
    from strom.storage.local_log import renamed_dir_name

    for name in [f"{LONG_TOPIC}-0", f"{LONG_TOPIC}-2147483647", "a-0", "not a partition dir"]:
        for suffix in ["-delete", "-stray"]:
            renamed = renamed_dir_name(name, suffix)
            assert len(renamed.encode()) <= MAX_FILE_NAME_BYTES and renamed.endswith(suffix)
    short = renamed_dir_name("orders-3", "-delete")
    assert short.startswith("orders-3.") and short.endswith("-delete")
