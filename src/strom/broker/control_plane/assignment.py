"""Replica assignment of new partitions, as Kafka's AdminUtils assigns them.

Without racks: the first replica of partition p goes to broker ``(p + start) % n`` and the
followers follow at a shift that grows by one every ``n`` partitions, so leaders and followers
spread evenly and no two partitions share the same follower order. With racks (every broker
has one): brokers are interleaved rack by rack, and each partition's replicas go to distinct
racks while racks remain, then to distinct brokers. ``start`` and ``shift`` are random in
Kafka; they are parameters here so tests can pin them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping


class InvalidReplicationFactorError(ValueError):
    error_code = 38  # INVALID_REPLICATION_FACTOR


def _replica_index(first: int, shift: int, replica: int, n: int) -> int:
    return (first + 1 + (shift + replica) % (n - 1)) % n


def _rack_alternated(brokers: Mapping[int, str | None]) -> list[int]:
    """Brokers ordered so consecutive ones sit on different racks: rack1's first, rack2's first, ...,
    rack1's second, ... (racks and their brokers in sorted order)."""
    by_rack: dict[str, list[int]] = {}
    for broker, rack in sorted(brokers.items()):
        by_rack.setdefault(rack or "", []).append(broker)
    racks = sorted(by_rack)
    result: list[int] = []
    for i in range(max(len(b) for b in by_rack.values())):
        result.extend(by_rack[rack][i] for rack in racks if i < len(by_rack[rack]))
    return result


def assign_replicas(
    brokers: Mapping[int, str | None],
    num_partitions: int,
    replication_factor: int,
    *,
    first_partition: int = 0,
    start: int | None = None,
    shift: int | None = None,
) -> dict[int, list[int]]:
    """Replicas of partitions ``first_partition .. first_partition + num_partitions - 1``.

    ``brokers`` maps each live broker id to its rack (None: no rack). Racks are used only when
    every broker has one, as Kafka requires (it refuses a mix; Strom then ignores racks).
    """
    if replication_factor <= 0:
        raise InvalidReplicationFactorError("Replication factor must be larger than 0.")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}."
        )
    rack_aware = all(rack for rack in brokers.values()) and len(set(brokers.values())) > 1
    ids = _rack_alternated(brokers) if rack_aware else sorted(brokers)
    n = len(ids)
    rng = random.Random()
    start = rng.randrange(n) if start is None else start
    shift = rng.randrange(n) if shift is None else shift
    num_racks = len(set(brokers.values()))
    assignment: dict[int, list[int]] = {}
    for i in range(num_partitions):
        p = first_partition + i
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [ids[first]]
        if not rack_aware:
            replicas += [ids[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)]
        else:
            # Kafka's walk: the shift steps over whole rounds of racks, and a candidate is skipped
            # while its rack already holds a replica and some rack holds none (a broker holding one
            # is always skipped). The walk visits every other broker, so it always ends.
            racks_used = {brokers[ids[first]]}
            k = 0
            while len(replicas) < replication_factor:
                candidate = ids[_replica_index(first, shift * num_racks, k, n)]
                k += 1
                rack = brokers[candidate]
                if candidate in replicas or (rack in racks_used and len(racks_used) < num_racks):
                    continue
                replicas.append(candidate)
                racks_used.add(rack)
        assignment[p] = replicas
    return assignment
