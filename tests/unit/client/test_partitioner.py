"""The producer's partitioners: Java's murmur2 key hash and KIP-794's uniform sticky partitioner."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from kafka.partitioner.default import DefaultPartitioner
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from strom.client.producer.partitioner import (
    RoundRobinPartitioner,
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)

# Java's Utils.murmur2 on these inputs (the vectors of Kafka's UtilsTest).
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize(("data", "expected"), list(JAVA_VECTORS.items()))
def test_murmur2_matches_java_vectors_and_kafka_python(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected
    # kafka-python returns the same 32 bits unsigned.
    assert _signed(kafka_python_murmur2(data)) == expected


def test_murmur2_handles_every_tail_length_and_empty_input() -> None:
    rng = random.Random(7)
    for length in range(0, 140):
        data = rng.randbytes(length)
        assert murmur2(data) == _signed(kafka_python_murmur2(data)), length


def test_to_positive_clears_only_the_sign_bit() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0
    assert to_positive(12345) == 12345


class _OneTopicCluster:
    """The slice of kafka-python's ClusterMetadata that its DefaultPartitioner reads."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = set(range(partitions))

    def topics(self) -> set[str]:
        return {self.topic}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions


@pytest.mark.parametrize("partitions", [1, 3, 7, 100])
def test_key_partition_equals_kafka_python_default_partitioner(partitions: int) -> None:
    rng = random.Random(partitions)
    keys = [f"key-{i}".encode() for i in range(500)] + [rng.randbytes(rng.randrange(1, 40)) for _ in range(500)]
    cluster = _OneTopicCluster("t", partitions)
    theirs = [DefaultPartitioner().partition("t", key, key, None, None, cluster) for key in keys]
    ours = [partition_for_key(key, partitions) for key in keys]
    assert ours == theirs
    if partitions > 1:
        assert len(set(ours)) == partitions  # the keys spread; the comparison is not vacuous


def _switches(
    partitioner: StickyPartitioner,
    records: int,
    record_size: int,
    available: list[int],
    total: int,
    full_every: int | None = None,
) -> list[int]:
    """Bytes produced to the sticky partition before each switch; the partition must not change between."""
    sizes: list[int] = []
    produced = 0
    sticky = None
    for i in range(records):
        partition = partitioner.partition(available, total)
        assert sticky is None or partition == sticky, "switched without enough bytes"
        sticky = partition
        produced += record_size
        batch_full = full_every is None or (i + 1) % full_every == 0
        partitioner.on_append(record_size, batch_full, available, total)
        if partitioner.produced_bytes == 0:
            sizes.append(produced)
            produced = 0
            sticky = None
    return sizes


def test_sticky_partitioner_switches_only_after_batch_size_bytes() -> None:
    partitioner = StickyPartitioner(1000, random.Random(1))
    assert set(_switches(partitioner, 20_000, 100, [0, 1, 2, 3], 4)) == {1000}
    partitioner = StickyPartitioner(1000, random.Random(1))
    # 300-byte records: the switch follows the append that reached batch.size.
    assert set(_switches(partitioner, 20_000, 300, [0, 1, 2, 3], 4)) == {1200}


def test_sticky_partitioner_waits_for_a_full_batch_but_not_beyond_twice_batch_size() -> None:
    partitioner = StickyPartitioner(1000, random.Random(2))
    # The batch fills every 15 records (1500 bytes): the switch waits for that.
    assert set(_switches(partitioner, 15_000, 100, [0, 1, 2], 3, full_every=15)) == {1500}
    # A batch that never fills: the switch happens at twice batch.size.
    partitioner = StickyPartitioner(1000, random.Random(3))
    assert set(_switches(partitioner, 5_000, 100, [0, 1, 2], 3, full_every=10**9)) == {2000}


def test_sticky_partitioner_spreads_uniformly_over_partitions_with_a_leader() -> None:
    partitioner = StickyPartitioner(1000, random.Random(4))
    available = [0, 1, 3, 4, 5]  # partition 2 has no leader
    counts: Counter[int] = Counter()
    for _ in range(200_000):
        partition = partitioner.partition(available, 6)
        counts[partition] += 1
        partitioner.on_append(100, True, available, 6)
    assert set(counts) == set(available)
    expected = 200_000 / len(available)
    assert all(abs(count - expected) < 0.1 * expected for count in counts.values()), counts


def test_adaptive_partitioning_favours_short_queues() -> None:
    rng = random.Random(5)
    partitioner = StickyPartitioner(100, rng)
    # Queues of 0, 3 and 1 batches: weights 4, 1 and 3 (max + 1 - size).
    partitioner.update_load_stats([0, 3, 1], [0, 1, 2], 3)
    counts: Counter[int] = Counter()
    for _ in range(40_000):
        counts[partitioner.partition([0, 1, 2], 3)] += 1
        partitioner.on_append(100, True, [0, 1, 2], 3)
    total = sum(counts.values())
    for partition, weight in ((0, 4), (1, 1), (2, 3)):
        assert abs(counts[partition] / total - weight / 8) < 0.02, counts
    # Equal queues over all partitions: back to uniform.
    partitioner.update_load_stats([2, 2, 2], [0, 1, 2], 3)
    counts.clear()
    for _ in range(30_000):
        counts[partitioner.partition([0, 1, 2], 3)] += 1
        partitioner.on_append(100, True, [0, 1, 2], 3)
    assert all(abs(count / 30_000 - 1 / 3) < 0.03 for count in counts.values()), counts


def test_adaptive_partitioning_skips_partitions_left_out_of_the_stats() -> None:
    partitioner = StickyPartitioner(100, random.Random(6))
    # Partition 1 is excluded (no leader, or its broker is unavailable).
    partitioner.update_load_stats([0, 0], [0, 2], 3)
    picks = set()
    for _ in range(2_000):
        picks.add(partitioner.partition([0, 1, 2], 3))
        partitioner.on_append(100, True, [0, 1, 2], 3)
    assert picks == {0, 2}


def test_round_robin_cycles_through_available_partitions() -> None:
    partitioner = RoundRobinPartitioner()
    assert [partitioner.partition([0, 2, 3], 4) for _ in range(6)] == [0, 2, 3, 0, 2, 3]
