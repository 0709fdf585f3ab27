"""Partitioners: the Java client's key hash and its uniform sticky partitioner (KIP-794).

A record with a key goes to ``toPositive(murmur2(key)) % numPartitions``, the mapping
every Java client (and kafka-python) uses, so Strom's producer and a Java producer put
a key in the same partition. librdkafka's default (``consistent_random``, a CRC32 of the
key) maps keys differently; its ``murmur2_random`` matches this one.

A record without a key sticks to one partition until ``batch.size`` bytes went to it,
then the partitioner picks another, uniformly at random among partitions with a leader
or, with adaptive partitioning, weighted towards partitions with shorter queues.
"""

from __future__ import annotations

import bisect
import random
import struct
from collections.abc import Sequence

# Java's Utils.murmur2 constants.
_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


_UNPACK_WORDS = [struct.Struct(f"<{n}I").unpack_from for n in range(33)]


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as Kafka's Java client computes it: a signed 32-bit int."""
    length = len(data)
    h = _SEED ^ length
    whole = length >> 2
    if whole:
        unpack = _UNPACK_WORDS[whole] if whole <= 32 else struct.Struct(f"<{whole}I").unpack_from
        for k in unpack(data):
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ (((k ^ (k >> 24)) * _M) & _MASK)
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h = ((h ^ data[base]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Java's Utils.toPositive: clear the sign bit (not abs, which overflows for MIN_VALUE)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """KIP-794's built-in partitioner for one topic's keyless records.

    The accumulator calls ``partition`` before appending and ``on_append`` (under its
    lock) after; ``update_load_stats`` runs on each ready check of the sender.
    """

    __slots__ = ("_cumulative", "_ids", "_random", "current", "produced_bytes", "sticky_batch_size")

    def __init__(self, sticky_batch_size: int, rng: random.Random | None = None) -> None:
        self.sticky_batch_size = max(1, sticky_batch_size)
        self.current = -1
        self.produced_bytes = 0
        self._random = rng or random.Random()
        # Adaptive mode: a cumulative frequency table over partition ids, None for uniform.
        self._cumulative: list[int] | None = None
        self._ids: list[int] = []

    def partition(self, available: Sequence[int], num_partitions: int) -> int:
        current = self.current
        if current < 0:
            current = self.current = self._next(available, num_partitions)
        return current

    def on_append(
        self, appended_bytes: int, enable_switch: bool, available: Sequence[int], num_partitions: int
    ) -> None:
        """Count bytes produced to the sticky partition and switch once there are enough.

        A switch waits for the partition's batch to be full (``enable_switch``) so that
        batches are not cut short, but never beyond twice ``batch.size``.
        """
        self.produced_bytes += appended_bytes
        if self.produced_bytes >= self.sticky_batch_size:
            self.maybe_switch(enable_switch, available, num_partitions)

    def maybe_switch(self, enable_switch: bool, available: Sequence[int], num_partitions: int) -> None:
        """Once ``batch.size`` bytes were produced (see ``on_append``)."""
        if enable_switch or self.produced_bytes >= 2 * self.sticky_batch_size:
            self.current = self._next(available, num_partitions)
            self.produced_bytes = 0

    def _next(self, available: Sequence[int], num_partitions: int) -> int:
        draw = self._random.getrandbits(31)
        cumulative = self._cumulative
        if cumulative is None:
            if available:
                return available[draw % len(available)]
            return draw % num_partitions
        # The first entry strictly greater than the draw picks the partition.
        return self._ids[bisect.bisect_right(cumulative, draw % cumulative[-1])]

    def update_load_stats(self, queue_sizes: list[int] | None, partition_ids: list[int], total: int) -> None:
        """Weigh partitions by the inverse of their queue lengths (in batches).

        ``queue_sizes``/``partition_ids`` cover the partitions eligible for new records;
        ``total`` is the topic's partition count. None, fewer than two partitions, or
        equal queues everywhere fall back to uniform choice.
        """
        if queue_sizes is None or not queue_sizes or total < 2:
            self._cumulative = None
            return
        largest = max(queue_sizes)
        if len(queue_sizes) == total and min(queue_sizes) == largest:
            self._cumulative = None
            return
        running = 0
        cumulative = []
        for size in queue_sizes:
            running += largest + 1 - size
            cumulative.append(running)
        self._ids = list(partition_ids)
        self._cumulative = cumulative


class RoundRobinPartitioner:
    """Java's RoundRobinPartitioner: every record to the next available partition, keys ignored."""

    __slots__ = ("_counter",)

    def __init__(self) -> None:
        self._counter = 0

    def partition(self, available: Sequence[int], num_partitions: int) -> int:
        counter = self._counter
        self._counter = counter + 1
        if available:
            return available[counter % len(available)]
        return counter % num_partitions
