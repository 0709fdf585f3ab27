from __future__ import annotations

import uuid
from pathlib import Path

from strom.storage import CLEAN_SHUTDOWN_FILE, LogConfig, LogManager
from strom.storage.checkpoint import OffsetCheckpointFile
from unit.storage.storage_batches import batch_offsets, make_batch


def test_startup_create_shutdown_and_reload(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    manager = LogManager(dirs)
    manager.startup(lambda topic: LogConfig())
    topic_id = uuid.uuid4()
    logs = [manager.get_or_create_log("orders", p, LogConfig(), topic_id) for p in range(4)]
    # Partitions spread over the log dirs.
    assert {lg.dir.parent for lg in logs} == set(dirs)
    assert manager.get_or_create_log("orders", 0, LogConfig()) is logs[0]
    for lg in logs:
        lg.append_as_leader(make_batch(count=3), 0)
    logs[1].delete_records(2)
    manager.checkpoint()
    recovery = {
        **OffsetCheckpointFile(dirs[0] / "recovery-point-offset-checkpoint").read(),
        **OffsetCheckpointFile(dirs[1] / "recovery-point-offset-checkpoint").read(),
    }
    assert set(recovery) == {("orders", p) for p in range(4)}
    manager.shutdown()
    assert all((d / CLEAN_SHUTDOWN_FILE).exists() for d in dirs)

    again = LogManager(dirs)
    again.startup(lambda topic: LogConfig(), {"orders": topic_id})
    # The marker is consumed at startup so that a crash is detected next time.
    assert not any((d / CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    assert sorted((lg.topic, lg.partition) for lg in again.all_logs()) == [("orders", p) for p in range(4)]
    reloaded = again.get_log("orders", 1)
    assert reloaded is not None and reloaded.topic_id == topic_id
    assert reloaded.log_start_offset == 2 and reloaded.log_end_offset == 3
    assert batch_offsets(reloaded.read(2, 1000).records) == [(0, 2)]
    again.delete_log("orders", 1)
    assert again.get_log("orders", 1) is None and not reloaded.dir.exists()
    again.shutdown()


def test_delete_records_survives_a_crash(tmp_path: Path) -> None:
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig())
    log = manager.get_or_create_log("t", 0, LogConfig(segment_bytes=500))
    for _ in range(10):
        log.append_as_leader(make_batch(count=2, value_size=50), 0)
    log.delete_records(7)
    # No shutdown: the broker persists the moved start before answering DeleteRecords.
    manager.persist_log_start_offsets()
    crashed = LogManager([tmp_path])
    crashed.startup(lambda topic: LogConfig(segment_bytes=500))
    reloaded = crashed.get_log("t", 0)
    assert reloaded is not None
    assert reloaded.log_start_offset == 7
    assert reloaded.log_end_offset == 20


def test_stale_topic_id_directory_is_moved_aside(tmp_path: Path) -> None:
    manager = LogManager([tmp_path])
    manager.startup(lambda topic: LogConfig())
    manager.get_or_create_log("t", 0, LogConfig(), uuid.uuid4()).append_as_leader(make_batch(), 0)
    manager.shutdown()
    fresh = LogManager([tmp_path])
    fresh.startup(lambda topic: LogConfig(), {"t": uuid.uuid4()})
    assert fresh.get_log("t", 0) is None
    assert len(list(tmp_path.glob("t-0.*-stray"))) == 1
    assert fresh.get_or_create_log("t", 0, LogConfig()).log_end_offset == 0
