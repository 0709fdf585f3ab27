"""The embedded control plane persists every change before it shows it (a mock disk failure here)."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any

import pytest

import strom.broker.control_plane.local as local
from strom.broker.control_plane.local import METADATA_FILE, LocalControlPlane
from strom.storage import KafkaStorageError


@pytest.fixture()
def control_plane(tmp_path: Path) -> LocalControlPlane:
    plane = LocalControlPlane([tmp_path], node_id=0)
    plane.load()
    return plane


def fail_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local, "_write_metadata", full_disk)


def saved(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / METADATA_FILE).read_text())
    return data


def test_a_missing_file_is_reported_lost(control_plane: LocalControlPlane) -> None:
    assert control_plane.lost and control_plane.image.topics() == []


def test_a_failed_write_changes_nothing(
    control_plane: LocalControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        kept = control_plane.new_topic("kept", 2, {})
        await control_plane.stage(kept)
        control_plane.apply("kept")
        with monkeypatch.context() as patch:
            fail_writes(patch)
            with pytest.raises(KafkaStorageError, match="No space left"):
                await control_plane.stage(control_plane.new_topic("lost", 1, {}))
            with pytest.raises(KafkaStorageError):
                await control_plane.stage(control_plane.with_configs("kept", {"retention.ms": "1"}))
            with pytest.raises(KafkaStorageError):
                await control_plane.stage_removal("kept")
        # Memory is as it was, and the next write does not carry the failed changes.
        assert [t.name for t in control_plane.image.topics()] == ["kept"]
        assert control_plane.image.topic("kept").configs == {}  # type: ignore[union-attr]
        assert not control_plane.exists("lost")
        await control_plane.stage(control_plane.with_partitions("kept", 3))
        control_plane.apply("kept")

    asyncio.run(scenario())
    data = saved(tmp_path)
    assert [(t["name"], len(t["partitions"]), t["configs"]) for t in data["topics"]] == [("kept", 3, {})]
    assert data["deleting_topic_ids"] == []
    control_plane.close()


def test_a_staged_topic_is_persisted_but_not_shown_until_applied(
    control_plane: LocalControlPlane, tmp_path: Path
) -> None:
    async def scenario() -> None:
        topic = control_plane.new_topic("t", 1, {})
        await control_plane.stage(topic)
        assert control_plane.image.topic("t") is None and control_plane.exists("t")
        assert [t["name"] for t in saved(tmp_path)["topics"]] == ["t"]
        # A producer id block written meanwhile keeps the staged topic in the file.
        control_plane.allocate_producer_id_block(1000)
        assert [t["name"] for t in saved(tmp_path)["topics"]] == ["t"]
        control_plane.apply("t")
        removed = await control_plane.stage_removal("t")
        assert removed is topic
        control_plane.apply("t")
        assert saved(tmp_path)["deleting_topic_ids"] == [str(topic.topic_id)]
        await control_plane.finish_deletion([topic.topic_id])

    asyncio.run(scenario())
    assert saved(tmp_path)["deleting_topic_ids"] == [] and saved(tmp_path)["topics"] == []
    control_plane.close()


def test_producer_ids_are_never_handed_out_twice(
    control_plane: LocalControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert control_plane.allocate_producer_id_block(1000) == range(0, 1000)
    with monkeypatch.context() as patch:
        fail_writes(patch)
        with pytest.raises(KafkaStorageError):
            control_plane.allocate_producer_id_block(1000)
    assert control_plane.allocate_producer_id_block(1000) == range(2000, 3000)
    control_plane.reserve_producer_ids_above(4321, 1000)
    assert control_plane.allocate_producer_id_block(1000) == range(5000, 6000)
    control_plane.close()


def test_a_garbage_file_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / METADATA_FILE).write_bytes(b"\x00{not json")
    plane = LocalControlPlane([tmp_path], node_id=0)
    plane.load()
    assert plane.lost
    assert len(list(tmp_path.glob(f"{METADATA_FILE}.*-corrupt"))) == 1
    plane.close()
