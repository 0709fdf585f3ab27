"""Offsets JSON, micro-batch limits and task planning of the strom source, without Spark or a broker
(the stream reader's OffsetReader is replaced by a scripted one)."""

from __future__ import annotations

import json
import pickle

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from strom.client.cluster import TopicPartition
from strom.spark.offsets import (
    CheckpointMismatchError,
    OffsetsFormatError,
    StreamOffset,
    from_json_dict,
    to_json_dict,
)
from strom.spark.options import parse_source_options
from strom.spark.partition_reader import DataLossError
from strom.spark.reader import StromStreamReader, _apportion, plan_partitions

A0, A1, A2, B0 = (TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("a", 2), TopicPartition("b", 0))


def options(**extra: str) -> object:
    return parse_source_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribePattern": "[ab]", **extra}, streaming=True
    )


def test_offsets_json_has_one_key_order() -> None:
    offsets = {TopicPartition("b", 0): 1, TopicPartition("a", 10): 3, TopicPartition("a", 2): 2}
    shuffled = dict(reversed(list(offsets.items())))
    assert json.dumps(to_json_dict(offsets)) == json.dumps(to_json_dict(shuffled))
    assert json.dumps(to_json_dict(offsets)) == '{"a": {"2": 2, "10": 3}, "b": {"0": 1}}'
    # A checkpoint gives them back with string keys, as JSON does.
    assert from_json_dict(json.loads(json.dumps(to_json_dict(offsets)))) == offsets
    for bad in ('["a"]', '{"a": [1]}', '{"a": {"x": 1}}', '{"a": {"0": "1"}}', '{"a": {"0": true}}', "{"):
        with pytest.raises(OffsetsFormatError):
            from_json_dict(bad)


def test_apportion_splits_exactly_by_backlog() -> None:
    backlog = {A0: 600, A1: 300, A2: 100, B0: 0}
    assert _apportion(backlog, 100) == {A0: 60, A1: 30, A2: 10, B0: 0}
    shares = _apportion({A0: 5, A1: 5, A2: 5}, 10)
    assert sum(shares.values()) == 10 and all(3 <= s <= 4 for s in shares.values())
    for limit in (1, 7, 99, 999):
        shares = _apportion(backlog, limit)
        assert sum(shares.values()) == limit
        assert all(0 <= shares[tp] <= backlog[tp] for tp in backlog)


def test_plan_partitions_splits_for_min_partitions() -> None:
    ranges = {A0: (0, 900), A1: (50, 150), B0: (7, 7)}
    plain = plan_partitions(options(), ranges)
    assert [(p.offset_range.tp, p.offset_range.from_offset, p.offset_range.until_offset) for p in plain] == [
        (A0, 0, 900),
        (A1, 50, 150),
    ]
    split = plan_partitions(options(minPartitions="10"), ranges)
    assert len(split) >= 10
    covered: dict[TopicPartition, list[tuple[int, int]]] = {}
    for part in split:
        r = part.offset_range
        covered.setdefault(r.tp, []).append((r.from_offset, r.until_offset))
    assert covered[A0][0][0] == 0 and covered[A0][-1][1] == 900
    assert all(a[1] == b[0] for a, b in zip(covered[A0], covered[A0][1:], strict=False))
    assert sum(u - f for f, u in covered[A1]) == 100
    assert B0 not in covered
    # Three equal ranges and minPartitions 7: rounding each share down would give 6.
    equal = plan_partitions(options(minPartitions="7"), {A0: (0, 30), A1: (0, 30), A2: (0, 30)})
    assert len(equal) == 7
    # Never more pieces than offsets.
    tiny = plan_partitions(options(minPartitions="50"), {A0: (0, 3), A1: (10, 11)})
    assert sorted((p.offset_range.from_offset, p.offset_range.until_offset) for p in tiny) == [
        (0, 1),
        (1, 2),
        (2, 3),
        (10, 11),
    ]
    # Partitions carry everything read() needs and pickle (Spark ships them to executors).
    copy = pickle.loads(pickle.dumps(split[0]))
    assert copy.offset_range == split[0].offset_range
    assert copy.offset_range.consumer_config == {"bootstrap.servers": "127.0.0.1:1"}


class ScriptedOffsets:
    """The broker's answers as a test sets them."""

    def __init__(self) -> None:
        self.log_start: dict[TopicPartition, int] = {}
        self.log_end: dict[TopicPartition, int] = {}
        self.cluster = "cluster-1"
        self.topic_ids = {"a": "id-a", "b": "id-b"}

    def partitions(self) -> set[TopicPartition]:
        return set(self.log_end)

    def describe(self) -> tuple[set[TopicPartition], dict[str, str]]:
        return set(self.log_end), {t: i for t, i in self.topic_ids.items() if any(tp.topic == t for tp in self.log_end)}

    def cluster_id(self) -> str:
        return self.cluster

    def earliest(self, tps: object) -> dict[TopicPartition, int]:
        return {tp: self.log_start.get(tp, 0) for tp in tps}  # type: ignore[attr-defined]

    def latest(self, tps: object) -> dict[TopicPartition, int]:
        return {tp: self.log_end[tp] for tp in tps}  # type: ignore[attr-defined]

    def close(self) -> None:
        pass


def positions(offset: dict[str, object]) -> dict[TopicPartition, int]:
    return StreamOffset.from_json_dict(offset).offsets


def reader(offsets: ScriptedOffsets, **extra: str) -> StromStreamReader:
    stream = StromStreamReader(options(**extra))  # type: ignore[arg-type]
    stream.offsets = offsets  # type: ignore[assignment]
    return stream


def test_latest_offset_applies_max_offsets_per_trigger() -> None:
    offsets = ScriptedOffsets()
    offsets.log_end = {A0: 300, A1: 100}
    stream = reader(offsets, maxOffsetsPerTrigger="100")
    assert stream.getDefaultReadLimit() == ReadMaxRows(100)
    start = to_json_dict({A0: 0, A1: 0})
    assert positions(stream.latestOffset(start, ReadMaxRows(100))) == {A0: 75, A1: 25}
    # The engine's ReadAllAvailable (Trigger.Once) overrides the option.
    assert positions(stream.latestOffset(start, ReadAllAvailable())) == {A0: 300, A1: 100}


def test_min_offsets_per_trigger_waits_up_to_max_trigger_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    # A machine booted a minute ago: monotonic() is far below maxTriggerDelay.
    monkeypatch.setattr("strom.spark.reader.time.monotonic", lambda: 60.0)
    offsets = ScriptedOffsets()
    offsets.log_end = {A0: 10}
    stream = reader(offsets, minOffsetsPerTrigger="50", maxTriggerDelay="1h")
    assert stream.getDefaultReadLimit() == ReadMinRows(50)
    start = to_json_dict({A0: 0})
    # The first trigger never waits; after it, fewer than 50 new records mean no batch.
    assert positions(stream.latestOffset(start, ReadMinRows(50))) == {A0: 10}
    offsets.log_end = {A0: 30}
    assert positions(stream.latestOffset(to_json_dict({A0: 10}), ReadMinRows(50))) == {A0: 10}
    offsets.log_end = {A0: 60}
    assert positions(stream.latestOffset(to_json_dict({A0: 10}), ReadMinRows(50))) == {A0: 60}
    monkeypatch.undo()
    impatient = reader(offsets, minOffsetsPerTrigger="50", maxTriggerDelay="0ms")
    impatient.latestOffset(to_json_dict({A0: 0}), ReadMinRows(50))
    assert positions(impatient.latestOffset(to_json_dict({A0: 59}), ReadMinRows(50))) == {A0: 60}


def test_new_partitions_start_at_earliest_and_available_now_caps() -> None:
    offsets = ScriptedOffsets()
    offsets.log_end = {A0: 10}
    stream = reader(offsets)
    stream.prepareForTriggerAvailableNow()
    offsets.log_end = {A0: 20, A1: 5}  # more records, and a partition added after the target
    end = positions(stream.latestOffset(to_json_dict({A0: 0}), ReadAllAvailable()))
    assert end == {A0: 10}
    free = reader(offsets)
    offsets.log_start = {A1: 2}
    end = positions(free.latestOffset(to_json_dict({A0: 0}), ReadAllAvailable()))
    assert end == {A0: 20, A1: 5}
    parts = free.partitions(to_json_dict({A0: 0}), to_json_dict(end))
    ranges = {p.offset_range.tp: (p.offset_range.from_offset, p.offset_range.until_offset) for p in parts}
    assert ranges == {A0: (0, 20), A1: (2, 5)}


def test_partitions_report_data_loss() -> None:
    offsets = ScriptedOffsets()
    offsets.log_end = {A0: 100, A1: 50}
    offsets.log_start = {A0: 40}
    strict = reader(offsets)
    with pytest.raises(DataLossError, match=r"Data loss in a-0: offsets 10 to 39 are no longer available"):
        strict.partitions(to_json_dict({A0: 10, A1: 0}), to_json_dict({A0: 100, A1: 50}))
    lenient = reader(offsets, failOnDataLoss="false")
    parts = lenient.partitions(to_json_dict({A0: 10, A1: 0}), to_json_dict({A0: 100, A1: 50}))
    ranges = {p.offset_range.tp: (p.offset_range.from_offset, p.offset_range.until_offset) for p in parts}
    assert ranges == {A0: (40, 100), A1: (0, 50)}
    # A partition that disappeared (its topic deleted) is data loss too.
    with pytest.raises(DataLossError, match=r"Data loss in b-0: .*the partition is gone"):
        strict.partitions(to_json_dict({A0: 100, B0: 3}), to_json_dict({A0: 100}))


def test_offsets_carry_the_cluster_and_topic_ids_and_another_cluster_is_refused() -> None:
    offsets = ScriptedOffsets()
    offsets.log_end = {A0: 100, B0: 5}
    stream = reader(offsets)
    end = stream.latestOffset(to_json_dict({A0: 0}), ReadAllAvailable())
    assert end == {"a": {"0": 100}, "b": {"0": 5}, "@cluster": "cluster-1", "@topicIds": {"a": "id-a", "b": "id-b"}}
    assert stream.latestOffset(end, ReadAllAvailable()) == end  # stable: Spark compares offsets as text
    # Checkpointed offsets without ids (written before they carried them) are taken as they are.
    assert positions(stream.latestOffset(to_json_dict({A0: 0}), ReadAllAvailable())) == {A0: 100, B0: 5}

    # The same checkpoint against another cluster (a broker with a fresh log dir on the same port),
    # whose log ends before the checkpointed positions: refused, not reported as data loss.
    offsets.cluster = "cluster-2"
    offsets.log_end = {A0: 3, B0: 0}
    strict = reader(offsets)
    for call in (
        lambda: strict.latestOffset(end, ReadAllAvailable()),
        lambda: strict.partitions(end, end),
    ):
        with pytest.raises(CheckpointMismatchError) as refused:
            call()
        message = str(refused.value)
        assert "taken on Kafka cluster cluster-1, but 127.0.0.1:1 is cluster cluster-2" in message
        assert "new checkpointLocation" in message and "failOnDataLoss" not in message
        assert "\n" not in message

    # A topic deleted and created again since: refused too, naming the topic.
    offsets.cluster = "cluster-1"
    offsets.topic_ids = {"a": "id-a2", "b": "id-b"}
    with pytest.raises(CheckpointMismatchError, match=r"topic 'a' was deleted and created again .*id-a then, id-a2 now"):
        reader(offsets).latestOffset(end, ReadAllAvailable())
