"""``__consumer_offsets`` is compacted like any compacted topic, and groups load from the cleaned log.

A short segment.ms on the offsets topic and a fast cleaner make commit rounds roll segments, so
the cleaner rewrites the group's partition while commits continue; after a `kill -9` and a
restart, the coordinator replays only the cleaned log and must still know every group's
latest offsets and metadata.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from brokerproc import BrokerProcess
from kafka_wire import GroupWire
from strom.broker.coordinator.group_metadata_manager import partition_for
from strom.records.codec import Record, decode_batches

BROKER_CONFIG = {
    "offsets.topic.num.partitions": "3",
    "log.cleaner.backoff.ms": "100",
    "num.partitions": "4",
}
GROUPS = [f"compacted-group-{i}" for i in range(6)]
TOPIC = "compacted-offsets-source"
ROUNDS = 60
TIMEOUT = 30.0


@pytest.fixture()
def wire(broker: BrokerProcess) -> Iterator[GroupWire]:
    host, port = broker.bootstrap.split(":")
    with GroupWire(host, int(port)) as conn:
        yield conn


def read_all(wire: GroupWire, partition: int) -> list[Record]:
    """Every record of one __consumer_offsets partition, read from offset 0."""
    records: list[Record] = []
    offset = 0
    while True:
        data = wire.fetch("__consumer_offsets", offset, partition=partition).records
        if not data:
            return records
        batches = decode_batches(data)
        records.extend(r for b in batches for r in b.records)
        offset = batches[-1].header.last_offset + 1


def commit_round(wire: GroupWire, round_: int) -> None:
    for group in GROUPS:
        offsets = {(TOPIC, p): (round_ * 10 + p, f"{group}/round-{round_}") for p in range(4)}
        errors = wire.offset_commit(group, offsets)
        assert set(errors.values()) == {0}, errors


def committed(wire: GroupWire, group: str) -> dict[int, tuple[int, str | None]]:
    response = wire.offset_fetch({group: {TOPIC: range(4)}})
    ((answer,),) = ([g for g in response.groups if g.group_id == group],)
    return {p.partition_index: (p.committed_offset, p.metadata) for t in answer.topics for p in t.partitions}


def test_the_offsets_topic_is_cleaned_and_groups_load_from_the_cleaned_log(
    broker: BrokerProcess, wire: GroupWire
) -> None:
    wire.create_topic(TOPIC, partitions=4)
    commit_round(wire, 0)  # the first commit creates __consumer_offsets
    # Internal topics take config changes like any other; short segments give the cleaner work.
    assert wire.incremental_alter_configs("__consumer_offsets", {"segment.ms": "20"}) == 0
    partitions = {partition_for(group, 3) for group in GROUPS}
    for round_ in range(1, ROUNDS):
        commit_round(wire, round_)
        time.sleep(0.025)  # past segment.ms: the next round starts a new segment
    written = ROUNDS * len(GROUPS) * 4  # records: one per group and partition per round
    deadline = time.monotonic() + TIMEOUT
    while (stored := sum(len(read_all(wire, p)) for p in partitions)) > written // 4:
        assert time.monotonic() < deadline, (
            f"the cleaner never compacted __consumer_offsets ({stored} records)"
        )
        time.sleep(0.1)
    print(f"__consumer_offsets: {written} records written, {stored} left after cleaning")
    deadline = time.monotonic() + TIMEOUT
    for p in partitions:
        # Merged segments take their producer snapshots with them: the swap's leftovers are
        # deleted after it, so the count is polled rather than read once.
        folder = broker.data_dir / f"__consumer_offsets-{p}"
        while len(snapshots := list(folder.glob("*.snapshot"))) > len(list(folder.glob("*.log"))) + 1:
            assert time.monotonic() < deadline, (sorted(s.name for s in snapshots), sorted(folder.iterdir()))
            time.sleep(0.1)

    last = ROUNDS - 1
    expected = {group: {p: (last * 10 + p, f"{group}/round-{last}") for p in range(4)} for group in GROUPS}
    assert {group: committed(wire, group) for group in GROUPS} == expected

    wire.close()
    assert broker.kill9() == -9
    broker.start()
    host, port = broker.bootstrap.split(":")
    with GroupWire(host, int(port)) as after:
        assert {group: committed(after, group) for group in GROUPS} == expected
